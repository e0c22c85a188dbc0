"""The run's webhook receiver: a real aiohttp server in a process of its
own (``python -m chaos.lab.receiver``), the endpoint every ``http`` target
of the load names, as the broker is every topic's.

Every request it answers, on any path but the control route, is one JSON
line in its log: when it read the request's head (``at``), when it
answered, the status it gave, the scheduler's headers (schedule-id,
fence-token, attempt, execute-at, webhook-id), a digest of the body, and
whether both signatures checked out under the run's signing secret. The
line is written and flushed before the answer is sent: a receiver killed
between the two has the request (a real one would have acted on it)
though the node never heard so, which is at-least-once, as with a broker
that stored a record and died before it acknowledged it. The runner reads
the log back like the topic (``chaos/receipts.py``); a line of a 2xx is a
delivery, any other a refusal.

Its modes, which the fault player switches at run time through the
control route (``PUT /_chaos/mode``):

* ``up``: 200;
* ``503``: 503 with ``Retry-After`` (the node waits that long, spending no
  attempt);
* ``slow``: 200, after SLOW seconds (longer than the load's timeout: the
  node gives up first, and the request still counts as taken when the
  answer is finally written, as a real endpoint's slow commit would);
* ``400``: 400, refused for good (the node ends the schedule
  DELIVERY_FAILED).

Down is no mode: the runner kills the process (SIGKILL) and starts it
again on the same port later (``Receiver.kill``, ``Receiver.start``), so a
call meanwhile finds the port closed. A restarted receiver starts ``up``
and appends to the same log.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from node.ops import embedded
from node.schedule.destination import FENCE_SIGNED
from node.schedule.webhook import secret_key
from node.version import add_version_flag

MODES = ("up", "503", "slow", "400")
CONTROL = "/_chaos/mode"
# How long a ``slow`` receiver holds each request before it answers: past
# the load's http timeout (PT10S), so the node gives up first.
SLOW = 30.0
# The environment variable that hands the run's signing secret to the
# receiver (never on its command line, where ``ps`` shows it).
SECRET_ENV = "CHAOS_RECEIVER_SECRET"
# The log's fields from the request's headers, by the header they come from.
HEADERS = {
    "schedule-id": "schedule_id",
    "fence-token": "fence_token",
    "attempt": "attempt",
    "execute-at": "execute_at",
    "webhook-id": "webhook_id",
}


def digest(body: bytes) -> str:
    """The body's digest, as the topic's reader takes a record value's."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def _signed(key: bytes, signatures: str, content: bytes) -> bool:
    """Whether one of the space separated ``v1,<base64>`` signatures is
    the HMAC-SHA256 of ``content`` under ``key`` (Standard Webhooks)."""
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    return any(
        version == "v1" and hmac.compare_digest(value, expected)
        for version, _, value in (s.partition(",") for s in signatures.split())
    )


def signatures_hold(key: bytes, headers: Mapping[str, str], body: bytes) -> bool:
    """Both signatures of a delivery hold: ``webhook-signature`` over
    ``{webhook-id}.{webhook-timestamp}.{body}`` and ``fence-signature`` over
    the same prefix and the fenced headers' values joined by ``.``."""
    prefix = f"{headers.get('webhook-id', '')}.{headers.get('webhook-timestamp', '')}.".encode()
    fenced = ".".join(headers.get(name, "") for name in FENCE_SIGNED).encode()
    return _signed(key, headers.get("webhook-signature", ""), prefix + body) and _signed(
        key, headers.get("fence-signature", ""), prefix + fenced
    )


