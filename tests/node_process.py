"""A node as production runs it: ``python -m node run`` in a process of its
own, its stderr kept whole, so a test can read every byte the node wrote."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from node.ops import embedded
from tests.conftest import HOST, TEST_CLUSTER_KEY, wait_until


class NodeProcess:
    def __init__(self, stderr_path: Path, **environment: str) -> None:
        self.port = embedded.free_port(HOST)
        self.stderr_path = stderr_path
        self.environment = {
            **os.environ,
            "NODE_ID": "proc-a",
            "CLUSTER_KEYS": TEST_CLUSTER_KEY,
            "HTTP_BIND": f"{HOST}:{self.port}",
            "GOSSIP_BIND": f"{HOST}:{embedded.free_port(HOST)}",
            "ADVERTISE_HOST": HOST,
            "BUCKETS": "16",
            "AUTH": "off",
            "LOG_FORMAT": "json",
            "LOG_LEVEL": "info",
            **environment,
        }
        self.process: asyncio.subprocess.Process | None = None
        self._stderr: Any = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def start(self) -> None:
        self._stderr = self.stderr_path.open("wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "node",
            "run",
            env=self.environment,
            stdout=self._stderr,
            stderr=self._stderr,
        )

    async def wait_ready(self, session: aiohttp.ClientSession, within: float = 60.0) -> None:
        async def ready() -> bool:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(self.url + "/readyz") as response:
                    return response.status == 200
            return False

        await wait_until(ready, within, "the node to be ready")

    async def stop(self) -> int:
        """SIGTERM, as an orchestrator stops a pod; the exit code."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.process.wait(), 60)
        except TimeoutError:
            self.process.kill()
            code = await self.process.wait()
        self._stderr.close()
        return code

    def text(self) -> str:
        return self.stderr_path.read_bytes().decode("utf-8", errors="replace")

    def lines(self) -> list[dict[str, Any]]:
        """Every line written, parsed as JSON (a line that is not raises)."""
        return [json.loads(line) for line in self.text().splitlines()]

    def events(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == event]
