"""Reading what a request carries: its body, held to the route's limit while
it arrives, and its parameters. Whatever a client sends, the answer is a
``SchedulerError`` (a 400 or a 413), never an exception from deeper down.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from node.errors import PayloadTooLarge, ValidationFailed
from node.schedule.parse import parse_json

# A page size, in ASCII digits (str.isdigit() also takes "²", which int() refuses).
_PAGE_SIZE = re.compile(r"[0-9]{1,4}")
# Set when a body was refused unread, or could not be read: the answer then
# closes the connection (app.py), whose stream is not at a request's start.
BODY_LEFT: web.RequestKey[bool] = web.RequestKey("body_left")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (decompressed, if it came encoded);
    413 past that, checked as it arrives, not once it is all in memory."""
    if request.content_length is not None and request.content_length > limit:
        request[BODY_LEFT] = True
        raise PayloadTooLarge(f"request body over {limit} bytes")
    body = bytearray()
    try:
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:  # chunked (or compressed): no length was announced
                request[BODY_LEFT] = True
                raise PayloadTooLarge(f"request body over {limit} bytes")
    except (HttpProcessingError, web.RequestPayloadError) as exc:
        request[BODY_LEFT] = True
        # bad chunked framing, a Content-Encoding the body is not in, a bomb
        cause = exc.__cause__ if isinstance(exc.__cause__, HttpProcessingError) else exc
        detail = cause.message if isinstance(cause, HttpProcessingError) else str(cause)
        raise ValidationFailed(f"request body could not be read: {detail.strip()}") from None
    return bytes(body)


async def read_json(request: web.Request, limit: int) -> Any:
    """The body as JSON, by the rules of ``parse_json`` (UTF-8, no lone
    surrogate, nested at most MAX_DEPTH levels)."""
    return parse_json(await read_body(request, limit))


async def no_body(request: web.Request) -> None:
    """A route that takes no body refuses one: a 413, over its limit of 0 bytes."""
    if request.body_exists:
        await read_body(request, 0)


def page_size(query: Any, maximum: int, default: int) -> int:
    """The ``limit`` query parameter: 1 to ``maximum``."""
    text = query.get("limit")
    if text is None:
        return default
    if not _PAGE_SIZE.fullmatch(text) or not 1 <= int(text) <= maximum:
        raise ValidationFailed(f"limit must be an integer from 1 to {maximum}", "limit")
    return int(text)


def unknown_parameters(query: Any, known: frozenset[str] | set[str]) -> None:
    """Refuse a query parameter the route does not take."""
    unknown = sorted(set(query) - known)
    if unknown:
        raise ValidationFailed(f"unknown query parameter {unknown[0]!r}", unknown[0])
