"""The HTTP API (DESIGN.md "HTTP API"): JSON in and out, errors as
``{"error": {"code", "message", "field"}}``, never a 500 for bad input.

The one place errors become HTTP: every ``SchedulerError`` carries its code,
a status hint and a retry hint, and ``errors_and_metrics`` turns them into
the response; aiohttp's own refusals (no route, wrong method, body too large)
and any unexpected exception (a 500 ``internal``, logged with its traceback)
get the same shape. The routes live in ``schedules.py`` and ``cluster.py``.

Only a request aiohttp cannot parse as HTTP at all (a request line or header
over 8190 bytes, a bad byte in a header, broken chunked framing) is refused
before any of this runs, with aiohttp's plain-text 400.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from node.api import cluster, schedules
from node.api.auth import CALLER, identify
from node.api.context import CONTEXT, ApiContext, json_response
from node.api.counting import ListingCounts
from node.api.inputs import BODY_GATE, BODY_LEFT, BodyGate
from node.errors import SchedulerError, StoreUnavailable, Unauthorized

log = structlog.get_logger("node.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The longest Retry-After ever suggested (a hint beyond a day helps nobody).
MAX_RETRY_AFTER = 86400
# aiohttp's refusals by status, as our error codes.
HTTP_ERROR_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
}


def error_response(error: SchedulerError) -> web.Response:
    response = json_response(error.body(), status=error.status_hint or 500)
    if error.retry_after is not None:
        seconds = min(error.retry_after, MAX_RETRY_AFTER)
        response.headers["Retry-After"] = str(max(1, math.ceil(seconds)))
    if isinstance(error, Unauthorized):
        response.headers["WWW-Authenticate"] = 'Bearer realm="scheduler"'
    return response


def internal_error() -> web.Response:
    """A 500 that says nothing of the fault to the caller: the log has it."""
    body = {"error": {"code": "internal", "message": "internal error; the node's log has it"}}
    return json_response(body, status=500)


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    context = request.app[CONTEXT]
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
    except SchedulerError as exc:
        if exc.status_hint is None:  # never meant to reach a caller: a bug here
            log.exception("error that never reaches a caller", method=request.method, route=route)
            return internal_error()
        if isinstance(exc, StoreUnavailable):
            log.warning("store unavailable", error=str(exc.__cause__), path=request.path)
        status = exc.status_hint
        response = error_response(exc)
        if request.get(BODY_LEFT):  # the stream is not at the next request: close it
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:  # a redirect is not an error
            status = exc.status
            raise
        # aiohttp's own refusals (unknown route, wrong method, body too large)
        # in the same error shape as ours.
        status = exc.status
        code = HTTP_ERROR_CODES.get(exc.status, "http_error")
        response = json_response({"error": {"code": code, "message": exc.reason}}, exc.status)
        if "Allow" in exc.headers:  # a 405 says which methods the route takes
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception:
        # A bug, or a failure nobody turned into a SchedulerError: still JSON.
        log.exception("unexpected error", method=request.method, route=route)
        return internal_error()
    finally:
        request.app[BODY_GATE].leave(request)
        context.metrics.http_requests.labels(route, request.method, str(status)).inc()


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    context = request.app[CONTEXT]
    request[CALLER] = await identify(request, context.directory if context.config.auth else None)
    return await handler(request)


def build_app(context: ApiContext) -> web.Application:
    app = web.Application(
        middlewares=[errors_and_metrics, authenticate],
        # The largest body any route takes; each route checks its own limit.
        client_max_size=max(
            schedules.body_limit(context.config.max_payload_bytes), schedules.BATCH_BODY_LIMIT
        ),
    )
    app[CONTEXT] = context
    app[BODY_GATE] = BodyGate()
    app[schedules.LISTING_COUNTS] = ListingCounts()
    app[cluster.BACKLOG] = cluster.Backlog()
    app[cluster.COUNTS] = cluster.StatusCounts()
    app.router.add_routes(schedules.routes)
    app.router.add_routes(cluster.routes)
    if context.config.chaos_mode != "off":
        app.router.add_routes(cluster.chaos_routes)
    return app


__all__ = ["build_app"]
