"""The HTTP API (DESIGN.md "HTTP API"): JSON in and out, errors as
``{"error": {"code", "message", "field"}}``, never a 500 for bad input.

The one place errors become HTTP: every ``SchedulerError`` carries its code,
a status hint and a retry hint, and ``errors`` turns them into the response
(``refusals.py``); aiohttp's own refusals (no route, wrong method, body too large)
and any unexpected exception (a 500 ``internal``, logged with its traceback)
get the same shape. The routes live in ``schedules.py`` and ``cluster.py``.

Only a request aiohttp cannot parse as HTTP at all (a request line or header
over 8190 bytes, a bad byte in a header, broken chunked framing) is refused
before any of this runs, with aiohttp's plain-text 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from node.api import cluster, schedules
from node.api.auth import CALLER, identify
from node.api.context import CONTEXT, ApiContext, json_response
from node.api.counting import ListingCounts
from node.api.inputs import BODY_GATE, BODY_LEFT, BodyGate
from node.api.observe import TRACING, observe, route_of
from node.api.refusals import HTTP_ERROR_CODES, error_response, internal_error
from node.errors import SchedulerError, StoreUnavailable
from node.tracing import OFF, Tracing

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal and fault as JSON in one shape (``refusals.py``)."""
    route = route_of(request)
    try:
        return await handler(request)
    except SchedulerError as exc:
        if exc.status_hint is None:  # never meant to reach a caller: a bug here
            log.exception("error that never reaches a caller", method=request.method, route=route)
            return internal_error()
        if isinstance(exc, StoreUnavailable):
            log.warning("store unavailable", error=str(exc.__cause__), route=route)
        response = error_response(exc)
        if request.get(BODY_LEFT):  # the stream is not at the next request: close it
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:  # a redirect is not an error
            raise
        # aiohttp's own refusals (unknown route, wrong method, body too large)
        # in the same error shape as ours.
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


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    context = request.app[CONTEXT]
    request[CALLER] = await identify(request, context.directory if context.config.auth else None)
    return await handler(request)


def build_app(context: ApiContext, tracing: Tracing = OFF) -> web.Application:
    app = web.Application(
        # Tracing on, its instrumentation puts its middleware before these
        # (node/otel.py): the call's span is current while they run.
        middlewares=[observe, errors, authenticate],
        # The largest body any route takes; each route checks its own limit.
        client_max_size=max(
            schedules.body_limit(context.config.max_payload_bytes), schedules.BATCH_BODY_LIMIT
        ),
    )
    app[CONTEXT] = context
    app[TRACING] = tracing
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
