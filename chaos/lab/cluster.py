"""A local cluster of real node processes on the embedded stack, for fault
injection: start, SIGKILL, SIGSTOP/SIGCONT and gracefully stop nodes while
the rest keep running, and cut the network between them.

With ``network`` (``chaos/lab/network.py``) each node runs in its own network
namespace and a partition is a cut link; the database and the broker listen
on addresses of their own on the bridge, so a node can lose just one of
them. Without, every node is on loopback and a partition is the nodes'
chaos-mode gossip filter (``PUT /v1/chaos/partition``, needs
``CHAOS_MODE=on``): gossip is cut, the links to the database and the broker
are not, and a node cannot lose just one server.

With ``auth`` the nodes run with AUTH=on and every call but the probes and
the metrics carries ``api_key`` (an admin tenant's, which the operator
routes need); ``env`` holds what every node gets, CLUSTER_KEYS included."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
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

from chaos.lab import objectstore
from chaos.lab.network import NODE_GOSSIP_PORT, NODE_HTTP_PORT, Namespaces
from node.ops import embedded

HOST = "127.0.0.1"


@dataclass
class NodeProcess:
    name: str
    host: str
    http_port: int
    gossip_port: int
    process: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.time)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def gossip_address(self) -> str:
        return f"{self.host}:{self.gossip_port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class ExternalServers(RuntimeError):
    """A server fault asked of servers this cluster did not start."""


class NoNamespaces(RuntimeError):
    """A fault that needs network namespaces, asked of a cluster without them."""


class LocalCluster:
    def __init__(
        self,
        data_dir: Path,
        *,
        env: dict[str, str] | None = None,
        network: Namespaces | None = None,
        external: tuple[str, str] | None = None,
        durable_broker: bool = False,
        auth: bool = False,
    ) -> None:
        self.data_dir = data_dir
        # Tansu over a disk-backed S3 store instead of memory, so the broker
        # can crash without losing records (chaos/lab/objectstore.py).
        self.durable_broker = durable_broker
        self.objectstore: subprocess.Popen[bytes] | None = None
        self._kafka_env: dict[str, str] | None = None
        self.env = dict(env or {})
        # Nodes refuse to gossip unsigned unless told (GOSSIP_UNSIGNED): a
        # cluster whose caller chose neither signs with a key of its own.
        if not self.env.get("CLUSTER_KEYS") and self.env.get("GOSSIP_UNSIGNED") != "on":
            self.env["CLUSTER_KEYS"] = base64.b64encode(secrets.token_bytes(32)).decode()
        # The load is one tenant doing the work of many (tens of calls a
        # second, and every verb's outcome read back after the run): it gets
        # the read budget such a tenant would be given (tenants set
        # --read-budget), unless the caller chose one.
        self.env.setdefault("READ_BUDGET", "10")
        self.network = network
        # (MongoDB URI, Kafka bootstrap) of servers someone else runs: nothing
        # to start, crash or pause, and a database of this run's own.
        self.external = external
        self.database = f"chaos-{os.getpid()}-{int(time.time())}"
        # The servers listen where every node can reach them: the bridge,
        # each on an address of its own (a node can be cut from one).
        self.store_host = network.store_host if network else HOST
        self.broker_host = network.broker_host if network else HOST
        self.auth = auth
        # An admin tenant's key (the operator routes need one), set by
        # whoever created it once the database runs; None with auth off.
        self.api_key: str | None = None
        self.nodes: dict[str, NodeProcess] = {}
        self._splits: list[list[tuple[str, str]]] = []  # routes of each split in force
        self.mongo: subprocess.Popen[bytes] | None = None
        self.kafka: subprocess.Popen[bytes] | None = None
        self.mongo_port = 0
        self.kafka_port = 0
        self._logs: list[IO[bytes]] = []

    @property
    def mongo_uri(self) -> str:
        if self.external:
            return self.external[0]
        return embedded.mongo_uri(self.store_host, self.mongo_port)

    @property
    def kafka_bootstrap(self) -> str:
        if self.external:
            return self.external[1]
        return f"{self.broker_host}:{self.kafka_port}"

    def _embedded(self, fault: str) -> None:
        if self.external:
            raise ExternalServers(f"cannot {fault}: the servers are external")

    def _logfile(self, name: str) -> IO[bytes]:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        handle = (logs / f"{name}.log").open("ab")
        self._logs.append(handle)
        return handle

    def start_servers(self) -> None:
        if self.external:
            return
        self.mongo_port = embedded.free_port(self.store_host)
        self.kafka_port = embedded.free_port(self.broker_host)
        self._spawn_mongo()  # waited for after the broker: both start at once
        if self.durable_broker:
            self.objectstore, s3_port = objectstore.start(
                self.data_dir / "s3", self._logfile("objectstore")
            )
            self._kafka_env = {**os.environ, **objectstore.broker_env(s3_port)}
        self._spawn_kafka()
        embedded.wait_for_port(self.store_host, self.mongo_port, 60, self.mongo)

    def _spawn_mongo(self) -> None:
        self.mongo = embedded.spawn(
            embedded.mongo_argv(self.store_host, self.mongo_port, self.data_dir / "mongo"),
            log=self._logfile("mongodb"),
        )

    @staticmethod
    def _crash(server: subprocess.Popen[bytes] | None, down_for: float) -> None:
        """SIGKILL (no clean shutdown, nothing flushed on the way out), then
        stay down ``down_for`` seconds."""
        assert server is not None
        server.send_signal(signal.SIGKILL)
        server.wait()
        time.sleep(down_for)

    def _spawn_kafka(self) -> None:
        argv = embedded.kafka_argv(self.broker_host, self.kafka_port)
        if self.durable_broker:
            argv += ["--storage-engine", objectstore.STORAGE_URL]
        self.kafka = embedded.spawn(argv, log=self._logfile("kafka"), env=self._kafka_env)
        embedded.wait_for_port(self.broker_host, self.kafka_port, 60, self.kafka)

    def crash_broker(self, down_for: float) -> None:
        """SIGKILL Kafka, keep it down ``down_for`` seconds, restart it on the
        same port and storage. Only with a durable broker: from memory, the
        records it had acknowledged would be gone."""
        self._embedded("crash the broker")
        self._crash(self.kafka, down_for)
        self._spawn_kafka()

    def crash_store(self, down_for: float) -> None:
        """SIGKILL the database, keep it down ``down_for`` seconds, restart it
        on the same port and data."""
        self._embedded("crash the store")
        self._crash(self.mongo, down_for)
        self._spawn_mongo()
        embedded.wait_for_port(self.store_host, self.mongo_port, 60, self.mongo)

    def pause_broker(self, down_for: float) -> None:
        """SIGSTOP Kafka for ``down_for`` seconds, then SIGCONT: connections
        hang and time out, as with a broker stalled or cut off."""
        self._embedded("pause the broker")
        assert self.kafka is not None
        self.kafka.send_signal(signal.SIGSTOP)
        try:
            time.sleep(down_for)
        finally:
            self.kafka.send_signal(signal.SIGCONT)

    @property
    def headers(self) -> dict[str, str]:
        """What every call but the probes and the metrics carries."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start_node(self, name: str, env: dict[str, str] | None = None) -> NodeProcess:
        """``env``: this start's own settings over the cluster's (a later
        start of the same name goes without them)."""
        if self.network is not None:
            host, http_port, gossip_port = self.network.add(name), NODE_HTTP_PORT, NODE_GOSSIP_PORT
        else:
            host, http_port, gossip_port = HOST, embedded.free_port(HOST), embedded.free_port(HOST)
        seeds = ",".join(n.gossip_address for n in self.nodes.values() if n.alive)
        argv = [
            sys.executable, "-m", "node", "run",
            "--node-id", name,
            "--http-bind", f"{host}:{http_port}",
            "--gossip-bind", f"{host}:{gossip_port}",
            "--advertise-host", host,
            "--seeds", seeds,
            "--mongo-uri", self.mongo_uri,
            "--mongo-database", self.database,
            "--kafka-bootstrap", self.kafka_bootstrap,
            "--auth", "on" if self.auth else "off",
        ]  # fmt: skip
        # Readable logs unless the caller asks for production's (a bench
        # measuring what the JSON stream costs).
        env = {
            "LOG_LEVEL": "info",
            **os.environ,
            "LOG_FORMAT": "console",
            **self.env,
            **(env or {}),
        }
        if self.network is not None:
            argv = self.network.wrap(name, argv)
        process = embedded.spawn(argv, log=self._logfile(name), env=env)
        node = NodeProcess(name, host, http_port, gossip_port, process)
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
        view: dict[str, Any] = get_json(self.nodes[name].url + "/v1/cluster", self.headers)
        return view

    def readiness(self, name: str) -> dict[str, Any]:
        """The node's /readyz answer (200 or 503, the same shape)."""
        answer: dict[str, Any] = get_json(self.nodes[name].url + "/readyz")
        return answer

    def metrics(self, name: str) -> str:
        """The node's /metrics page (open to anyone, auth or not)."""
        with urllib.request.urlopen(self.nodes[name].url + "/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def settled(self, exclude: Collection[str] = (), unplaced: Collection[str] = ()) -> bool:
        """Every live node (but ``exclude``: paused or cut-off ones, which
        their peers must come to see as gone) sees the same alive members,
        and every bucket is held by the member those views place it on.

        ``unplaced``: live nodes that cannot work buckets (cut from the
        database): not asked (their view reads the database), but still
        members (gossip reaches them), and settled only once no bucket is
        placed on, or held by, any of them."""
        live = [n for n in self.nodes.values() if n.alive and n.name not in exclude]
        asked = [n for n in live if n.name not in unplaced]
        if not asked:
            return False
        try:
            views = [get_json(n.url + "/v1/cluster", self.headers) for n in asked]
            names = {n.name for n in live}
            if not all(_agrees(view, names) for view in views):
                return False
            owners = views[0]["buckets"]["owners"]
        except (OSError, ValueError, KeyError, TypeError):  # down, or an error body
            return False
        return _held_as_placed(owners, unplaced)

    def describe(self) -> str:
        """Each live node's view, for the report when something does not settle."""
        lines = []
        for node in self.nodes.values():
            if not node.alive:
                lines.append(f"{node.name}: exited {node.process.returncode}")
                continue
            try:
                view = get_json(node.url + "/v1/cluster", self.headers)
            except (OSError, ValueError) as exc:
                lines.append(f"{node.name}: no answer ({exc})")
                continue
            if "members" not in view:  # an error body
                lines.append(f"{node.name}: {json.dumps(view)[:200]}")
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

    # -- partitions -------------------------------------------------------------------

    @property
    def partition_kind(self) -> str:
        if self.network is not None:
            return self.network.kind + ": a partition cuts links"
        return (
            "in-process gossip filter: gossip is cut, links to the database and the broker are not"
        )

    def partition(self, groups: list[set[str]], *, isolate: str | None = None) -> list[str]:
        """Cut every path between nodes of different groups. ``isolate``: cut
        that node off everything instead (its link goes down). Returns the
        nodes the gossip filter could not be set on (paused, or starting):
        the others' filters still cut their side of each path. With network
        namespaces ``heal_partition`` undoes just this partition (given the
        isolated node, if any); the gossip filter only heals as a whole."""
        if self.network is not None:
            if isolate is not None:
                self.network.isolate(isolate)
            else:
                self._splits.append(self.network.split(groups))
            return []
        side = {name: i for i, group in enumerate(groups) for name in group}
        unreached = []
        for node in self.nodes.values():
            if node.alive and node.name in side:
                blocked = [
                    other.gossip_address
                    for other in self.nodes.values()
                    if other.name in side and side[other.name] != side[node.name]
                ]
                if not self._block_gossip(node, blocked):
                    unreached.append(node.name)
        return unreached

    def heal(self) -> list[str]:
        if self.network is not None:
            self.network.heal()
            self._splits.clear()
            return []
        return [n.name for n in self.nodes.values() if n.alive and not self._block_gossip(n, [])]

    def heal_partition(self, *, isolate: str | None = None) -> list[str]:
        """Undo one partition: the isolation of ``isolate``, else the oldest
        split still in force. The gossip filter has no such thing: it heals
        everything (so partitions in a filtered run should not overlap)."""
        if self.network is None:
            return self.heal()
        if isolate is not None:
            self.network.reconnect(isolate)
        elif self._splits:
            self.network.uncut(self._splits.pop(0))
        return []

    def cut_server(self, name: str, server: str) -> list[tuple[str, str]]:
        """The node loses only the database (``server`` "store") or only the
        broker ("broker"); ``uncut`` with the result restores it. Needs
        network namespaces and servers of this cluster's own."""
        self._embedded(f"cut a node from the {server}")
        if self.network is None:
            raise NoNamespaces(f"cannot cut a node from the {server}: no network namespaces")
        return self.network.cut_server(name, server)

    def uncut(self, routes: list[tuple[str, str]]) -> None:
        if self.network is not None:
            self.network.uncut(routes)

    def _block_gossip(self, node: NodeProcess, addresses: list[str]) -> bool:
        request = urllib.request.Request(
            node.url + "/v1/chaos/partition",
            data=json.dumps({"blocked": addresses}).encode(),
            method="PUT",
            headers={"Content-Type": "application/json", **self.headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=2):
                return True
        except OSError:  # paused, or not listening yet
            return False

    def stop_node(self, name: str, grace: float = 30) -> int:
        return embedded.stop(self.nodes[name].process, timeout=grace)

    def close(self) -> None:
        for node in self.nodes.values():
            if node.alive:
                node.process.send_signal(signal.SIGCONT)  # a paused one cannot stop
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            embedded.stop(node.process, timeout=15)
        # The run is over and read: the servers' data goes with the scratch folder.
        for server in (self.kafka, self.mongo, self.objectstore):
            if server is not None:
                embedded.discard(server)
        for handle in self._logs:
            handle.close()
        if self.network is not None:
            self.network.close()


def _agrees(view: dict[str, Any], names: set[str]) -> bool:
    """A node's view counts exactly ``names`` alive and its buckets settled."""
    alive = {m["id"] for m in view["members"] if m["state"] == "alive"}
    return alive == names and bool(view["buckets"]["settled"])


def _held_as_placed(owners: list[dict[str, Any]], unplaced: Collection[str]) -> bool:
    """Every bucket is held by the member it is placed on, and none is placed
    on a node that cannot work it."""
    return (
        bool(owners)
        and all(o["owner"] == o["placed"] for o in owners)
        and not any(o["placed"] in unplaced for o in owners)
    )


def get_json(url: str, headers: dict[str, str] | None = None) -> Any:
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        return json.load(exc)
