"""The OpenAPI 3.1 description of the HTTP API, served at /v1/openapi.json.

Built here as data, next to the routes it describes; a test checks that
every route and every error code in the code appears in it, and that it is
a valid OpenAPI document.
"""

from __future__ import annotations

import copy
from typing import Any

from node.api.auth import ADMIN_PREFIXES, OPEN_ROUTES
from node.api.counting import COUNT_LIMIT, COUNTS_CACHE_SECONDS
from node.api.schedules import MAX_PAGE_PAYLOAD_BYTES
from node.schedule.destination import MAX_HTTP_HEADERS, METHODS
from node.schedule.egress import MAX_URL_LENGTH
from node.schedule.model import (
    HEADER_NAME,
    ID_PATTERN,
    LABEL_NAME,
    MAX_HEADERS,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    TENANT_NAME,
    TOPIC_PATTERN,
    Status,
)
from node.schedule.parse import MAX_DEPTH, MAX_EXPIRE_AFTER
from node.schedule.trace import MAX_REQUEST_ID, REQUEST_ID_HEADER, TRACEPARENT_HEADER

ERROR_CODES = (
    "invalid_request",  # 400: the message says what, "field" which
    "payload_too_large",  # 413: over a byte limit, or more JSON values than a body may hold
    "request_timeout",  # 408: the body did not arrive in time
    "not_found",  # 404: no such schedule, or no such route
    "method_not_allowed",  # 405
    "conflict",  # 409: same id with another body; drain when not running
    "not_cancellable",  # 409: cancel after delivery, while in flight, or after failing
    "in_flight",  # 409: a change while an owner is publishing it; Retry-After
    "invalid_state",  # 409: a verb the schedule's status does not allow (final, or paused)
    "version_mismatch",  # 412: If-Match names a version the schedule is no longer at
    "unauthorized",  # 401: no API key, or an unknown or revoked one (auth on)
    "forbidden",  # 403: another tenant's scope, or an operator route without admin
    "topic_not_allowed",  # 403: the topic is outside the tenant's allowed prefixes
    "unknown_topic",  # 422: the broker has no such topic and does not create topics
    "rate_limited",  # 429: over the tenant's rate; Retry-After says when to retry
    "quota_exceeded",  # 429: the tenant has its maximum of PENDING schedules
    "store_unavailable",  # 503: MongoDB did not answer; retry
    "store_busy",  # 503: MongoDB answers too slowly to take more now; Retry-After
    "busy",  # 503: the node takes in as many large bodies as it allows at once; Retry-After
    "read_timeout",  # 503: a listing, its counts or a bulk cancel ran past READ_TIMEOUT
    "internal",  # 500: a fault of the node's own (a bug); its log has the traceback
    "http_error",  # any other refusal by the HTTP server itself
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_ID = {
    "name": "schedule_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": ID_PATTERN.pattern},
    "description": "the id as created; anything else (a '/' however encoded, '%', NUL, "
    "non-ASCII, over 128 characters) is a 400 with field id, before any lookup",
}
_TENANT_NAME = {"type": "string", "pattern": TENANT_NAME.pattern}
# ISO 8601 durations of a fixed length (node/schedule/times.py): weeks alone,
# or days and a time part.
_DURATION = {
    "type": "string",
    "pattern": "^P(?:[0-9]{1,9}W|(?:[0-9]{1,9}D)?"
    "(?:T(?:[0-9]{1,9}H)?(?:[0-9]{1,9}M)?(?:[0-9]{1,9}(?:[.][0-9]{1,3})?S)?)?)$",
}
_NO_NUL = "^[^\\x00]*$"
_PRIORITY = {
    "type": "integer",
    "minimum": 0,
    "maximum": 9,
    "default": 5,
    "description": "9 first: when a node has more due work than a round takes, the "
    "higher priority goes first (within each tenant's turn), equal ones oldest first",
}
_TOPIC = {"type": "string", "pattern": TOPIC_PATTERN.pattern, "not": {"enum": [".", ".."]}}
_STORE_DOWN = {"503": _error("The store did not answer; nothing was changed. Retry.")}
# The routes that scan a tenant's schedules are charged to its read budget.
_READ_BUDGET = {
    "429": _error("Over the tenant's read budget, or a scan of its already under way "
                  "(rate_limited, with Retry-After)"),
}  # fmt: skip
_TENANT = {
    "name": "tenant",
    "in": "query",
    "schema": {**_TENANT_NAME, "default": "default"},
    "description": "auth off only: the tenant whose schedule this is; with auth on, "
    "the key's tenant (another value is a 403)",
}
_ADMISSION = {
    "403": _error("Another tenant named (forbidden), or a topic outside the tenant's "
                  "prefixes (topic_not_allowed)"),
    "422": _error("The broker has no such topic and does not create topics (unknown_topic)"),
    "429": _error("Over the tenant's rate (rate_limited, with Retry-After) or its "
                  "pending maximum (quota_exceeded)"),
}  # fmt: skip
_TIME = {"type": "string", "format": "date-time"}
# A record key to match: 1-1024 bytes as UTF-8 (so at most 1024 characters), no NUL.
_KEY_FILTER = {"type": "string", "minLength": 1, "maxLength": 1024, "pattern": _NO_NUL}
_HEADERS = {
    "type": "object",
    "maxProperties": MAX_HEADERS,
    "propertyNames": {"pattern": HEADER_NAME.pattern},
    "additionalProperties": {"type": "string", "pattern": _NO_NUL},
    "description": "Kafka record headers: names of 1-256 printable ASCII "
    "characters, no '.', not starting with '$', none of the scheduler's own "
    "(schedule-id, execute-at, fence-token, tenant, attempt); values without "
    "NUL; at most 8 KiB in all",
}
# A label's name as the schema's propertyNames, and as the part before '='
# of a list's label filter.
_LABEL_NAME_CHARS = LABEL_NAME.pattern.removeprefix("^").removesuffix("$")
_LABELS = {
    "type": "object",
    "maxProperties": MAX_LABELS,
    "propertyNames": {"pattern": LABEL_NAME.pattern},
    "additionalProperties": {
        "type": "string",
        "pattern": _NO_NUL,
        "maxLength": MAX_LABEL_VALUE_BYTES,
    },
    "description": f"at most {MAX_LABELS} labels: names of 1-63 characters of "
    f"[A-Za-z0-9._/-], string values of at most {MAX_LABEL_VALUE_BYTES} bytes as UTF-8, "
    "no NUL. List and bulk-cancel find schedules by them.",
}
_EXPIRE_AFTER = {
    **_DURATION,
    "description": "one-shot only: not published by executeAt + expireAfter (its "
    f"deadline), the schedule is EXPIRED instead, and never published; at most "
    f"P{MAX_EXPIRE_AFTER.days}D",
}
_ETAG = {
    "ETag": {
        "description": 'the schedule\'s version, quoted ("3"): pass it as If-Match',
        "schema": {"type": "string", "pattern": '^"[0-9]+"$'},
    }
}
_IF_MATCH = {
    "name": "If-Match",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": '^[ \\t]*(?:[*]|"[0-9]{1,18}")[ \\t]*$'},
    "description": 'the version the change is meant for, as an ETag gave it ("3"), or * '
    "for any; another version than the stored one is a 412 (version_mismatch), a "
    "malformed value a 400 with field If-Match. Absent: no condition.",
}


