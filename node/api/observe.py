"""What every API call leaves behind: its request id (``RequestTrace``, from
the caller's ``X-Request-ID`` or ``traceparent``, else made here) bound to
every log line it writes and echoed in its answer; one access log line; its
count and its duration in the metrics.

The outermost middleware: it sees the answer the error middleware made of
any refusal, so the status it logs is the one the caller got.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from node.api.auth import CALLER
from node.api.context import CONTEXT
from node.api.refusals import error_response
from node.errors import ValidationFailed
from node.schedule.trace import (
    REQUEST_ID_HEADER,
    TRACEPARENT_HEADER,
    RequestTrace,
    new_request_id,
    request_trace,
)
from node.tracing import Tracing

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TRACE: web.RequestKey[RequestTrace] = web.RequestKey("trace")
TRACING: web.AppKey[Tracing] = web.AppKey("tracing")
# Calls an orchestrator, a scraper or another node makes every few seconds:
# logged only with ACCESS_LOG=all (their counts and durations are metrics).
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics", "/v1/internal/wake"})
# The status logged for a call whose caller went away before its answer
# (nginx's convention; no answer was sent).
CLIENT_GONE = 499


def route_of(request: web.Request) -> str:
    """The route template (``/v1/schedules/{schedule_id}``), never the raw
    path: bounded as a metric label, and free of the ids a path holds."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def trace_of(request: web.Request) -> RequestTrace:
    """The request id and traceparent of the call being served."""
    return request[TRACE]


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    refusal: ValidationFailed | None = None
    # Tracing on, the span serving this call is what a schedule made by it
    # stores (its parent is the caller's traceparent); off, the caller's.
    traceparent = request.app[TRACING].current_traceparent() or request.headers.get(
        TRACEPARENT_HEADER
    )
    try:
        trace = request_trace(request.headers.get(REQUEST_ID_HEADER), traceparent)
    except ValidationFailed as exc:  # answered 400, under an id of our own
        trace, refusal = RequestTrace(new_request_id()), exc
    request[TRACE] = trace
    status = 500
    response: web.StreamResponse | None = None
    with structlog.contextvars.bound_contextvars(request_id=trace.request_id):
        try:
            response = error_response(refusal) if refusal else await handler(request)
            status = response.status
            response.headers[REQUEST_ID_HEADER] = trace.request_id
            return response
        except web.HTTPException as exc:  # a redirect: errors() answers the rest
            status = exc.status
            exc.headers[REQUEST_ID_HEADER] = trace.request_id
            raise
        except asyncio.CancelledError:
            status = CLIENT_GONE
            raise
        finally:
            _account(request, status, time.perf_counter() - started, response)


def _account(
    request: web.Request, status: int, seconds: float, response: web.StreamResponse | None
) -> None:
    context = request.app[CONTEXT]
    route = route_of(request)
    metrics = context.metrics
    metrics.http_requests.labels(route, request.method, str(status)).inc()
    metrics.http_seconds.labels(route, request.method).observe(seconds)
    mode = context.config.access_log
    if mode == "off" or (mode == "on" and route in QUIET_ROUTES):
        return
    caller = request.get(CALLER)
    log.info(
        "request",
        method=request.method,
        route=route,
        status=status,
        duration_ms=round(seconds * 1000, 2),
        bytes=response.content_length if response is not None else None,
        tenant=caller.tenant if caller is not None else None,
        remote=request.remote,
    )
