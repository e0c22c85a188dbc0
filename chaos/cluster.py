"""A local cluster of real node processes on the embedded stack, for fault
injection: start, SIGKILL, SIGSTOP/SIGCONT and gracefully stop nodes while
the rest keep running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from node import embedded

HOST = "127.0.0.1"


@dataclass
class NodeProcess:
    name: str
    http_port: int
    gossip_port: int
    process: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.time)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class LocalCluster:
    def __init__(self, data_dir: Path, *, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = env or {}
        self.nodes: dict[str, NodeProcess] = {}
        self.mongo: subprocess.Popen[bytes] | None = None
        self.kafka: subprocess.Popen[bytes] | None = None
        self.mongo_port = 0
        self.kafka_port = 0
        self._logs: list[IO[bytes]] = []

    @property
    def mongo_uri(self) -> str:
        return embedded.mongo_uri(HOST, self.mongo_port)

    @property
    def kafka_bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    def _logfile(self, name: str) -> IO[bytes]:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        handle = (logs / f"{name}.log").open("ab")
        self._logs.append(handle)
        return handle

    def start_servers(self) -> None:
        self.mongo_port, self.kafka_port = embedded.free_port(HOST), embedded.free_port(HOST)
        self.mongo = embedded.spawn(
            embedded.mongo_argv(HOST, self.mongo_port, self.data_dir / "mongo"),
            log=self._logfile("mongodb"),
        )
        self.kafka = embedded.spawn(
            embedded.kafka_argv(HOST, self.kafka_port), log=self._logfile("kafka")
        )
        embedded.wait_for_port(HOST, self.mongo_port, 60, self.mongo)
        embedded.wait_for_port(HOST, self.kafka_port, 60, self.kafka)

    def crash_store(self, down_for: float) -> None:
        """SIGKILL the database (a crash: no clean shutdown, nothing flushed on
        the way out), keep it down ``down_for`` seconds, restart it on the
        same port and data."""
        assert self.mongo is not None
        self.mongo.send_signal(signal.SIGKILL)
        self.mongo.wait()
        time.sleep(down_for)
        self.mongo = embedded.spawn(
            embedded.mongo_argv(HOST, self.mongo_port, self.data_dir / "mongo"),
            log=self._logfile("mongodb"),
        )
        embedded.wait_for_port(HOST, self.mongo_port, 60, self.mongo)

    def pause_broker(self, down_for: float) -> None:
        """SIGSTOP Kafka for ``down_for`` seconds, then SIGCONT: connections
        hang and time out, as with a broker stalled or cut off."""
        assert self.kafka is not None
        self.kafka.send_signal(signal.SIGSTOP)
        try:
            time.sleep(down_for)
        finally:
            self.kafka.send_signal(signal.SIGCONT)

    def start_node(self, name: str) -> NodeProcess:
        http_port, gossip_port = embedded.free_port(HOST), embedded.free_port(HOST)
        seeds = ",".join(f"{HOST}:{n.gossip_port}" for n in self.nodes.values() if n.alive)
        argv = [
            sys.executable, "-m", "node", "run",
            "--node-id", name,
            "--http-bind", f"{HOST}:{http_port}",
            "--gossip-bind", f"{HOST}:{gossip_port}",
            "--advertise-host", HOST,
            "--seeds", seeds,
            "--mongo-uri", self.mongo_uri,
            "--kafka-bootstrap", self.kafka_bootstrap,
            "--log-format", "console",
        ]  # fmt: skip
        env = {"LOG_LEVEL": "info", **os.environ, **self.env}
        node = NodeProcess(
            name, http_port, gossip_port, embedded.spawn(argv, log=self._logfile(name), env=env)
        )
        self.nodes[name] = node
        return node

    def wait_ready(self, name: str, within: float = 90) -> None:
        node = self.nodes[name]
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if not node.alive:
                raise RuntimeError(f"{name} exited with {node.process.returncode}")
            with contextlib.suppress(OSError, ValueError):
                if get_json(node.url + "/readyz").get("ready"):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{name} not ready within {within:g} s")

    def cluster_view(self, name: str) -> dict[str, Any]:
        view: dict[str, Any] = get_json(self.nodes[name].url + "/v1/cluster")
        return view

    def settled(self, exclude: Collection[str] = ()) -> bool:
        """Every live node (but ``exclude``: paused ones) sees the same alive
        members, and every bucket is held by the member those views place it on."""
        live = [n for n in self.nodes.values() if n.alive and n.name not in exclude]
        try:
            views = [get_json(n.url + "/v1/cluster") for n in live]
            names = {n.name for n in live}
            for view in views:
                alive = {m["id"] for m in view["members"] if m["state"] == "alive"}
                if alive != names or not view["buckets"]["settled"]:
                    return False
            owners = views[0]["buckets"]["owners"]
        except (OSError, ValueError, KeyError, TypeError):  # down, or an error body
            return False
        return bool(owners) and all(o["owner"] == o["placed"] for o in owners)

    def describe(self) -> str:
        """Each live node's view, for the report when something does not settle."""
        lines = []
        for node in self.nodes.values():
            if not node.alive:
                lines.append(f"{node.name}: exited {node.process.returncode}")
                continue
            try:
                view = get_json(node.url + "/v1/cluster")
            except (OSError, ValueError) as exc:
                lines.append(f"{node.name}: no answer ({exc})")
                continue
            members = ", ".join(f"{m['id']}={m['state']}" for m in view["members"])
            b = view["buckets"]
            moving = sum(1 for o in b["owners"] if o["owner"] != o["placed"])
            lines.append(
                f"{node.name}: [{members}] held {b['held']} wanted {b['wanted']} "
                f"settled {b['settled']} buckets not yet with their placed owner {moving}"
            )
        return "\n".join(lines)

    def kill(self, name: str) -> None:
        self.nodes[name].process.send_signal(signal.SIGKILL)
        self.nodes[name].process.wait()

    def pause(self, name: str) -> None:
        """SIGSTOP: the process keeps its sockets and leases but runs nothing,
        like a long GC pause or a frozen VM (the zombie owner)."""
        self.nodes[name].process.send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.nodes[name].process.send_signal(signal.SIGCONT)

    def stop_node(self, name: str, grace: float = 30) -> int:
        return embedded.stop(self.nodes[name].process, timeout=grace)

    def close(self) -> None:
        for node in self.nodes.values():
            if node.alive:
                node.process.send_signal(signal.SIGCONT)  # a paused one cannot stop
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            embedded.stop(node.process, timeout=15)
        for server in (self.kafka, self.mongo):
            if server is not None:
                server.send_signal(signal.SIGCONT)  # a paused one cannot stop
                embedded.stop(server)
        for handle in self._logs:
            handle.close()


def get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        return json.load(exc)
