"""Reading what a request carries: its body, held to the route's limit while
it arrives, and its parameters. Whatever a client sends, the answer is a
``SchedulerError`` (a 400 or a 413), never an exception from deeper down.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from node.errors import BodyTooSlow, NodeBusy, PayloadTooLarge, ValidationFailed
from node.schedule.parse import parse_json

# A page size, in ASCII digits (str.isdigit() also takes "²", which int() refuses).
_PAGE_SIZE = re.compile(r"[0-9]{1,4}")
# Set when a body was refused unread, or could not be read: the answer then
# closes the connection (app.py), whose stream is not at a request's start.
BODY_LEFT: web.RequestKey[bool] = web.RequestKey("body_left")
# A body past this size is a large one: a node takes in at most
# MAX_LARGE_BODIES of them at once, each held (with what it parses to)
# until its answer is sent, so their memory has a bound (docs/operations.md, "Bounds").
LARGE_BODY_BYTES = 1024 * 1024
MAX_LARGE_BODIES = 2
# How long a large body waits for its turn before the answer is a 503.
LARGE_BODY_WAIT = 5.0
# The longest a body may take to arrive, from the first byte read.
BODY_SECONDS = 30.0


class BodyGate:
    """The large bodies a node takes in at once (one per app)."""

    def __init__(self, slots: int = MAX_LARGE_BODIES) -> None:
        self._slots = asyncio.Semaphore(slots)

    async def enter(self, request: web.Request) -> None:
        """Hold a slot for ``request`` until ``leave``; 503 when none frees
        up within LARGE_BODY_WAIT."""
        if request.get(HOLDS_SLOT):
            return
        try:
            await asyncio.wait_for(self._slots.acquire(), LARGE_BODY_WAIT)
        except TimeoutError:
            request[BODY_LEFT] = True
            raise NodeBusy(
                f"this node is taking in {MAX_LARGE_BODIES} large bodies already; "
                "retry, or call another node",
                retry_after=1,
            ) from None
        request[HOLDS_SLOT] = True

    def leave(self, request: web.Request) -> None:
        """The request's answer is out: its slot, if it held one, is free."""
        if request.get(HOLDS_SLOT):
            request[HOLDS_SLOT] = False
            self._slots.release()


BODY_GATE: web.AppKey[BodyGate] = web.AppKey("body_gate")
HOLDS_SLOT: web.RequestKey[bool] = web.RequestKey("holds_large_body_slot")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (decompressed, if it came encoded);
    413 past that, checked as it arrives, not once it is all in memory; a
    large one only in its turn (``BodyGate``), and none slower than
    BODY_SECONDS (408)."""
    if request.content_length is not None and request.content_length > limit:
        request[BODY_LEFT] = True
        raise PayloadTooLarge(f"request body over {limit} bytes")
    gate = request.app[BODY_GATE]
    if request.content_length is not None and request.content_length > LARGE_BODY_BYTES:
        await gate.enter(request)
    body = bytearray()
    try:
        async with asyncio.timeout(BODY_SECONDS):
            async for chunk in request.content.iter_any():
                body += chunk
                if len(body) > limit:  # chunked (or compressed): no length was announced
                    request[BODY_LEFT] = True
                    raise PayloadTooLarge(f"request body over {limit} bytes")
                if len(body) > LARGE_BODY_BYTES:
                    await gate.enter(request)
    except TimeoutError:
        request[BODY_LEFT] = True
        raise BodyTooSlow(f"the body did not arrive within {BODY_SECONDS:g} s") from None
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