class Endpoint:
    """The server's state: its mode and its log. ``key``: the HMAC key the
    signatures are checked with (None: not checked); ``sleep``: how a slow
    answer waits (injected, so a test need not)."""

    def __init__(
        self,
        log: IO[str],
        key: bytes | None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.log = log
        self.key = key
        self.sleep = sleep
        self.mode = "up"
        self.retry_after = 1

    async def control(self, request: web.Request) -> web.Response:
        data = await request.json()
        mode = data.get("mode")
        if mode not in MODES:
            return web.json_response({"error": f"mode must be one of {MODES}"}, status=400)
        self.mode = mode
        self.retry_after = int(data.get("retry_after", self.retry_after))
        return web.json_response({"mode": self.mode, "retry_after": self.retry_after})

    async def deliver(self, request: web.Request) -> web.Response:
        at = time.time()
        mode = self.mode  # the mode the request arrived in decides its answer
        body = await request.read()
        if mode == "slow":
            await self.sleep(SLOW)
        status = {"up": 200, "slow": 200, "503": 503, "400": 400}[mode]
        self._write(request, body, at, status)
        if status == 503:
            return web.Response(status=503, headers={"Retry-After": str(self.retry_after)})
        return web.Response(status=status)

    def _write(self, request: web.Request, body: bytes, at: float, status: int) -> None:
        headers = {name.lower(): value for name, value in request.headers.items()}
        line: dict[str, Any] = {
            "at": at,
            "answered": time.time(),
            "status": status,
            "method": request.method,
            "path": request.path,
            "digest": digest(body),
            "signed": None if self.key is None else signatures_hold(self.key, headers, body),
        }
        for header, key in HEADERS.items():
            line[key] = headers.get(header)
        self.log.write(json.dumps(line) + "\n")
        self.log.flush()


def application(endpoint: Endpoint) -> web.Application:
    """The control route, and every other path and method a delivery."""
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_put(CONTROL, endpoint.control)
    app.router.add_route("*", "/{tail:.*}", endpoint.deliver)
    return app


async def serve(host: str, port: int, log_path: Path, key: bytes | None) -> None:
    with log_path.open("a") as log:
        app = application(Endpoint(log, key))
        # A node that gives up on a slow answer closes its connection: the
        # request is still answered (and logged), as a real endpoint's
        # handler would run to its end.
        runner = web.AppRunner(app, handler_cancellation=False, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()


class Receiver:
    """The receiver process as the runner drives it: on ``host`` (where
    every node can reach it), on a port of its own that it keeps across
    restarts; its log of requests is ``receiver.jsonl`` in ``data_dir``,
    what it prints ``logs/receiver.log``. ``secret`` (``whsec_``): the one
    the nodes sign with."""

    def __init__(self, host: str, data_dir: Path, secret: str) -> None:
        self.host = host
        self.port = embedded.free_port(host)
        self.data_dir = data_dir
        self.log_path = data_dir / "receiver.jsonl"
        self.secret = secret
        self.process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, within: float = 30.0) -> None:
        argv = [
            sys.executable, "-m", "chaos.lab.receiver",
            "--host", self.host, "--port", str(self.port), "--log", str(self.log_path),
        ]  # fmt: skip
        env = {**os.environ, SECRET_ENV: self.secret}
        if self._output is None:
            (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
            self._output = (self.data_dir / "logs" / "receiver.log").open("ab")
        self.process = embedded.spawn(argv, log=self._output, env=env)
        embedded.wait_for_port(self.host, self.port, within, self.process)

    def mode(self, mode: str, retry_after: int = 1) -> None:
        """Answer every request from now as ``mode`` says (``MODES``)."""
        request = urllib.request.Request(
            self.url + CONTROL,
            data=json.dumps({"mode": mode, "retry_after": retry_after}).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5):
            pass

    def kill(self) -> None:
        """SIGKILL: the port closes at once, whatever was in flight."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        if self.process is not None:
            embedded.stop(self.process)
        if self._output is not None:
            self._output.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos.lab.receiver")
    add_version_flag(parser)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    secret = os.environ.get(SECRET_ENV)
    key = secret_key(secret) if secret else None
    asyncio.run(serve(args.host, args.port, args.log, key))


if __name__ == "__main__":
    main()
