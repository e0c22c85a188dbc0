"""The schedule routes: ``/v1/schedules``, ``:batch``, ``/{id}`` and
``/{id}/history`` (DESIGN.md "HTTP API").

Every route acts in the caller's tenant: another tenant's schedule is simply
not found.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections import Counter
from typing import Any

import structlog
from aiohttp import web

from node.api.auth import CALLER, Caller
from node.api.context import CONTEXT, ApiContext, json_response
from node.api.inputs import page_size, read_body, read_json, unknown_parameters
from node.api.views import delivered_record, public_record, public_view
from node.errors import (
    ScheduleNotFound,
    SchedulerError,
    StoreUnavailable,
    ValidationFailed,
)
from node.schedule.model import NewSchedule, Status, is_storage_id, public_id, storage_id
from node.schedule.parse import (
    parse_json,
    parse_new_schedule,
    parse_schedule_object,
    validate_id,
    validate_tenant,
)
from node.schedule.times import utcnow

log = structlog.get_logger("node.api.schedules")

MAX_PAGE = 1000
DEFAULT_PAGE = 100
# Room for the JSON around the payload and for base64's 4/3 expansion.
BODY_OVERHEAD = 64 * 1024
MAX_BATCH = 1000
BATCH_BODY_LIMIT = 16 * 1024 * 1024


def body_limit(max_payload_bytes: int) -> int:
    """The largest body of one schedule: its payload as base64, and the rest."""
    return max_payload_bytes * 4 // 3 + BODY_OVERHEAD


routes = web.RouteTableDef()


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
        topic=doc["topic"],
    )


@routes.post("/v1/schedules")
async def create_schedule(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    body = await read_body(request, body_limit(context.config.max_payload_bytes))
    now = utcnow()
    new = parse_new_schedule(body, context.limits, now, _caller(request).scope)
    [refused] = await context.admission.check([new])
    if refused is not None:
        raise refused
    doc, created = await context.store.insert(new, now)
    if created:
        _accepted(context, doc)
    return json_response(public_view(doc), status=201 if created else 200)


@routes.post("/v1/schedules:batch")
async def create_batch(request: web.Request) -> web.Response:
    """Up to MAX_BATCH schedules in one call, each validated and answered on
    its own (not all or nothing): an item's status is what a single POST of
    it would have answered. The inserts share round trips (group commit)."""
    context = request.app[CONTEXT]
    data = await read_json(request, BATCH_BODY_LIMIT)
    items = data.get("schedules") if isinstance(data, dict) else None
    if not isinstance(items, list) or set(data) != {"schedules"}:
        raise ValidationFailed('body must be {"schedules": [schedule, ...]}', "schedules")
    if not 1 <= len(items) <= MAX_BATCH:
        raise ValidationFailed(
            f"schedules must hold 1 to {MAX_BATCH} items, got {len(items)}", "schedules"
        )
    now = utcnow()
    scope = _caller(request).scope
    results: list[dict[str, Any]] = [{} for _ in items]
    parsed: list[tuple[int, NewSchedule]] = []
    for index, item in enumerate(items):
        try:
            parsed.append((index, parse_schedule_object(item, context.limits, now, scope)))
        except SchedulerError as exc:
            results[index] = _refused(index, exc)
    refusals = await context.admission.check([new for _, new in parsed])
    valid: list[tuple[int, NewSchedule]] = []
    for (index, new), refused in zip(parsed, refusals, strict=True):
        if refused is None:
            valid.append((index, new))
        else:
            results[index] = _refused(index, refused)
    outcomes = await asyncio.gather(
        *(context.store.insert(new, now) for _, new in valid), return_exceptions=True
    )
    for (index, _new), outcome in zip(valid, outcomes, strict=True):
        if isinstance(outcome, SchedulerError):
            if isinstance(outcome, StoreUnavailable):
                log.warning("store unavailable", error=str(outcome.__cause__), path=request.path)
            results[index] = _refused(index, outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            doc, created = outcome
            if created:
                _accepted(context, doc)
            results[index] = _item(index, 201 if created else 200, {"schedule": public_view(doc)})
    counts = Counter(r["status"] for r in results)
    return json_response(
        {
            "created": counts[201],
            "existing": counts[200],
            "rejected": len(items) - counts[201] - counts[200],
            "results": results,
        }
    )


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


@routes.get("/v1/schedules/{schedule_id}")
async def get_schedule(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    stored_id = _schedule_id(request)
    doc = await context.store.get(stored_id)
    if doc is None:
        raise _not_found(stored_id)
    return json_response(public_view(doc))


@routes.delete("/v1/schedules/{schedule_id}")
async def cancel_schedule(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    stored_id = _schedule_id(request)
    doc = await context.store.cancel(stored_id, utcnow())
    if doc is None:
        raise _not_found(stored_id)
    context.metrics.schedules_cancelled.inc()
    log.info(
        "schedule cancelled",
        schedule_id=doc["_id"],
        bucket=doc["bucket"],
        token=doc.get("token", 0),
    )
    return json_response(public_view(doc))


@routes.get("/v1/schedules/{schedule_id}/history")
async def schedule_history(request: web.Request) -> web.Response:
    """Every delivery attempt of a schedule still kept, newest first."""
    context = request.app[CONTEXT]
    stored_id = _schedule_id(request, also={"limit"})
    limit = page_size(request.query, MAX_PAGE, DEFAULT_PAGE)
    doc = await context.store.get(stored_id)
    if doc is None:
        raise _not_found(stored_id)
    history = [public_record(r) for r in await context.history.of(stored_id, limit)]
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


@routes.get("/v1/schedules")
async def list_schedules(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    query = request.query
    unknown_parameters(query, {"tenant", "status", "limit", "after"})
    status = query.get("status")
    if status is not None and status not in Status.__members__:
        raise ValidationFailed(f"status must be one of {', '.join(Status)}", "status")
    limit = page_size(query, MAX_PAGE, DEFAULT_PAGE)
    after = _decode_cursor(query["after"]) if "after" in query else None
    requested = query.get("tenant")
    tenant = _caller(request).tenant or (None if requested is None else validate_tenant(requested))
    if requested is not None and tenant != requested:
        _caller(request).scope(requested)  # another tenant's list: 403
    docs = await context.store.list_page(tenant=tenant, status=status, after=after, limit=limit + 1)
    page, more = docs[:limit], len(docs) > limit
    return json_response(
        {
            "schedules": [public_view(d) for d in page],
            "next": _encode_cursor(page[-1]["_id"]) if more and page else None,
        }
    )


def _encode_cursor(last_id: str) -> str:
    # Opaque to callers, so the paging key can change without breaking them.
    return base64.urlsafe_b64encode(json.dumps({"after": last_id}).encode()).decode().rstrip("=")


def _decode_cursor(text: str) -> str:
    """The stored id a cursor holds. Anything else is a 400: a made-up
    cursor must not reach the store (a NUL, a lone surrogate, deep JSON)."""
    refused = ValidationFailed("after is not a cursor returned by this API", "after")
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4))
        after = parse_json(raw)["after"]
    except (binascii.Error, ValueError, ValidationFailed, KeyError, TypeError):
        raise refused from None
    if not isinstance(after, str) or not is_storage_id(after):
        raise refused
    return after