def _versioned(description: str) -> dict[str, Any]:
    """A 200 with the schedule's view and its version as ETag."""
    return {**_json(_ref("Schedule"), description), "headers": _ETAG}


def _in_flight_or(description: str) -> dict[str, Any]:
    """A 409: in flight (with Retry-After), or the status does not allow it."""
    return {
        **_error(
            "An owner is publishing it now (in_flight, with Retry-After: try again), "
            f"{description} (invalid_state), or it kept changing under the request "
            "(conflict: try again)"
        ),
        "headers": {
            "Retry-After": {
                "description": "in_flight only: seconds to wait before trying again",
                "schema": {"type": "integer", "minimum": 1},
            }
        },
    }


_ONE_SCHEDULE = {
    "400": _error("Bad id, query parameter or If-Match (invalid_request)"),
    "403": _error("Another tenant named in ?tenant= (forbidden)"),
    "404": _error("No such schedule in the caller's tenant (not_found)"),
    "412": _error("If-Match names another version than the stored one (version_mismatch)"),
    **_STORE_DOWN,
}


def _bulk_route(summary: str, statuses: str) -> dict[str, Any]:
    """A bulk verb by selector (``POST /v1/schedules:<verb>``)."""
    counts = {
        "matched": {"type": "integer", "minimum": 0, "description": "matched in its statuses"},
        "changed": {
            "type": "integer",
            "minimum": 0,
            "description": "of those, changed (the rest moved meanwhile, a claim or a verb)",
        },
        "more": {
            "type": "boolean",
            "description": "call again: more match, or a match is still in flight",
        },
        "dryRun": {"type": "boolean", "description": "present on a dry run"},
        "cancelled": {"type": "integer", "description": "a cancel's: changed, as before"},
    }
    return {
        "post": {
            "summary": summary,
            "description": f"The caller's {statuses} schedules the selector matches, in batches, "
            "at most 10,000 per call, each changed only where it is still as read (one claimed "
            "meanwhile is delivered, not changed). While the answer says more, call again; a "
            "pause or cancel is not done while a match is in flight. Safe to repeat: a changed "
            "schedule no longer matches.",
            "requestBody": _body(_ref("Selector")),
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["matched", "changed", "more"],
                        "properties": counts,
                    },
                    "What this call matched and changed",
                ),
                "400": _error("Invalid body, or a selector without a range (invalid_request)"),
                "403": _error("Another tenant named (forbidden)"),
                "413": _error("Body over the limit (payload_too_large)"),
                **_READ_BUDGET,
                **_STORE_DOWN,
            },
        },
    }


