"""Errors as answers: a ``SchedulerError`` becomes its JSON body, status and
hints (``Retry-After``, ``WWW-Authenticate``); a fault nobody turned into
one becomes a 500 that tells the caller nothing of it."""

from __future__ import annotations

import math

from aiohttp import web

from node.api.context import json_response
from node.errors import SchedulerError, Unauthorized

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
