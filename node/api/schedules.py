"""The schedule routes: ``/v1/schedules`` (create, list), ``:batch``,
``:cancel`` (by selector), ``/{id}`` (get, change, cancel), its verbs
``:pause``, ``:resume``, ``:trigger``, ``:retry``, and ``/{id}/history``
(DESIGN.md "HTTP API").

Every route acts in the caller's tenant: another tenant's schedule is simply
not found.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog
from aiohttp import web

from node.api.auth import CALLER, Caller
from node.api.context import CONTEXT, ApiContext, json_response
from node.api.counting import ListingCounts
from node.api.inputs import no_body, page_size, read_body, read_json, unknown_parameters
from node.api.observe import trace_of
from node.api.views import delivered_record, public_record, public_view
from node.errors import (
    ScheduleNotFound,
    SchedulerError,
    StoreUnavailable,
    ValidationFailed,
)
from node.schedule import changes
from node.schedule.changes import BULK_VERBS, BulkVerb, Change, version_of
from node.schedule.model import (
    MAX_KEY_BYTES,
    MAX_LABELS,
    NewSchedule,
    Status,
    is_storage_id,
    label_pairs,
    public_id,
    storage_id,
    tenant_of,
)
from node.schedule.parse import (
    check_label,
    parse_json,
    parse_labels,
    parse_new_schedule,
    parse_patch,
    parse_schedule_object,
    validate_id,
    validate_tenant,
    validate_topic,
)
from node.schedule.times import aware, format_time, parse_time
from node.schedule.trace import RequestTrace
from node.store.contract import BULK_LIMIT
from node.store.listing import Cursor, Listing, Selector

log = structlog.get_logger(__name__)

MAX_PAGE = 1000
DEFAULT_PAGE = 100
# A listing's full view (with payloads) ends its page where the payloads
# reach this many bytes, whatever the limit: its answer stays a few
# megabytes (200 schedules of 256 KiB were a 70 MB answer before).
MAX_PAGE_PAYLOAD_BYTES = 4 * 1024 * 1024
# Room for the JSON around the payload and for base64's 4/3 expansion.
BODY_OVERHEAD = 64 * 1024
MAX_BATCH = 1000
# A batch's items are validated this many at a time between event-loop turns.
YIELD_EVERY = 50
BATCH_BODY_LIMIT = 16 * 1024 * 1024
# A selector is a few short fields.
SELECTOR_BODY_LIMIT = 16 * 1024
# History records of a schedule are those made since its creation, give or
# take the nodes' readings of the store's clock.
HISTORY_SLACK = timedelta(minutes=1)


def body_limit(max_payload_bytes: int) -> int:
    """The largest body of one schedule: its payload as base64, and the rest."""
    return max_payload_bytes * 4 // 3 + BODY_OVERHEAD


routes = web.RouteTableDef()
LISTING_COUNTS: web.AppKey[ListingCounts] = web.AppKey("listing_counts")


def _caller(request: web.Request) -> Caller:
    return request[CALLER]


def _accepted(context: ApiContext, doc: dict[str, Any]) -> None:
    context.metrics.schedules_created.inc()
    context.admission.accepted(doc["tenant"])
    context.wakes.accepted(doc)
    log.info(
        "schedule accepted",
        schedule_id=doc["_id"],
        bucket=doc["bucket"],
        token=doc.get("token", 0),
        topic=doc.get("topic"),
        host=(doc.get("http") or {}).get("host"),
    )


@routes.post("/v1/schedules")
async def create_schedule(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    body = await read_body(request, body_limit(context.config.max_payload_bytes))
    now = context.now()
    new = parse_new_schedule(body, context.limits, now, _caller(request).scope)
    new = dataclasses.replace(new, trace=trace_of(request))
    [refused] = await context.admission.check([new])
    if refused is not None:
        raise refused
    [new] = await context.admission.with_defaults([new])
    doc, created = await context.store.insert(new, now)
    if created:
        _accepted(context, doc)
    return _schedule_response(doc, status=201 if created else 200)


@routes.post("/v1/schedules:batch")
async def create_batch(request: web.Request) -> web.Response:
    """Up to MAX_BATCH schedules in one call, each validated and answered on
    its own (not all or nothing): an item's status is what a single POST of
    it would have answered. The inserts share round trips (group commit)."""
    context = request.app[CONTEXT]
    items = _batch_items(await read_json(request, BATCH_BODY_LIMIT))
    now = context.now()
    scope = _caller(request).scope
    results: list[dict[str, Any]] = [{} for _ in items]
    parsed = await _parse_items(items, context, now, scope, results, trace_of(request))
    admitted = await _admit(context, parsed, results)
    await _insert_items(context, admitted, now, results, request.path)
    counts = Counter(r["status"] for r in results)
    return json_response(
        {
            "created": counts[201],
            "existing": counts[200],
            "rejected": len(items) - counts[201] - counts[200],
            "results": results,
        }
    )


def _batch_items(data: Any) -> list[Any]:
    """The items of a batch body: ``{"schedules": [...]}`` of 1 to MAX_BATCH."""
    items = data.get("schedules") if isinstance(data, dict) else None
    if not isinstance(items, list) or set(data) != {"schedules"}:
        raise ValidationFailed('body must be {"schedules": [schedule, ...]}', "schedules")
    if not 1 <= len(items) <= MAX_BATCH:
        raise ValidationFailed(
            f"schedules must hold 1 to {MAX_BATCH} items, got {len(items)}", "schedules"
        )
    return items


async def _parse_items(
    items: list[Any],
    context: ApiContext,
    now: datetime,
    scope: Callable[[str | None], str],
    results: list[dict[str, Any]],
    trace: RequestTrace,
) -> list[tuple[int, NewSchedule]]:
    """The items that are valid schedules, by index (each carrying the
    call's request id); the others' refusals go in ``results``."""
    parsed: list[tuple[int, NewSchedule]] = []
    for index, item in enumerate(items):
        if index and not index % YIELD_EVERY:
            # Validating 1,000 large schedules is CPU work: let the event loop
            # run in between (renewals, probes and other calls wait on it).
            await asyncio.sleep(0)
        try:
            new = parse_schedule_object(item, context.limits, now, scope)
            parsed.append((index, dataclasses.replace(new, trace=trace)))
        except SchedulerError as exc:
            results[index] = _refused(index, exc)
    return parsed


async def _admit(
    context: ApiContext, parsed: list[tuple[int, NewSchedule]], results: list[dict[str, Any]]
) -> list[tuple[int, NewSchedule]]:
    """The schedules admission lets in; the others' refusals go in ``results``."""
    refusals = await context.admission.check([new for _, new in parsed])
    admitted: list[tuple[int, NewSchedule]] = []
    for (index, new), refused in zip(parsed, refusals, strict=True):
        if refused is None:
            admitted.append((index, new))
        else:
            results[index] = _refused(index, refused)
    ready = await context.admission.with_defaults([new for _, new in admitted])
    return [(index, new) for (index, _), new in zip(admitted, ready, strict=True)]


async def _insert_items(
    context: ApiContext,
    admitted: list[tuple[int, NewSchedule]],
    now: datetime,
    results: list[dict[str, Any]],
    path: str,
) -> None:
    """Insert the schedules together and put each one's answer in ``results``."""
    outcomes = await asyncio.gather(
        *(context.store.insert(new, now) for _, new in admitted), return_exceptions=True
    )
    for (index, _new), outcome in zip(admitted, outcomes, strict=True):
        if isinstance(outcome, SchedulerError):
            if isinstance(outcome, StoreUnavailable):
                log.warning("store unavailable", error=str(outcome.__cause__), path=path)
            results[index] = _refused(index, outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            doc, created = outcome
            if created:
                _accepted(context, doc)
            results[index] = _item(index, 201 if created else 200, {"schedule": public_view(doc)})


def _item(index: int, status: int, answer: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "status": status, **answer}


def _refused(index: int, error: SchedulerError) -> dict[str, Any]:
    return _item(index, error.status_hint or 500, error.body())


def _schedule_id(request: web.Request, also: frozenset[str] | set[str] = frozenset()) -> str:
    """The stored id of the schedule a route names, in the caller's tenant
    (with auth off, the ``tenant`` query parameter's, default ``default``).
    Another tenant's schedule is then simply not found.

    The path's id is held to the same pattern as a body's, before any
    lookup: stored ids are "tenant/id" (the default tenant's bare), so an id
    that decoded to hold a '/' (``billing%2Forder-1``) would name tenant
    billing's document. No '/' (nor '%', NUL, or anything outside ASCII)
    gets past the pattern, however it was encoded."""
    schedule_id = validate_id(request.match_info["schedule_id"])
    unknown_parameters(request.query, {"tenant", *also})
    requested = request.query.get("tenant")
    tenant = _caller(request).scope(None if requested is None else validate_tenant(requested))
    return storage_id(tenant, schedule_id)


def _not_found(stored_id: str) -> ScheduleNotFound:
    return ScheduleNotFound(f"no schedule {public_id(stored_id)!r}")


def _schedule_response(doc: dict[str, Any], status: int = 200) -> web.Response:
    """A schedule, with its version as a strong ETag (what If-Match takes):
    every answer that is one schedule carries it, a create's too, so a
    change can follow a create with no GET between."""
    response = json_response(public_view(doc), status=status)
    response.headers["ETag"] = f'"{version_of(doc)}"'
    return response


def _if_match(request: web.Request) -> int | None:
    """The version an If-Match header names: ``"3"`` (the ETag of a GET), or
    None for no header or ``*`` (any version of a schedule that exists)."""
    text = request.headers.get("If-Match")
    if text is None or text.strip() == "*":
        return None
    value = text.strip()
    if (
        len(value) < 3
        or value[0] != '"'
        or value[-1] != '"'
        or not value[1:-1].isascii()
        or not value[1:-1].isdigit()
        or len(value) > 20
    ):
        raise ValidationFailed(
            'If-Match must be one version as its ETag shows it ("3"), or *', "If-Match"
        )
    return int(value[1:-1])


@routes.get("/v1/schedules/{schedule_id}")
async def get_schedule(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    stored_id = _schedule_id(request)
    doc = await context.store.get(stored_id)
    if doc is None:
        raise _not_found(stored_id)
    return _schedule_response(doc)


@routes.delete("/v1/schedules/{schedule_id}")
async def cancel_schedule(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    stored_id = _schedule_id(request)
    if_match = _if_match(request)
    doc = await context.store.cancel(stored_id, context.now(), if_match)
    if doc is None:
        raise _not_found(stored_id)
    context.metrics.schedules_cancelled.inc()
    log.info(
        "schedule cancelled",
        schedule_id=doc["_id"],
        bucket=doc["bucket"],
        token=doc.get("token", 0),
    )
    return _schedule_response(doc)


async def _change(
    request: web.Request,
    verb: str,
    decide: Callable[[dict[str, Any], datetime], Change | None],
    now: datetime | None = None,
) -> web.Response:
    """Apply one verb to the schedule the path names: the store reads it,
    ``decide`` judges it at ``now`` (the store's time, as delivery judges
    times), and the change is written only where the schedule is still as
    it was read (``ScheduleStore.change``)."""
    context = request.app[CONTEXT]
    stored_id = _schedule_id(request)
    if_match = _if_match(request)
    now = now or context.now()
    result = await context.store.change(stored_id, lambda doc: decide(doc, now), now, if_match)
    if result is None:
        raise _not_found(stored_id)
    doc, change = result
    if change is not None:
        if change.due_at is not None:
            context.wakes.accepted(doc)
        if change.status == Status.EXPIRED:
            context.metrics.delivery_outcome("expired", [str(doc["tenant"])])
        log.info(
            f"schedule {verb}",
            schedule_id=doc["_id"],
            bucket=doc["bucket"],
            status=doc["status"],
            version=version_of(doc),
        )
    return _schedule_response(doc)


@routes.patch("/v1/schedules/{schedule_id}")
async def change_schedule(request: web.Request) -> web.Response:
    """Change what the body names of a PENDING or PAUSED schedule."""
    context = request.app[CONTEXT]
    data = await read_json(request, body_limit(context.config.max_payload_bytes))
    now = context.now()
    request_patch = parse_patch(data, context.limits, now)
    if request_patch.topic is not None or request_patch.http is not None:
        tenant = tenant_of(_schedule_id(request))
        url = request_patch.http.url if request_patch.http is not None else None
        refusal = await context.admission.new_destination(tenant, request_patch.topic, url)
        if refusal is not None:
            raise refusal
    trace = trace_of(request)
    return await _change(
        request,
        "changed",
        lambda doc, at: changes.traced(changes.patch(doc, request_patch, at), trace),
        now,
    )


@routes.post("/v1/schedules/{schedule_id}:pause")
async def pause_schedule(request: web.Request) -> web.Response:
    await no_body(request)
    return await _change(request, "paused", changes.pause)


@routes.post("/v1/schedules/{schedule_id}:resume")
async def resume_schedule(request: web.Request) -> web.Response:
    await no_body(request)
    return await _change(request, "resumed", changes.resume)


@routes.post("/v1/schedules/{schedule_id}:trigger")
async def trigger_schedule(request: web.Request) -> web.Response:
    await no_body(request)
    return await _change(request, "triggered", changes.trigger)


@routes.post("/v1/schedules/{schedule_id}:retry")
async def retry_schedule(request: web.Request) -> web.Response:
    """Redrive: a DELIVERY_FAILED schedule is due again with fresh attempts."""
    await no_body(request)
    return await _change(request, "redriven", changes.redrive)


_SELECTOR_FIELDS = frozenset(
    {
        "labels",
        "key",
        "idPrefix",
        "topic",
        "host",
        "destination",
        "status",
        "dueBefore",
        "tenant",
        "dryRun",
    }
)
_FINDERS = ("labels", "key", "idPrefix", "topic", "host")


@routes.post("/v1/schedules:cancel")
async def cancel_selected(request: web.Request) -> web.Response:
    """Cancel the PENDING and PAUSED schedules a selector matches."""
    return await _bulk(request, BULK_VERBS["cancel"])


@routes.post("/v1/schedules:pause")
async def pause_selected(request: web.Request) -> web.Response:
    """Pause the PENDING schedules a selector matches."""
    return await _bulk(request, BULK_VERBS["pause"])


@routes.post("/v1/schedules:resume")
async def resume_selected(request: web.Request) -> web.Response:
    """Resume the PAUSED schedules a selector matches."""
    return await _bulk(request, BULK_VERBS["resume"])


@routes.post("/v1/schedules:retry")
async def retry_selected(request: web.Request) -> web.Response:
    """Redrive the DELIVERY_FAILED schedules a selector matches."""
    return await _bulk(request, BULK_VERBS["retry"])


async def _bulk(request: web.Request, verb: BulkVerb) -> web.Response:
    """One call of a bulk verb on the caller's tenant, BULK_LIMIT at most:
    ``more`` says to call again (more match, or one is still in flight). A
    dry run counts the matches and changes nothing."""
    context = request.app[CONTEXT]
    unknown_parameters(request.query, set())
    data = await read_json(request, SELECTOR_BODY_LIMIT)
    if not isinstance(data, dict):
        raise ValidationFailed("body must be a JSON object")
    dry_run = data.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise ValidationFailed("dryRun must be true or false", "dryRun")
    selector = _selector(data, verb)
    tenant = _caller(request).scope(validate_tenant(data["tenant"]) if "tenant" in data else None)
    async with context.reads.reading(tenant):
        if dry_run:
            count = await context.store.count_matching(
                tenant, selector, verb.statuses, BULK_LIMIT + 1
            )
            return json_response(
                {
                    "matched": min(count, BULK_LIMIT),
                    "changed": 0,
                    "more": count > BULK_LIMIT,
                    "dryRun": True,
                }
            )
        bulk = await context.store.change_matching(tenant, selector, verb, context.now())
    for bucket, due_at in bulk.due.items():
        context.wakes.due(bucket, due_at)
    context.metrics.bulk_changed.labels(verb.name).inc(bulk.changed)
    if verb.name == "cancel":
        context.metrics.schedules_cancelled.inc(bulk.changed)
    log.info(
        f"schedules {verb.done} by selector",
        tenant=tenant,
        matched=bulk.matched,
        changed=bulk.changed,
        more=bulk.more,
    )
    body: dict[str, Any] = {"matched": bulk.matched, "changed": bulk.changed, "more": bulk.more}
    if verb.name == "cancel":
        body["cancelled"] = bulk.changed  # what this route answered before the others came
    return json_response(body)


def _selector(data: dict[str, Any], verb: BulkVerb) -> Selector:
    """A bulk verb's selector from its body: at least one finder (a range of
    an index: never the whole tenant), then what narrows it."""
    unknown = sorted(set(data) - _SELECTOR_FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown field {unknown[0]!r}", unknown[0])
    if not set(_FINDERS) & set(data):
        raise ValidationFailed(
            "name at least one of labels, key, idPrefix, topic or host", "labels"
        )
    labels = parse_labels(data["labels"]) if "labels" in data else {}
    if "labels" in data and not labels:
        raise ValidationFailed("labels must name at least one label", "labels")
    return Selector(
        labels=tuple(label_pairs(labels)),
        key=_key_filter(data["key"]) if "key" in data else None,
        id_prefix=validate_id(data["idPrefix"], "idPrefix") if "idPrefix" in data else None,
        topic=validate_topic(data["topic"]) if "topic" in data else None,
        host=_host_filter(_text(data, "host")) if "host" in data else None,
        destination=_destination_filter(_text(data, "destination"))
        if "destination" in data
        else None,
        due_before=parse_time(data["dueBefore"], "dueBefore") if "dueBefore" in data else None,
        statuses=_bulk_statuses(data, verb),
    )


def _text(data: dict[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        raise ValidationFailed(f"{name} must be a string", name)
    return value


def _bulk_statuses(data: dict[str, Any], verb: BulkVerb) -> tuple[str, ...]:
    """``status``: one or a list of the verb's own statuses, to narrow it."""
    if "status" not in data:
        return ()
    given = data["status"]
    statuses = [given] if isinstance(given, str) else given
    if (
        not isinstance(statuses, list)
        or not statuses
        or any(s not in verb.statuses for s in statuses)
    ):
        allowed = " or ".join(verb.statuses)
        raise ValidationFailed(
            f"status must be {allowed} (or a list of them): a {verb.name} changes those only",
            "status",
        )
    return tuple(dict.fromkeys(statuses))


@routes.get("/v1/schedules/{schedule_id}/history")
async def schedule_history(request: web.Request) -> web.Response:
    """Every delivery attempt of a schedule still kept, newest first."""
    context = request.app[CONTEXT]
    stored_id = _schedule_id(request, also={"limit"})
    limit = page_size(request.query, MAX_PAGE, DEFAULT_PAGE)
    doc = await context.store.get(stored_id)
    if doc is None:
        raise _not_found(stored_id)
    # This life of the id only: an id used again past retention starts afresh
    # (a minute's slack for the clocks of the nodes that wrote the records).
    since = aware(doc["createdAt"]) - HISTORY_SLACK if doc.get("createdAt") else None
    records = await context.history.of(stored_id, limit, since)
    history = [public_record(r) for r in records]
    delivered = delivered_record(doc)
    if delivered is not None:  # the newest attempt, kept by the schedule itself
        history = [delivered, *history][:limit]
    return json_response(
        {
            "id": public_id(stored_id),
            "retentionSeconds": context.config.history_retention,
            "perSchedule": context.config.history_per_schedule,
            "history": history,
        }
    )


_LIST_PARAMETERS = frozenset(
    {
        "tenant",
        "status",
        "limit",
        "after",
        "label",
        "topic",
        "destination",
        "host",
        "key",
        "dueAfter",
        "dueBefore",
        "counts",
        "view",
    }
)


@routes.get("/v1/schedules")
async def list_schedules(request: web.Request) -> web.Response:
    """A page of the tenant's schedules, filtered by status, labels, topic,
    key and due window; each filter is served by an index
    (``node/store/listing.py``). By status or due window alone the page is
    in due order, otherwise in id order."""
    context = request.app[CONTEXT]
    query = request.query
    _list_parameters(query)
    status = _status_filter(query.get("status"))
    limit = page_size(query, MAX_PAGE, DEFAULT_PAGE)
    tenant = _listed_tenant(request)
    counts = _one_of(query, "counts", "false", "counts must be true or false") == "true"
    full = _one_of(query, "view", "basic", "view must be basic (no payloads) or full") == "full"
    listing = _listing(query, tenant, limit, status)
    async with context.reads.reading(tenant):
        page = await context.store.list_page(
            listing, payloads=full, max_bytes=MAX_PAGE_PAYLOAD_BYTES
        )
        counted = await request.app[LISTING_COUNTS].get(context, listing) if counts else {}
    body: dict[str, Any] = {
        "schedules": [public_view(d, with_payload=full) for d in page.docs],
        "next": _encode_cursor(page.docs[-1], listing.by_due) if page.more and page.docs else None,
        **counted,
    }
    return json_response(body)


def _list_parameters(query: Any) -> None:
    """Refuse a parameter a listing does not take, or one given twice (but label)."""
    unknown_parameters(query, _LIST_PARAMETERS)
    for name in set(query) - {"label"}:
        if len(query.getall(name)) > 1:
            raise ValidationFailed(f"{name} may be given once", name)


def _status_filter(status: str | None) -> str | None:
    if status is not None and status not in Status.__members__:
        raise ValidationFailed(f"status must be one of {', '.join(Status)}", "status")
    return status


def _listed_tenant(request: web.Request) -> str | None:
    """The tenant whose schedules are listed: the caller's; with auth off,
    the ``tenant`` parameter's, or every tenant's without one."""
    requested = request.query.get("tenant")
    tenant = _caller(request).tenant or (None if requested is None else validate_tenant(requested))
    if requested is not None and tenant != requested:
        _caller(request).scope(requested)  # another tenant's list: 403
    return tenant


# The values of a listing's switches, by parameter.
_CHOICES = {"counts": ("true", "false"), "view": ("basic", "full")}


def _one_of(query: Any, name: str, default: str, refusal: str) -> str:
    value: str = query.get(name, default)
    if value not in _CHOICES[name]:
        raise ValidationFailed(refusal, name)
    return value


def _listing(query: Any, tenant: str | None, limit: int, status: str | None) -> Listing:
    """The listing the filters and the cursor ask for."""
    listing = Listing(
        tenant=tenant,
        limit=limit,
        status=status,
        labels=_label_filter(query.getall("label", [])),
        topic=validate_topic(query["topic"]) if "topic" in query else None,
        host=_host_filter(query["host"]) if "host" in query else None,
        destination=_destination_filter(query.get("destination")),
        key=_key_filter(query["key"]) if "key" in query else None,
        due_after=parse_time(query["dueAfter"], "dueAfter") if "dueAfter" in query else None,
        due_before=parse_time(query["dueBefore"], "dueBefore") if "dueBefore" in query else None,
    )
    if "after" in query:
        listing = dataclasses.replace(listing, after=_decode_cursor(query["after"], listing.by_due))
    return listing


def _label_filter(values: list[str]) -> tuple[str, ...]:
    """``label=name=value`` parameters, as the store keeps labels."""
    if len(values) > MAX_LABELS:
        raise ValidationFailed(f"at most {MAX_LABELS} label filters", "label")
    pairs: dict[str, str] = {}
    for value in values:
        name, separator, label_value = value.partition("=")
        if not separator:
            raise ValidationFailed("label must be name=value", "label")
        check_label(name, label_value, "label")
        pairs[name] = label_value
    return tuple(label_pairs(pairs))


def _host_filter(host: str) -> str:
    """An http target's host, as stored (lower case, xn-- for IDN)."""
    if not host or len(host) > 253 or not host.isascii() or any(c in host for c in "/@ \x00"):
        raise ValidationFailed("host must be a host name or address, as in the URL", "host")
    return host.lower().strip("[]")


def _destination_filter(value: str | None) -> str | None:
    if value is not None and value not in ("kafka", "http"):
        raise ValidationFailed("destination must be kafka or http", "destination")
    return value


def _key_filter(key: object) -> str:
    """A key to find schedules by: what a schedule's key may be, not empty
    (null neither: a selector of nothing would match the whole tenant)."""
    if not isinstance(key, str) or not key or "\x00" in key or len(key.encode()) > MAX_KEY_BYTES:
        raise ValidationFailed(
            f"key must be a string of 1-{MAX_KEY_BYTES} bytes, without NUL", "key"
        )
    return key


def _encode_cursor(last: dict[str, Any], by_due: bool) -> str:
    # Opaque to callers, so the paging key can change without breaking them.
    cursor: dict[str, Any] = {"after": last["_id"]}
    if by_due:
        cursor["due"] = format_time(last["dueAt"])
    return base64.urlsafe_b64encode(json.dumps(cursor).encode()).decode().rstrip("=")


def _decode_cursor(text: str, by_due: bool) -> Cursor:
    """The place a cursor holds. Anything else is a 400: a made-up cursor
    must not reach the store (a NUL, a lone surrogate, deep JSON), nor one
    of another listing's order."""
    refused = ValidationFailed("after is not a cursor returned by this API", "after")
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4))
        cursor = parse_json(raw)
        after = cursor["after"]
        due = parse_time(cursor["due"], "after") if by_due else None
        if set(cursor) != ({"after", "due"} if by_due else {"after"}):
            raise refused
    except (binascii.Error, ValueError, ValidationFailed, KeyError, TypeError):
        raise refused from None
    if not isinstance(after, str) or not is_storage_id(after):
        raise refused
    return Cursor(after=after, due=due)
