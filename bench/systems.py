"""The systems the delivery suite measures, behind one shape: start N
processes on given servers and database, load a workload's schedules, stop.

* ``Scheduler``: N node processes of this project, joined by gossip, the
  buckets split among them (environment overrides pick timing presets or
  switch history off);
* ``BaselinePoller`` and ``APScheduler4``: N worker processes of
  ``bench/baselines.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from bench import baselines
from bench.stack import Servers, insert
from chaos.lab.cluster import LocalCluster


@dataclass
class System:
    name: str = ""
    label: str = ""
    # Load before starting: APScheduler's loop sleeps until the next fire
    # time it knew at start, and is woken only by its own process's events.
    load_first: bool = False

    async def start(self, servers: Servers, database: str, processes: int) -> None:
        raise NotImplementedError

    async def load(self, servers: Servers, database: str, docs: list[dict[str, Any]]) -> None:
        async with servers.client() as client:
            await insert(client[database]["schedules"], docs)

    def pids(self) -> list[int]:
        raise NotImplementedError

    async def documents_read(self) -> float | None:
        """Documents the system's reads of due work returned so far, where it
        counts them (None: it does not)."""
        return None

    def stop(self) -> None:
        raise NotImplementedError


@dataclass
class Scheduler(System):
    name: str = "scheduler"
    label: str = "this scheduler"
    env: dict[str, str] = field(default_factory=dict)
    cluster: LocalCluster | None = None

    async def start(self, servers: Servers, database: str, processes: int) -> None:
        cluster = await self.start_nodes(servers, database, processes)
        # Started once every bucket is held where the views place it.
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(cluster.settled):
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not settle:\n" + cluster.describe())
            await asyncio.sleep(0.2)

    async def start_nodes(self, servers: Servers, database: str, processes: int) -> LocalCluster:
        """The node processes, one after the other, each seeded by the ones
        before (as a rollout does) and ready (serving, its servers answering)
        before the next starts; their buckets may still be on the move."""
        cluster = LocalCluster(
            servers.scratch / database,
            env={"LOG_LEVEL": "warning", **self.env},
            external=(servers.mongo_uri, servers.bootstrap),
        )
        cluster.database = database
        self.cluster = cluster
        for i in range(processes):
            cluster.start_node(f"node-{i}")
            await asyncio.to_thread(cluster.wait_ready, f"node-{i}")
        return cluster

    def pids(self) -> list[int]:
        assert self.cluster is not None
        return [n.process.pid for n in self.cluster.nodes.values()]

    async def documents_read(self) -> float | None:
        """scheduler_store_documents_read_total over every node, every query."""
        assert self.cluster is not None
        total = 0.0
        for node in self.cluster.nodes.values():
            text = await asyncio.to_thread(_get_text, node.url + "/metrics")
            total += sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("scheduler_store_documents_read_total{")
            )
        return total

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@dataclass
class Workers(System):
    """N processes of ``python -m bench.baselines KIND``."""

    kind: str = ""
    processes_: list[subprocess.Popen[str]] = field(default_factory=list)
    logs: list[IO[str]] = field(default_factory=list)

    async def start(self, servers: Servers, database: str, processes: int) -> None:
        logdir = servers.scratch / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        for i in range(processes):
            log = (logdir / f"{self.name}-{i}.log").open("a")
            self.logs.append(log)
            self.processes_.append(self._spawn(servers, database, f"{self.kind}-{i}", log))
        for process in self.processes_:
            line = await asyncio.to_thread(process.stdout.readline)  # type: ignore[union-attr]
            if line.strip() != "ready":
                raise RuntimeError(f"{self.name} worker did not start (exit {process.poll()})")

    def _spawn(
        self, servers: Servers, database: str, name: str, log: IO[str]
    ) -> subprocess.Popen[str]:
        argv = [
            sys.executable, "-m", "bench.baselines", self.kind,
            "--mongo-uri", servers.mongo_uri,
            "--database", database,
            "--bootstrap", servers.bootstrap,
            "--name", name,
        ]  # fmt: skip
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes_]

    def stop(self) -> None:
        for process in self.processes_:
            if process.poll() is None:
                process.terminate()
        for process in self.processes_:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self.logs:
            log.close()
        self.processes_, self.logs = [], []


@dataclass
class BaselinePoller(Workers):
    async def load(self, servers: Servers, database: str, docs: list[dict[str, Any]]) -> None:
        async with servers.client() as client:
            await baselines.prepare_pollers(client[database]["schedules"])
        await super().load(servers, database, docs)


@dataclass
class APScheduler4(Workers):
    name: str = "apscheduler"
    label: str = "APScheduler 4.0.0a6, MongoDB data store"
    kind: str = "apscheduler"
    load_first: bool = True

    async def load(self, servers: Servers, database: str, docs: list[dict[str, Any]]) -> None:
        await baselines.load_apscheduler(servers.mongo_uri, database, docs)


def find_one_and_update_poller() -> BaselinePoller:
    return BaselinePoller(
        name="fua", label="findOneAndUpdate poller (one document per claim)", kind="fua"
    )


def fetch_poller() -> BaselinePoller:
    return BaselinePoller(
        name="fetch", label="fetch poller (db-scheduler: batch read, claim each)", kind="fetch"
    )


BASELINES: dict[str, Callable[[], System]] = {
    "fetch": fetch_poller,
    "fua": find_one_and_update_poller,
    "apscheduler": APScheduler4,
}