def _verb(
    summary: str, description: str, ok: str, refused: str, *, in_flight: bool = True
) -> dict[str, Any]:
    """POST /v1/schedules/{id}:verb, which takes no body and answers the view."""
    conflict = (
        _in_flight_or(refused)
        if in_flight
        else _error(
            f"{refused[0].upper()}{refused[1:]} (invalid_state), or it kept changing under "
            "the request (conflict: try again)"
        )
    )
    return {
        "parameters": [_ID, _TENANT],
        "post": {
            "summary": summary,
            "description": description,
            "parameters": [_IF_MATCH],
            "responses": {
                "200": _versioned(ok),
                **_ONE_SCHEDULE,
                "409": conflict,
                "413": _error("The route takes no body (payload_too_large)"),
            },
        },
    }


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "enum": list(ERROR_CODES)},
                    "message": {"type": "string"},
                    "field": {
                        "type": "string",
                        "description": "the offending field, if one (the top-level member "
                        "of the body, or the query or path parameter)",
                    },
                },
            }
        },
    },
    "Recurrence": {
        "type": "object",
        "additionalProperties": False,
        "description": "exactly one of every and cron; each occurrence is delivered "
        "once, under the same guarantees as a one-shot schedule",
        "oneOf": [
            {"required": ["every"], "not": {"required": ["timeZone"]}},
            {"required": ["cron"]},
        ],
        "properties": {
            "every": {**_DURATION, "description": "ISO 8601 duration, PT1S to P3660D"},
            "cron": {"type": "string", "description": "5 fields: minute hour day month weekday"},
            "timeZone": {"type": "string", "default": "UTC", "description": "IANA, cron only"},
            "start": {"type": "string", "format": "date-time"},
            "end": {"type": "string", "format": "date-time"},
            "misfire": {
                "type": "string",
                "enum": ["fire_once", "fire_all", "skip"],
                "default": "fire_once",
                "description": "occurrences missed by more than MISFIRE_THRESHOLD",
            },
            "maxCatchUp": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
        },
    },
    "RetryPolicy": {
        "type": "object",
        "additionalProperties": False,
        "description": "absent fields take the node's MAX_ATTEMPTS and RETRY_BACKOFF(_MAX)",
        "properties": {
            "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 100},
            "initialBackoff": {**_DURATION, "description": "ISO 8601 duration"},
            "maxBackoff": {**_DURATION, "description": "ISO 8601 duration, at most P1D"},
        },
    },
    "FlowControl": {
        "type": "object",
        "additionalProperties": False,
        "required": ["key"],
        "anyOf": [{"required": ["rate"]}, {"required": ["parallelism"]}],
        "description": "Across the whole cluster, at most rate deliveries of the key start "
        "per period and at most parallelism are in flight at once (the key is the "
        "tenant's). Held back is not an attempt: the schedule stays due and goes in a "
        "later window, earliest first within the key; other keys never wait for it. In "
        "any window of one period at most rate plus a tenth of it (rate + 1 below ten a "
        "period) start.",
        "properties": {
            "key": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "pattern": "^[^\\x00-\\x1f\\x7f]+$",
            },
            "rate": {"type": "integer", "minimum": 1, "maximum": 100000},
            "period": {
                **_DURATION,
                "default": "PT1S",
                "description": "ISO 8601 duration from PT0.1S to P1D; only with rate",
            },
            "parallelism": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
    },
    "Occurrence": {
        "type": "object",
        "properties": {
            "executeAt": {"type": "string", "format": "date-time"},
            "outcome": {"type": "string", "enum": ["delivered", "failed", "skipped"]},
            "at": {"type": "string", "format": "date-time"},
            "attempts": {"type": "integer"},
            "error": {"type": ["string", "null"]},
        },
    },
    "Attempt": {
        "type": "object",
        "properties": {
            "at": {"type": "string", "format": "date-time"},
            "executeAt": {"type": "string", "format": "date-time", "description": "occurrence"},
            "attempt": {"type": "integer"},
            "outcome": {
                "type": "string",
                "enum": ["delivered", "retrying", "failed", "skipped", "expired", "deferred"],
                "description": "deferred: the destination asked to wait (Retry-After, an "
                "open circuit); no attempt spent",
            },
            "node": {"type": "string"},
            "token": {"type": "integer", "description": "the lease's fencing token"},
            "error": {"type": ["string", "null"]},
            "requestId": {
                "type": ["string", "null"],
                "description": "the request id of the call that made or last changed the "
                "schedule, as this attempt carried it",
            },
        },
    },
    "HttpTarget": {
        "type": "object",
        "description": "Deliver by an HTTP request instead of a Kafka record: the payload "
        "as the body, the scheduler's headers (schedule-id, execute-at, fence-token, "
        "attempt, tenant, content-type, x-request-id, traceparent) and Standard Webhooks "
        "signing (webhook-id, webhook-timestamp, webhook-signature; fence-signature over "
        "the fence header set). 2xx is delivered; 429 or 503 with Retry-After waits "
        "without spending an attempt; 408, 425, 429, 5xx, connection errors and timeouts "
        "retry; other 4xx fail at once. Redirects are not followed. The URL may not reach "
        "loopback, private, link-local or other non-public addresses unless HTTP_TARGETS_ALLOW "
        "names the range (checked here on what the URL shows, and on the resolved "
        "address at every attempt).",
        "required": ["url"],
        "additionalProperties": False,
        "properties": {
            "url": {
                "type": "string",
                "maxLength": MAX_URL_LENGTH,
                "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^@\\s]+$",
                "description": "http or https; no user name or password, no fragment",
            },
            "method": {"type": "string", "enum": list(METHODS), "default": "POST"},
            "headers": {
                "type": "object",
                "maxProperties": MAX_HTTP_HEADERS,
                "additionalProperties": {"type": "string", "pattern": "^[\\x20-\\x7e\\t]*$"},
                "description": "sent with the request; names are HTTP tokens, and none "
                "the scheduler sets (schedule-id, webhook-*, content-type...) or the "
                "connection owns (host, content-length...)",
            },
            "timeout": {**_DURATION, "default": "PT10S", "description": "at most PT60S"},
        },
    },
    "NewSchedule": {
        "type": "object",
        "description": "Every string must be valid Unicode (a lone surrogate escape such as "
        f"\\ud800 is a 400 naming the field) and the body nests at most {MAX_DEPTH} levels "
        "of arrays and objects.",
        "allOf": [
            {"oneOf": [{"required": ["topic"]}, {"required": ["http"]}]},
            {"oneOf": [{"required": ["executeAt"]}, {"required": ["recurrence"]}]},
            {"oneOf": [{"required": ["payload"]}, {"required": ["payloadBase64"]}]},
            {"not": {"required": ["recurrence", "expireAfter"]}},
        ],
        "additionalProperties": False,
        "properties": {
            "id": {
                "type": "string",
                "pattern": ID_PATTERN.pattern,
                "description": "idempotency key; the server assigns one when absent",
            },
            "topic": {**_TOPIC, "description": "Kafka topic (or http)"},
            "http": _ref("HttpTarget"),
            "executeAt": {"type": "string", "format": "date-time"},
            "recurrence": _ref("Recurrence"),
            "retry": _ref("RetryPolicy"),
            "payload": {"description": "any JSON; sent as UTF-8 JSON"},
            "payloadBase64": {"type": "string", "description": "raw bytes instead of payload"},
            "key": {
                "type": "string",
                "pattern": _NO_NUL,
                "description": "Kafka record key (default: the id); at most 1024 bytes "
                "as UTF-8, no NUL",
            },
            "headers": {
                **_HEADERS,
                "description": "Kafka record headers (an http target's go in http.headers)",
            },
            "labels": _LABELS,
            "expireAfter": _EXPIRE_AFTER,
            "flowControl": _ref("FlowControl"),
            "priority": _PRIORITY,
            "tenant": {**_TENANT_NAME, "default": "default"},
        },
    },
    "SchedulePatch": {
        "type": "object",
        "description": "PATCH: only the fields named change; null clears key, labels, "
        "retry, expireAfter and flowControl (no other field takes null). executeAt on a recurring "
        "schedule makes it a one-shot at that time, recurrence on a one-shot makes it "
        "recurring; a new executeAt starts it afresh (attempts 0). expireAfter on a "
        "recurring schedule (or with recurrence) is a 400. topic or http switches the "
        "destination (the other is dropped). The id and tenant cannot change.",
        "minProperties": 1,
        "additionalProperties": False,
        "not": {
            "anyOf": [
                {"required": ["executeAt", "recurrence"]},
                {"required": ["payload", "payloadBase64"]},
                {"required": ["topic", "http"]},
            ]
        },
        "properties": {
            "topic": _TOPIC,
            "http": _ref("HttpTarget"),
            "executeAt": _TIME,
            "recurrence": _ref("Recurrence"),
            "payload": {
                "not": {"type": "null"},
                "description": "any JSON but null (which PATCH would read as clearing "
                "it); sent as UTF-8 JSON",
            },
            "payloadBase64": {"type": "string", "description": "raw bytes instead of payload"},
            "headers": _HEADERS,
            "key": {"type": ["string", "null"], "pattern": _NO_NUL},
            "labels": {**_LABELS, "type": ["object", "null"]},
            "retry": {"oneOf": [_ref("RetryPolicy"), {"type": "null"}]},
            "expireAfter": {**_EXPIRE_AFTER, "type": ["string", "null"]},
            "flowControl": {"oneOf": [_ref("FlowControl"), {"type": "null"}]},
            "priority": _PRIORITY,
        },
    },
    "Selector": {
        "type": "object",
        "description": "Which of the tenant's schedules a bulk verb changes: those in the "
        "verb's statuses matching every field given, at least one of labels, key, idPrefix, "
        "topic and host (each is an index's range: never the whole tenant)",
        "additionalProperties": False,
        "anyOf": [{"required": [name]} for name in ("labels", "key", "idPrefix", "topic", "host")],
        "properties": {
            "labels": {**_LABELS, "minProperties": 1, "description": "every one of these"},
            "key": {**_KEY_FILTER, "description": "this record key"},
            "idPrefix": {
                "type": "string",
                "pattern": ID_PATTERN.pattern,
                "description": "ids starting with this",
            },
            "topic": {**_TOPIC, "description": "to this Kafka topic"},
            "host": {
                "type": "string",
                "minLength": 1,
                "maxLength": 253,
                "description": "to an http target on this host",
            },
            "destination": {"type": "string", "enum": ["kafka", "http"]},
            "status": {
                "description": "only these of the verb's own statuses (a cancel: PENDING or "
                "PAUSED; the others take one status each)",
                "oneOf": [
                    {"type": "string", "enum": [s.value for s in Status]},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "string", "enum": [s.value for s in Status]},
                    },
                ],
            },
            "dueBefore": {**_TIME, "description": "due (executeAt) before this time"},
            "tenant": {**_TENANT_NAME, "default": "default"},
            "dryRun": {
                "type": "boolean",
                "default": False,
                "description": "count the matches (to 10,000) and change nothing",
            },
        },
    },
    "Schedule": {
        "type": "object",
        "required": [
            "id",
            "tenant",
            "executeAt",
            "bucket",
            "status",
            "attempts",
            "version",
            "labels",
        ],
        "properties": {
            "id": {"type": "string"},
            "tenant": {"type": "string"},
            "topic": {"type": "string", "description": "the Kafka destination, or http"},
            "http": _ref("HttpTarget"),
            "executeAt": {"type": "string", "format": "date-time"},
            "bucket": {"type": "integer"},
            "status": {
                "type": "string",
                "enum": [s.value for s in Status],
                "description": "PAUSED: never due until resumed. Final: DELIVERED, "
                "DELIVERY_FAILED, CANCELLED and EXPIRED (a one-shot not published by its "
                "deadline; never published).",
            },
            "version": {
                "type": "integer",
                "minimum": 0,
                "description": "1 when created, one more on every write to it (the API's "
                "or delivery's; 0: stored before versions existed): the ETag, and what "
                "If-Match names",
            },
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "expireAfter": {**_DURATION, "description": "one-shot: as given"},
            "deadline": {
                **_TIME,
                "description": "one-shot with expireAfter: executeAt + expireAfter",
            },
            "pausedAt": {**_TIME, "description": "when last paused"},
            "cancelledAt": _TIME,
            "expiredAt": _TIME,
            "triggeredAt": {**_TIME, "description": "when last triggered"},
            "attempts": {"type": "integer"},
            "nextAttemptAt": {"type": "string", "format": "date-time"},
            "deliveredAt": {"type": ["string", "null"], "format": "date-time"},
            "lastError": {"type": ["string", "null"]},
            "key": {"type": ["string", "null"]},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "createdAt": {"type": ["string", "null"], "format": "date-time"},
            "requestId": {
                "type": "string",
                "description": "the request id of the call that made or last changed it "
                "(X-Request-ID): every delivery carries it",
            },
            "traceparent": {
                "type": "string",
                "description": "the W3C traceparent that call gave: every delivery carries it",
            },
            "payload": {"description": "absent from a listing's basic view"},
            "payloadBase64": {"type": "string", "description": "likewise"},
            "payloadBytes": {"type": "integer", "description": "the payload's size"},
            "retry": _ref("RetryPolicy"),
            "flowControl": _ref("FlowControl"),
            "priority": _PRIORITY,
            "recurrence": _ref("Recurrence"),
            "nextExecuteAt": {
                "type": ["string", "null"],
                "format": "date-time",
                "description": "recurring: the occurrence due next; null once the chain ended",
            },
            "occurrences": {"type": "integer", "description": "recurring: completed so far"},
            "skippedOccurrences": {"type": "integer"},
            "lastOccurrences": {
                "type": "array",
                "items": _ref("Occurrence"),
                "description": "recurring: the last 10, newest first",
            },
        },
    },
    "BatchResult": {
        "type": "object",
        "required": ["index", "status"],
        "properties": {
            "index": {"type": "integer"},
            "status": {"type": "integer", "enum": [200, 201, 400, 403, 409, 413, 429, 503]},
            "schedule": _ref("Schedule"),
            "error": {"$ref": "#/components/schemas/Error/properties/error"},
        },
    },
    "Cluster": {
        "type": "object",
        "required": ["self", "members", "buckets"],
        "properties": {
            "self": {"type": "string"},
            "members": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "address": {"type": "string"},
                        "state": {"type": "string", "enum": ["alive", "suspect", "dead", "left"]},
                        "incarnation": {"type": "integer"},
                        "http": {"type": ["string", "null"]},
                        "placementVersion": {"type": "integer"},
                    },
                },
            },
            "buckets": {
                "type": "object",
                "properties": {
                    "count": {"type": "integer"},
                    "held": {"type": "integer"},
                    "wanted": {"type": "integer"},
                    "settled": {"type": "boolean"},
                    "placementVersion": {"type": "integer"},
                    "owners": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "bucket": {"type": "integer"},
                                "owner": {"type": ["string", "null"]},
                                "token": {"type": "integer"},
                                "placed": {"type": ["string", "null"]},
                            },
                        },
                    },
                },
            },
        },
    },
}

