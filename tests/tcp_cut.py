"""A TCP relay that can be cut: what a network partition between one node
and a server looks like, for tests that cut one node and not the others.

``cut()`` stops relaying: the connections open stay open and carry nothing
(a black hole, as a partition is, not a refusal), and new ones are accepted
and carry nothing either. ``heal()`` drops the black-holed connections (the
client sees them fail and reconnects, as after a partition heals) and relays
again. Everything that passes is the real server's.
"""

from __future__ import annotations

import asyncio
import contextlib


class CuttableRelay:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str) -> None:
        self._server = await asyncio.start_server(self._serve, host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        self._cut = True

    def heal(self) -> None:
        self._cut = False
        for writer in list(self._writers):
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.heal()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            self._writers.discard(writer)
            self._tasks.discard(task)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                w.close()
                self._writers.discard(w)
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self._cut:
                continue  # swallowed: a partition loses what crosses it
            writer.write(data)
            await writer.drain()
        writer.close()
