"""A stand-in for a broker that grants idempotent producers to aiokafka: a
TCP proxy in front of the embedded broker that speaks InitProducerId for it.

aiokafka asks for a producer id with InitProducerId version 0, which the
embedded Tansu answers with an error; Tansu grants one at version 3 and
later (and then checks the producer id and sequence of every record batch
produced under it). The proxy rewrites the client's version 0 request as a
version 3 request and the answer back, and relays every other request
unchanged, so the broker itself grants the id and enforces it: everything
but that one translation is the real broker. The broker must advertise the
proxy's address (``--advertised-listener-url``) so a client never leaves it.

Kafka's framing (the protocol guide): every request and response is a
4-byte big-endian size, then the message. A request starts with api_key
(int16), api_version (int16), correlation_id (int32) and client_id (int16
length, bytes); a response with the correlation_id. Version 3 of
InitProducerId is "flexible": its headers and bodies end in tagged fields
(an empty set is one zero byte) and strings are compact (a varint length + 1).
Responses on a connection come back in request order.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

INIT_PRODUCER_ID = 22
NO_TAGS = b"\x00"


class InitProducerIdStandIn:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.granted = 0  # InitProducerId requests translated
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        # In request order: whether the broker's answer needs translating back.
        turns: asyncio.Queue[bool] = asyncio.Queue()
        responder = asyncio.create_task(self._respond(turns, up_reader, writer))
        try:
            while (frame := await _read_frame(reader)) is not None:
                api_key, version = struct.unpack(">hh", frame[4:8])
                translate = api_key == INIT_PRODUCER_ID and version == 0
                if translate:
                    self.granted += 1
                    frame = _init_v3(frame)
                await turns.put(translate)
                up_writer.write(frame)
                await up_writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            responder.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await responder
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)

    @staticmethod
    async def _respond(
        turns: asyncio.Queue[bool], up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            translate = await turns.get()
            frame = await _read_frame(up_reader)
            if frame is None:
                return
            writer.write(_init_v0_answer(frame) if translate else frame)
            await writer.drain()


def _init_v3(frame: bytes) -> bytes:
    """A version 0 InitProducerId request as version 3 (a new producer)."""
    correlation, client_length = struct.unpack(">ih", frame[8:14])
    offset = 14 + max(client_length, 0)
    client_id = frame[14:offset]
    (txn_length,) = struct.unpack(">h", frame[offset : offset + 2])
    txn = b"" if txn_length < 0 else frame[offset + 2 : offset + 2 + txn_length]
    (timeout,) = struct.unpack(">i", frame[offset + 2 + max(txn_length, 0) :][:4])
    header = struct.pack(">hhih", INIT_PRODUCER_ID, 3, correlation, len(client_id)) + client_id
    compact_txn = b"\x00" if txn_length < 0 else _varint(len(txn) + 1) + txn
    body = compact_txn + struct.pack(">iqh", timeout, -1, -1) + NO_TAGS
    message = header + NO_TAGS + body
    return struct.pack(">i", len(message)) + message


def _init_v0_answer(frame: bytes) -> bytes:
    """A version 3 InitProducerId answer as version 0: the same fields
    without the tagged ones."""
    (correlation,) = struct.unpack(">i", frame[4:8])
    # After the correlation id: the header's tags, then throttle, error, id, epoch.
    throttle, error, producer_id, epoch = struct.unpack(">ihqh", frame[9:25])
    message = struct.pack(">iihqh", correlation, throttle, error, producer_id, epoch)
    return struct.pack(">i", len(message)) + message


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One size-prefixed message, with its size; None at the end of the stream."""
    try:
        size = await reader.readexactly(4)
    except asyncio.IncompleteReadError:
        return None
    (length,) = struct.unpack(">i", size)
    return size + await reader.readexactly(length)
