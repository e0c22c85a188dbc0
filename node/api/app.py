"""The HTTP API (DESIGN.md "HTTP API"): JSON in and out, errors as
``{"error": {"code", "message", "field"}}``, never a 500 for bad input.

The one place errors become HTTP: every ``SchedulerError`` carries its code,
a status hint and a retry hint, and ``errors_and_metrics`` turns them into
the response. The routes live in ``schedules.py`` and ``cluster.py``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from node.api import cluster, schedules
from node.api.auth import CALLER, identify
from node.api.context import CONTEXT, ApiContext, json_response
from node.errors import SchedulerError, StoreUnavailable, Unauthorized

log = structlog.get_logger("node.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The longest Retry-After ever suggested (a hint beyond a day helps nobody).
MAX_RETRY_AFTER = 86400


def error_response(error: SchedulerError) -> web.Response:
    response = json_response(error.body(), status=error.status_hint or 500)
    if error.retry_after is not None:
        seconds = min(error.retry_after, MAX_RETRY_AFTER)
        response.headers["Retry-After"] = str(max(1, math.ceil(seconds)))
    if isinstance(error, Unauthorized):
        response.headers["WWW-Authenticate"] = 'Bearer realm="scheduler"'
    return response


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
        if isinstance(exc, StoreUnavailable):
            log.warning("store unavailable", error=str(exc.__cause__), path=request.path)
        status = exc.status_hint or 500
        return error_response(exc)
    except web.HTTPException as exc:
        # aiohttp's own refusals (unknown route, wrong method, body too large)
        # in the same error shape as ours.
        status = exc.status
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status, "http_error"
        )
        return json_response({"error": {"code": code, "message": exc.reason}}, status=exc.status)
    finally:
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
    app[cluster.BACKLOG] = cluster.Backlog()
    app.router.add_routes(schedules.routes)
    app.router.add_routes(cluster.routes)
    if context.config.chaos_mode != "off":
        app.router.add_routes(cluster.chaos_routes)
    return app


__all__ = ["build_app"]