PATHS: dict[str, Any] = {
    "/v1/schedules": {
        "post": {
            "summary": "Schedule a message for delivery to a Kafka topic or an HTTP endpoint "
            "at executeAt",
            "requestBody": _body(_ref("NewSchedule")),
            "responses": {
                "201": _versioned("Stored, journaled on a majority"),
                "200": _versioned("The same id and body again: the stored one"),
                "400": _error("Invalid body (invalid_request)"),
                "409": _error("The same id with another body (conflict)"),
                "413": _error("Body over the limit (payload_too_large)"),
                **_ADMISSION,
                **_STORE_DOWN,
            },
        },
        "get": {
            "summary": "List schedules, a page at a time, matching every filter given",
            "description": "In id order; filtered by status or the due window alone "
            "(no label, topic or key), in due order. Every parameter but label may be "
            "given once.",
            "parameters": [
                {"name": "tenant", "in": "query", "schema": _TENANT_NAME},
                {
                    "name": "status",
                    "in": "query",
                    "schema": {"type": "string", "enum": [s.value for s in Status]},
                },
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                },
                {
                    "name": "after",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "the next of the page before; anything else is a 400",
                },
                {
                    "name": "label",
                    "in": "query",
                    "style": "form",
                    "explode": True,
                    "schema": {
                        "type": "array",
                        "maxItems": MAX_LABELS,
                        "items": {
                            "type": "string",
                            "pattern": f"^{_LABEL_NAME_CHARS}=[^\\x00]*$",
                            # a name of 63 characters at most, a value of 128 bytes
                            "maxLength": 63 + 1 + MAX_LABEL_VALUE_BYTES,
                        },
                    },
                    "description": "name=value, repeatable: schedules with every one",
                },
                {"name": "topic", "in": "query", "schema": _TOPIC},
                {
                    "name": "destination",
                    "in": "query",
                    "schema": {"type": "string", "enum": ["kafka", "http"]},
                    "description": "only schedules to Kafka, or to http targets (applied "
                    "within the range the other filters read)",
                },
                {
                    "name": "host",
                    "in": "query",
                    "schema": {"type": "string", "minLength": 1, "maxLength": 253},
                    "description": "only http targets on this host (lower case)",
                },
                {
                    "name": "key",
                    "in": "query",
                    "schema": _KEY_FILTER,
                    "description": "the record key (1-1024 bytes)",
                },
                {
                    "name": "dueAfter",
                    "in": "query",
                    "schema": _TIME,
                    "description": "due (executeAt) at or after this time",
                },
                {
                    "name": "dueBefore",
                    "in": "query",
                    "schema": _TIME,
                    "description": "due (executeAt) before this time",
                },
                {
                    "name": "view",
                    "in": "query",
                    "schema": {"type": "string", "enum": ["basic", "full"], "default": "basic"},
                    "description": "basic: no payloads (payloadBytes says their size); full: "
                    "with payloads, the page ending where they reach "
                    f"{MAX_PAGE_PAYLOAD_BYTES // (1024 * 1024)} MiB (next goes on)",
                },
                {
                    "name": "counts",
                    "in": "query",
                    "schema": {"type": "boolean", "default": False},
                    "description": "true: the answer has counts, per status, of every "
                    "schedule the other filters match",
                },
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["schedules", "next"],
                        "properties": {
                            "schedules": {"type": "array", "items": _ref("Schedule")},
                            "next": {"type": ["string", "null"], "description": "pass as after"},
                            "counts": {
                                "type": "object",
                                "description": "counts=true: schedules per status, over "
                                f"the same filters but status, each counted up to {COUNT_LIMIT:,} "
                                f"(kept for {COUNTS_CACHE_SECONDS:g} s on each node)",
                                "properties": {s.value: {"type": "integer"} for s in Status},
                                "additionalProperties": False,
                            },
                            "countsCapped": {
                                "type": "array",
                                "items": {"type": "string", "enum": [s.value for s in Status]},
                                "description": "the statuses counted only up to the limit: "
                                "at least that many",
                            },
                        },
                    },
                    "A page",
                ),
                "400": _error("Bad query parameter (invalid_request)"),
                "403": _error("Another tenant's list (forbidden)"),
                **_READ_BUDGET,
                **_STORE_DOWN,
            },
        },
    },
    "/v1/schedules:batch": {
        "post": {
            "summary": "Up to 1,000 schedules, each answered as its single POST would be",
            "requestBody": _body(
                {
                    "type": "object",
                    "required": ["schedules"],
                    "properties": {
                        "schedules": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 1000,
                            "items": _ref("NewSchedule"),
                        }
                    },
                }
            ),
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "created": {"type": "integer"},
                            "existing": {"type": "integer"},
                            "rejected": {"type": "integer"},
                            "results": {"type": "array", "items": _ref("BatchResult")},
                        },
                    },
                    "One result per item, in order",
                ),
                "400": _error("Bad envelope; nothing stored (invalid_request)"),
                "413": _error("Body over 16 MiB (payload_too_large)"),
                **_STORE_DOWN,
            },
        },
    },
    **{
        f"/v1/schedules:{verb}": _bulk_route(summary, statuses)
        for verb, summary, statuses in (
            ("cancel", "Cancel the schedules a selector matches", "PENDING or PAUSED"),
            ("pause", "Pause the schedules a selector matches", "PENDING"),
            ("resume", "Resume the schedules a selector matches", "PAUSED"),
            ("retry", "Redrive the schedules a selector matches", "DELIVERY_FAILED"),
        )
    },
    "/v1/schedules/{schedule_id}": {
        "parameters": [_ID, _TENANT],
        "get": {
            "summary": "One schedule",
            "responses": {
                "200": _versioned("The schedule"),
                "400": _error("Bad id or query parameter (invalid_request)"),
                "403": _error("Another tenant named in ?tenant= (forbidden)"),
                "404": _error("No such schedule in the caller's tenant (not_found)"),
                **_STORE_DOWN,
            },
        },
        "delete": {
            "summary": "Cancel (PENDING or PAUSED); after a 200 it is never delivered",
            "parameters": [_IF_MATCH],
            "responses": {
                "200": _versioned("CANCELLED (also when it already was)"),
                **_ONE_SCHEDULE,
                "409": _error("Already delivered, in flight, failed or expired (not_cancellable)"),
                **_STORE_DOWN,
            },
        },
        "patch": {
            "summary": "Change a PENDING or PAUSED schedule: the fields named, no others",
            "parameters": [_IF_MATCH],
            "requestBody": _body(_ref("SchedulePatch")),
            "responses": {
                "200": _versioned("The schedule as changed"),
                **_ONE_SCHEDULE,
                "400": _error("Bad id, query parameter, If-Match or body (invalid_request)"),
                "409": _in_flight_or("it has ended (delivered, failed, cancelled, expired)"),
                "413": _error("Body over the limit (payload_too_large)"),
            },
        },
    },
    "/v1/schedules/{schedule_id}:pause": _verb(
        "Pause: PENDING -> PAUSED, never due until resumed",
        "Already PAUSED: 200, unchanged.",
        "PAUSED",
        "it has ended",
    ),
    "/v1/schedules/{schedule_id}:resume": _verb(
        "Resume: PAUSED -> PENDING",
        "A recurring schedule's missed occurrence runs under its misfire policy; a "
        "one-shot past its time is due at once, or, past its deadline, EXPIRED by this "
        "call (a 200 showing EXPIRED). Already PENDING: 200, unchanged.",
        "PENDING (or EXPIRED: past its deadline)",
        "it has ended",
    ),
    "/v1/schedules/{schedule_id}:trigger": _verb(
        "Trigger: a PENDING schedule is due now",
        "A one-shot's executeAt becomes now; a recurring schedule gets one extra "
        "occurrence now, its chain unchanged.",
        "PENDING, due now",
        "it is PAUSED (resume it first) or has ended",
    ),
    "/v1/schedules/{schedule_id}:retry": _verb(
        "Redrive: DELIVERY_FAILED -> PENDING, due now, attempts 0",
        "Any other status is a 409 (invalid_state).",
        "PENDING, due now",
        "it is not DELIVERY_FAILED",
        in_flight=False,
    ),
    "/v1/schedules/{schedule_id}/history": {
        "parameters": [_ID, _TENANT],
        "get": {
            "summary": "Every delivery attempt still kept (HISTORY_RETENTION), newest first",
            "parameters": [
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                }
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "retentionSeconds": {"type": "number"},
                            "perSchedule": {"type": "integer"},
                            "history": {"type": "array", "items": _ref("Attempt")},
                        },
                    },
                    "The attempts",
                ),
                "400": _error("Bad id or query parameter (invalid_request)"),
                "403": _error("Another tenant named in ?tenant= (forbidden)"),
                "404": _error("No such schedule in the caller's tenant (not_found)"),
                **_STORE_DOWN,
            },
        },
    },
    "/v1/cluster": {
        "get": {
            "summary": "This node's view: members, bucket leases and placement",
            "responses": {"200": _json(_ref("Cluster"), "The view"), **_STORE_DOWN},
        }
    },
    "/v1/cluster/backlog": {
        "get": {
            "summary": "PENDING schedules already due, per bucket (cached 1 s)",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "at": {"type": "string", "format": "date-time"},
                            "total": {"type": "integer"},
                            "dueNow": {
                                "type": "object",
                                "additionalProperties": {"type": "integer"},
                            },
                        },
                    },
                    "Counts",
                ),
                **_STORE_DOWN,
            },
        }
    },
    "/v1/cluster/counts": {
        "get": {
            "summary": "Schedules in this node's buckets, by status (cached 10 s)",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "at": {"type": "string", "format": "date-time"},
                            "buckets": {"type": "integer"},
                            "counts": {
                                "type": "object",
                                "properties": {s.value: {"type": "integer"} for s in Status},
                                "additionalProperties": False,
                            },
                        },
                    },
                    "Counts by status",
                ),
                **_STORE_DOWN,
            },
        }
    },
    "/v1/internal/wake": {
        "post": {
            "summary": "Between nodes: a schedule in one of your buckets falls due soon",
            "description": "No tenant's API key. With CLUSTER_KEYS set, the body must be "
            "signed: X-Scheduler-Signature: sha256=<hex HMAC-SHA256 of the body under a "
            "cluster key>, and its sentAt within 60 s of the receiver's clock (else 401). "
            "Without cluster keys (the dev stack) the route is open. Bodies over 4 KiB: 413.",
            "parameters": [
                {
                    "name": "X-Scheduler-Signature",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "sha256=<hex>; needed when the node has cluster keys",
                }
            ],
            "requestBody": _body(
                {
                    "type": "object",
                    "required": ["bucket", "dueAt"],
                    "properties": {
                        "bucket": {"type": "integer"},
                        "dueAt": {"type": "string", "format": "date-time"},
                        "from": {"type": "string", "description": "the sending node's id"},
                        "sentAt": {
                            "type": "string",
                            "format": "date-time",
                            "description": "when it was sent; required when signed",
                        },
                    },
                }
            ),
            "responses": {
                "202": _json(
                    {"type": "object", "properties": {"woken": {"type": "boolean"}}}, "Noted"
                ),
                "400": _error("Bad body (invalid_request)"),
                "401": _error(
                    "Cluster keys set, and the hint is unsigned, badly signed or stale "
                    "(unauthorized)"
                ),
                "413": _error("Body over 4 KiB (payload_too_large)"),
            },
        }
    },
    "/v1/admin/drain": {
        "post": {
            "summary": "Hand every lease over and leave the cluster; keep serving the API",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {"node": {"type": "string"}, "state": {"type": "string"}},
                    },
                    "Drained",
                ),
                "409": _error("Not running: starting, draining or stopping (conflict)"),
                "413": _error("The route takes no body (payload_too_large)"),
            },
        }
    },
    "/v1/chaos/partition": {
        "put": {
            "summary": "Chaos testing only (CHAOS_MODE=on or unfenced): drop gossip to peers",
            "requestBody": _body(
                {
                    "type": "object",
                    "required": ["blocked"],
                    "properties": {
                        "blocked": {
                            "type": "array",
                            "items": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,300}$"},
                        }
                    },
                }
            ),
            "responses": {
                "200": _json({"type": "object"}, "The peers blocked now"),
                "400": _error("Bad body (invalid_request)"),
                "413": _error("Body over 64 KiB (payload_too_large)"),
            },
        }
    },
    "/v1/openapi.json": {
        "get": {
            "summary": "This document",
            "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
        }
    },
    "/": {
        "get": {
            "summary": "The operator console (HTML): schedules, their verbs, the cluster view",
            "description": "Served with a strict Content-Security-Policy (no inline script "
            "or style); its script and stylesheet are the two routes below. With auth on, "
            "the page asks for an API key and sends it as a Bearer token.",
            "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {}}}}},
        }
    },
    "/console.js": {
        "get": {
            "summary": "The console's script",
            "responses": {
                "200": {
                    "description": "JavaScript",
                    "content": {"text/javascript": {"schema": {}}},
                }
            },
        }
    },
    "/console.css": {
        "get": {
            "summary": "The console's stylesheet",
            "responses": {"200": {"description": "CSS", "content": {"text/css": {"schema": {}}}}},
        }
    },
    "/healthz": {
        "get": {
            "summary": "Liveness",
            "responses": {
                "200": _json({"type": "object"}, "The process answers"),
                "503": _json(
                    {"type": "object"}, "The store has been out of reach for UNHEALTHY_AFTER"
                ),
            },
        }
    },
    "/readyz": {
        "get": {
            "summary": "Readiness: started, gossiping, store and broker reachable",
            "description": "checks: one boolean per part, ready when all are true; producer: "
            "KAFKA_IDEMPOTENCE, whether the producer is idempotent, and why not",
            "responses": {
                "200": _json({"type": "object"}, "Ready"),
                "503": _json({"type": "object"}, "Not ready; checks say which part"),
            },
        }
    },
    "/metrics": {
        "get": {
            "summary": "Prometheus text",
            "responses": {
                "200": {"description": "Metrics", "content": {"text/plain": {"schema": {}}}}
            },
        }
    },
}


