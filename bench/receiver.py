"""An HTTP receiver for the delivery suite's HTTP rows: it notes each
delivery's ``schedule-id``, ``execute-at`` and arrival time and answers 204
at once, or after ``--hang`` seconds (a hung endpoint, for the isolation
run). It checks no signature: verifying is the receiver's cost, not the
scheduler's, and tests/node/delivery/test_http_sink.py checks what is signed.

It runs in a process of its own (``python -m bench.receiver HOST``), the
way the broker does for the Kafka rows: in the bench process it would share
an event loop, and a core, with the bench's own reading and polling, so a
slow bench would show as late deliveries; apart, its CPU is measured alone
and it cannot slow the bench either. It binds a free port on HOST, prints
``ready PORT`` and serves until killed:

* ``/deliver`` (any method): a delivery;
* ``GET /seen?from=N``: the deliveries noted from the N-th on, as JSON
  ``[[schedule_id, execute_at, arrived_epoch_s], ...]``;
* ``POST /reset``: forget what was noted (a new run begins).

The bench side is here too: ``Receiver`` starts one, ``ReceiverReader``
reads it for a run the way ``stack.TopicReader`` reads a topic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.stack import Delivery
from node.schedule.times import parse_time
from node.version import add_version_flag

# How often the bench asks a receiver what arrived (seconds): a run is seen
# to end this much late at most, which only moves its cut-off, never a
# delivery's own arrival time.
POLL = 0.2
# How long a receiver may take to start (import aiohttp, bind).
START_WITHIN = 30.0


# -- the receiver's process --------------------------------------------------------


def receiver_app(hang: float) -> web.Application:
    seen: list[tuple[str, str, float]] = []

    async def deliver(request: web.Request) -> web.Response:
        # Noted on arrival: lateness is when the call reached us, not when
        # we chose to answer it.
        arrived = time.time()
        headers = request.headers
        seen.append((headers.get("schedule-id", ""), headers.get("execute-at", ""), arrived))
        if hang:
            await asyncio.sleep(hang)
        return web.Response(status=204)

    async def read_seen(request: web.Request) -> web.Response:
        start = int(request.query.get("from", "0"))
        return web.json_response(seen[start:])

    async def reset(_request: web.Request) -> web.Response:
        seen.clear()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_route("*", "/deliver", deliver)
    app.router.add_get("/seen", read_seen)
    app.router.add_post("/reset", reset)
    return app


async def serve(host: str, hang: float) -> None:
    """Serve until killed, on a port the kernel picks (no race for a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    # No access log: a line per delivery would cost more than the delivery.
    runner = web.AppRunner(receiver_app(hang), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock, backlog=1024).start()
    print(f"ready {sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


# -- the bench's side ----------------------------------------------------------------


def delivery_from(noted: list[Any]) -> Delivery:
    """One ``/seen`` entry as the judge reads a delivery."""
    schedule_id, execute_at, arrived = noted
    return Delivery(
        str(schedule_id), parse_time(execute_at, "execute-at").timestamp(), float(arrived)
    )


class Receiver:
    """A receiver process on ``host``, hanging each request ``hang`` seconds."""

    def __init__(self, host: str, log: Path, hang: float = 0.0) -> None:
        self.host = host
        self.hang = hang
        self.log_path = log
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Where schedules are delivered."""
        return self.base + "/deliver"

    @property
    def pid(self) -> int:
        assert self.process is not None, "start first"
        return self.process.pid

    async def start(self) -> None:
        self.process = self._spawn()
        stdout = self.process.stdout
        assert stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(stdout.readline), START_WITHIN)
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"the receiver on {self.host} did not start: see {self.log_path}")
        self.port = int(line.split()[1])

    async def reset(self) -> None:
        """Forget what was noted: a run begins (before its system starts: a
        system that starts late delivers before the run's reader is
        entered, and those deliveries are the run's)."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.base + "/reset") as response,
        ):
            response.raise_for_status()

    def _spawn(self) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "bench.receiver", self.host, "--hang", str(self.hang)]
        with self.log_path.open("a") as log:
            return subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True
            )

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class ReceiverReader:
    """What reached a receiver during one run, as ``stack.TopicReader`` has
    it for a topic: ``deliveries`` and the distinct ``ids``, kept up to date
    while the run lasts, from what the receiver noted since its last
    ``reset`` (the run's start, before its system starts)."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.deliveries: list[Delivery] = []
        self.ids: set[str] = set()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ReceiverReader:
        self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None and self._session is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._session.close()

    async def _read(self) -> None:
        while True:
            await self.read_once()
            await asyncio.sleep(POLL)

    async def read_once(self) -> None:
        """Take what arrived since the last read."""
        assert self._session is not None
        url = f"{self.receiver.base}/seen?from={len(self.deliveries)}"
        async with self._session.get(url) as response:
            noted = await response.json()
        for entry in noted:
            delivery = delivery_from(entry)
            self.deliveries.append(delivery)
            self.ids.add(delivery.schedule_id)

    async def wait_for(self, count: int, deadline: float) -> bool:
        """True once ``count`` distinct schedules arrived; False at the
        monotonic ``deadline``."""
        while len(self.ids) < count:
            if self._task is not None and self._task.done():
                self._task.result()  # the reading failed: say why, not wait in vain
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receiver", description=__doc__)
    add_version_flag(parser)
    parser.add_argument("host", help="the address to listen on, e.g. 127.0.0.2")
    parser.add_argument("--hang", type=float, default=0.0, help="seconds before each 204")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.hang))


if __name__ == "__main__":
    main()
