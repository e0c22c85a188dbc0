"""The HTTP API (DESIGN.md "HTTP API"): JSON in and out, errors as
``{"error": {"code", "message", "field"}}``, never a 500 for bad input.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from importlib import resources
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from pymongo.errors import PyMongoError

from node.api.auth import CALLER, Caller, identify
from node.api.openapi import document as openapi_document
from node.errors import ApiError, ValidationFailed
from node.schedule.model import (
    Limits,
    NewSchedule,
    Status,
    parse_json,
    parse_new_schedule,
    parse_schedule_object,
    public_id,
    public_view,
    storage_id,
    validate_tenant,
)
from node.schedule.times import parse_time
from node.store.history import public_record
from node.store.schedules import utcnow

if TYPE_CHECKING:
    from node.process import Node

log = structlog.get_logger("node.api")

NODE_KEY: web.AppKey[Node] = web.AppKey("node")
MAX_PAGE = 1000
DEFAULT_PAGE = 100
# Room for the JSON around the payload and for base64's 4/3 expansion.
BODY_OVERHEAD = 64 * 1024
MAX_BATCH = 1000
BATCH_BODY_LIMIT = 16 * 1024 * 1024
OPENAPI = openapi_document()
CLUSTER_PAGE = (resources.files("node.api") / "static" / "cluster.html").read_text(encoding="utf-8")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.json_response(
        body, status=status, dumps=lambda o: json.dumps(o, separators=(",", ":"))
    )


def error_response(error: ApiError) -> web.Response:
    response = json_response(error.body(), status=error.status)
    response.headers.update(error.headers)
    return response


def _store_unavailable(exc: PyMongoError, request: web.Request) -> ApiError:
    log.warning("store unavailable", error=str(exc), path=request.path)
    return ApiError(503, "store_unavailable", "the schedule store is unreachable; retry")


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    route = (
        request.match_info.route.resource.canonical
        if request.match_info.route.resource
        else "unmatched"
    )
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except ApiError as exc:
        status = exc.status
        return error_response(exc)
    except web.HTTPException as exc:
        # aiohttp's own refusals (unknown route, wrong method, body too large)
        # in the same error shape as ours.
        status = exc.status
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status, "http_error"
        )
        return json_response({"error": {"code": code, "message": exc.reason}}, status=exc.status)
    except PyMongoError as exc:
        status = 503
        return error_response(_store_unavailable(exc, request))
    finally:
        node.metrics.http_requests.labels(route, request.method, str(status)).inc()


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    request[CALLER] = await identify(request, node.directory if node.config.auth else None)
    return await handler(request)


def _caller(request: web.Request) -> Caller:
    return request[CALLER]


def _limits(node: Node) -> Limits:
    return Limits(
        max_payload_bytes=node.config.max_payload_bytes,
        horizon=timedelta(seconds=node.config.horizon),
        retry=node.poller.retry_policy,
    )


def _accepted(node: Node, doc: dict[str, Any]) -> None:
    node.metrics.schedules_created.inc()
    node.admission.accepted(doc["tenant"])
    node.schedule_accepted(doc)
    log.info(
        "schedule accepted",
        schedule_id=doc["_id"],
        bucket=doc["bucket"],
        token=doc.get("token", 0),
        topic=doc["topic"],
    )


async def create_schedule(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    body = await _read_body(request, node.config.max_payload_bytes * 4 // 3 + BODY_OVERHEAD)
    now = utcnow()
    new = parse_new_schedule(body, _limits(node), now, _caller(request).scope)
    [refused] = await node.admission.check([new])
    if refused is not None:
        raise refused
    doc, created = await node.store.insert(new, now)
    if created:
        _accepted(node, doc)
    return json_response(public_view(doc), status=201 if created else 200)


async def create_batch(request: web.Request) -> web.Response:
    """Up to MAX_BATCH schedules in one call, each validated and answered on
    its own (not all or nothing): an item's status is what a single POST of
    it would have answered. The inserts share round trips (group commit)."""
    node = request.app[NODE_KEY]
    data = parse_json(await _read_body(request, BATCH_BODY_LIMIT))
    items = data.get("schedules") if isinstance(data, dict) else None
    if not isinstance(items, list) or set(data) != {"schedules"}:
        raise ValidationFailed('body must be {"schedules": [schedule, ...]}', "schedules")
    if not 1 <= len(items) <= MAX_BATCH:
        raise ValidationFailed(
            f"schedules must hold 1 to {MAX_BATCH} items, got {len(items)}", "schedules"
        )
    now = utcnow()
    limits = _limits(node)
    scope = _caller(request).scope
    results: list[dict[str, Any]] = [{} for _ in items]
    parsed: list[tuple[int, NewSchedule]] = []
    for index, item in enumerate(items):
        try:
            parsed.append((index, parse_schedule_object(item, limits, now, scope)))
        except ApiError as exc:
            results[index] = _item(index, exc.status, exc.body())
    refusals = await node.admission.check([new for _, new in parsed])
    valid: list[tuple[int, NewSchedule]] = []
    for (index, new), refused in zip(parsed, refusals, strict=True):
        if refused is None:
            valid.append((index, new))
        else:
            results[index] = _item(index, refused.status, refused.body())
    outcomes = await asyncio.gather(
        *(node.store.insert(new, now) for _, new in valid), return_exceptions=True
    )
    for (index, _new), outcome in zip(valid, outcomes, strict=True):
        if isinstance(outcome, PyMongoError):
            outcome = _store_unavailable(outcome, request)
        if isinstance(outcome, ApiError):
            results[index] = _item(index, outcome.status, outcome.body())
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            doc, created = outcome
            if created:
                _accepted(node, doc)
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


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise ValidationFailed(f"request body over {limit} bytes", status=413)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ValidationFailed(f"request body over {limit} bytes", status=413) from None
    if len(body) > limit:  # chunked, so no length was announced
        raise ValidationFailed(f"request body over {limit} bytes", status=413)
    return body


def _schedule_id(request: web.Request, also: frozenset[str] | set[str] = frozenset()) -> str:
    """The stored id of the schedule a route names, in the caller's tenant
    (with auth off, the ``tenant`` query parameter's, default ``default``).
    Another tenant's schedule is then simply not found."""
    unknown = sorted(set(request.query) - {"tenant", *also})
    if unknown:
        raise ValidationFailed(f"unknown query parameter {unknown[0]!r}", unknown[0])
    requested = request.query.get("tenant")
    tenant = _caller(request).scope(None if requested is None else validate_tenant(requested))
    return storage_id(tenant, request.match_info["schedule_id"])


def _not_found(stored_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no schedule {public_id(stored_id)!r}")


async def get_schedule(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    stored_id = _schedule_id(request)
    doc = await node.store.get(stored_id)
    if doc is None:
        raise _not_found(stored_id)
    return json_response(public_view(doc))


async def cancel_schedule(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    stored_id = _schedule_id(request)
    doc = await node.store.cancel(stored_id, utcnow())
    if doc is None:
        raise _not_found(stored_id)
    node.metrics.schedules_cancelled.inc()
    log.info(
        "schedule cancelled",
        schedule_id=doc["_id"],
        bucket=doc["bucket"],
        token=doc.get("token", 0),
    )
    return json_response(public_view(doc))


async def schedule_history(request: web.Request) -> web.Response:
    """Every delivery attempt of a schedule still kept, newest first."""
    node = request.app[NODE_KEY]
    limit_text = request.query.get("limit", str(DEFAULT_PAGE))
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_PAGE:
        raise ValidationFailed(f"limit must be an integer from 1 to {MAX_PAGE}", "limit")
    stored_id = _schedule_id(request, also={"limit"})
    if await node.store.get(stored_id) is None:
        raise _not_found(stored_id)
    records = await node.history.of(stored_id, int(limit_text))
    return json_response(
        {
            "id": public_id(stored_id),
            "retentionSeconds": node.config.history_retention,
            "perSchedule": node.config.history_per_schedule,
            "history": [public_record(r) for r in records],
        }
    )


async def list_schedules(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    query = request.query
    unknown = sorted(set(query) - {"tenant", "status", "limit", "after"})
    if unknown:
        raise ValidationFailed(f"unknown query parameter {unknown[0]!r}", unknown[0])
    status = query.get("status")
    if status is not None and status not in Status.__members__:
        raise ValidationFailed(f"status must be one of {', '.join(Status)}", "status")
    limit_text = query.get("limit", str(DEFAULT_PAGE))
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_PAGE:
        raise ValidationFailed(f"limit must be an integer from 1 to {MAX_PAGE}", "limit")
    limit = int(limit_text)
    after = _decode_cursor(query["after"]) if "after" in query else None
    requested = query.get("tenant")
    tenant = _caller(request).tenant or (None if requested is None else validate_tenant(requested))
    if requested is not None and tenant != requested:
        _caller(request).scope(requested)  # another tenant's list: 403
    docs = await node.store.list_page(tenant=tenant, status=status, after=after, limit=limit + 1)
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
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        after = json.loads(raw)["after"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise ValidationFailed("after is not a cursor returned by this API", "after") from None
    if not isinstance(after, str):
        raise ValidationFailed("after is not a cursor returned by this API", "after")
    return after


async def wake(request: web.Request) -> web.Response:
    """A peer accepted a schedule in one of our buckets, due soon."""
    node = request.app[NODE_KEY]
    try:
        body = json.loads(await request.read())
        bucket = body["bucket"]
        due_at = parse_time(body["dueAt"], "dueAt")
    except (ValueError, KeyError, TypeError):
        raise ValidationFailed('body must be {"bucket": int, "dueAt": time}') from None
    if not isinstance(bucket, int) or isinstance(bucket, bool):
        raise ValidationFailed("bucket must be an integer", "bucket")
    return json_response({"woken": node.wake(bucket, due_at)}, status=202)


async def chaos_partition(request: web.Request) -> web.Response:
    """Chaos mode only: drop gossip to these peer addresses (a partition
    simulated in process, where network namespaces are unavailable)."""
    try:
        blocked = json.loads(await request.read())["blocked"]
    except (ValueError, KeyError, TypeError):
        raise ValidationFailed('body must be {"blocked": ["host:port", ...]}') from None
    if not isinstance(blocked, list) or not all(isinstance(a, str) for a in blocked):
        raise ValidationFailed("blocked must be a list of host:port strings", "blocked")
    return json_response({"blocked": request.app[NODE_KEY].block_gossip(blocked)})


async def cluster_view(request: web.Request) -> web.Response:
    return json_response(await request.app[NODE_KEY].cluster_view())


async def drain(request: web.Request) -> web.Response:
    """Graceful leave without exiting (operators: before maintenance)."""
    node = request.app[NODE_KEY]
    if not await node.drain():
        raise ApiError(409, "conflict", f"node is {node.state}, not running: nothing to drain")
    return json_response({"node": node.config.node_id, "state": node.state})


async def cluster_backlog(request: web.Request) -> web.Response:
    return json_response(await request.app[NODE_KEY].backlog())


async def cluster_page(request: web.Request) -> web.Response:
    """Members, bucket ownership, leases, backlog and lateness, refreshing
    every second: plain HTML and a small script over the JSON API."""
    return web.Response(text=CLUSTER_PAGE, content_type="text/html", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    return json_response(OPENAPI)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "node": request.app[NODE_KEY].config.node_id})


async def readyz(request: web.Request) -> web.Response:
    checks = await request.app[NODE_KEY].readiness()
    ready = all(checks.values())
    return json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    return web.Response(
        body=node.metrics.render(), headers={"Content-Type": node.metrics.content_type}
    )


def build_app(node: Node) -> web.Application:
    app = web.Application(
        middlewares=[errors_and_metrics, authenticate],
        # The largest body any route takes; each route checks its own limit.
        client_max_size=max(
            node.config.max_payload_bytes * 4 // 3 + BODY_OVERHEAD, BATCH_BODY_LIMIT
        ),
    )
    app[NODE_KEY] = node
    app.router.add_post("/v1/schedules", create_schedule)
    app.router.add_post("/v1/schedules:batch", create_batch)
    app.router.add_get("/v1/schedules", list_schedules)
    app.router.add_get("/v1/schedules/{schedule_id}", get_schedule)
    app.router.add_delete("/v1/schedules/{schedule_id}", cancel_schedule)
    app.router.add_get("/v1/schedules/{schedule_id}/history", schedule_history)
    app.router.add_get("/", cluster_page)
    app.router.add_get("/v1/cluster", cluster_view)
    app.router.add_get("/v1/cluster/backlog", cluster_backlog)
    app.router.add_post("/v1/internal/wake", wake)
    app.router.add_post("/v1/admin/drain", drain)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if node.config.chaos_mode != "off":
        app.router.add_put("/v1/chaos/partition", chaos_partition)
    return app


__all__ = ["build_app"]