_REQUEST_ID = {
    "name": REQUEST_ID_HEADER,
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": f"^[\\x21-\\x7e]{{1,{MAX_REQUEST_ID}}}$"},
    "description": "the caller's id for this call (visible ASCII, no spaces): echoed in the "
    "answer, on every log line of the call, and stored by a create or PATCH so each "
    "delivery carries it (Kafka header request-id, HTTP header x-request-id). Absent: "
    "the traceparent's trace id, else one made here. Malformed: a 400 with field "
    "X-Request-ID.",
}
_TRACEPARENT = {
    "name": TRACEPARENT_HEADER,
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "W3C Trace Context: stored by a create or PATCH and passed on with each "
    "delivery (Kafka and HTTP header traceparent). A malformed one is ignored.",
}
_ECHOED = {
    REQUEST_ID_HEADER: {
        "description": "the call's request id (the caller's, else made here)",
        "schema": {"type": "string"},
    }
}


def _traced(paths: dict[str, Any]) -> dict[str, Any]:
    """Every operation takes a request id and a traceparent, may refuse a
    malformed request id, and echoes the id in every answer."""
    for item in paths.values():
        for method, operation in item.items():
            if method == "parameters":
                continue
            operation["parameters"] = [*operation.get("parameters", []), _REQUEST_ID, _TRACEPARENT]
            responses = operation["responses"]
            responses.setdefault(
                "400", _error("A malformed X-Request-ID (invalid_request, field X-Request-ID)")
            )
            for answer in responses.values():
                if "$ref" not in answer:
                    answer["headers"] = {**answer.get("headers", {}), **_ECHOED}
    return paths


def _secure(paths: dict[str, Any]) -> dict[str, Any]:
    """Mark each operation with who may call it (node/auth.py decides)."""
    for path, item in paths.items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            if path in OPEN_ROUTES:
                operation["security"] = []  # no key needed, auth on or off
                continue
            operation["responses"]["401"] = _error(
                "Auth on: no API key, or an unknown or revoked one (unauthorized)"
            )
            if path.startswith(ADMIN_PREFIXES):
                operation["responses"]["403"] = _error("Not an admin tenant's key (forbidden)")
    return paths


def document(version: str = "0.1.0") -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "bucket-scheduler",
            "version": version,
            "description": "Deliver a message to a Kafka topic or an HTTP endpoint at a "
            "given time. Any node "
            'accepts any call. Errors: {"error": {"code", "message", "field"}}; '
            "the 404, 405 and 413 of the HTTP server itself use the same shape, and so "
            "does a 500 (code internal: a fault of the node's, never of the request). "
            "Only a request that is not parseable HTTP (a request line or header over "
            "8190 bytes, an invalid header byte, broken chunked framing) gets the HTTP "
            "server's plain-text 400. JSON bodies must be UTF-8, hold no lone surrogate "
            f"and nest at most {MAX_DEPTH} levels (400).",
        },
        "paths": _traced(_secure(copy.deepcopy(PATHS))),
        # Auth on (`python -m node run`'s default): a tenant's API key.
        "security": [{"apiKey": []}],
        "components": {
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a tenant's API key (`python -m node tenants add NAME`)",
                }
            },
            "schemas": SCHEMAS,
            "responses": {
                "NotFound": _error("No such route (not_found)"),
                "MethodNotAllowed": _error("Wrong method for the route (method_not_allowed)"),
                "Internal": _error("A fault of the node's own (internal); its log has it"),
            },
        },
    }
