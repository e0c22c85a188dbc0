"""``python -m node dev``: the embedded stack on one machine.

Starts SecantusDB (on disk under the data dir, so schedules survive a
restart of the stack), the Tansu broker (in memory) and N node processes,
waits until every node answers /readyz, prints one line per service, and
stops every child on Ctrl-C or SIGTERM: nodes first (graceful leave), then
the broker, then the database.

The database and the broker run in sessions of their own: a terminal's
Ctrl-C (SIGINT to its foreground process group) reaches this process and
the nodes, not them, so the nodes hand their leases over and flush while
both still answer, and only then are they stopped. Every child gets SIGTERM
when this process dies, however it dies (``embedded.spawn``).

Gossip is signed: unless ``CLUSTER_KEYS`` is set in the environment (empty
turns signing off), every start generates a random 32-byte key and hands it
to every node, so nothing else on the machine can speak to the cluster's
gossip ports (issue 17: one forged packet could deafen a node).

HTTP deliveries: the nodes may call 127.0.0.0/8 (``HTTP_TARGETS_ALLOW``,
unless the environment sets it) and nothing else that is not public, and
sign with ``HTTP_SIGNING_SECRET``: the environment's, else one made for
this run and printed, so a local receiver can verify what it gets.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from node.ops import embedded
from node.schedule.webhook import new_secret

READY_TIMEOUT = 90.0
# Shown with a child's early exit, so the cause is on the screen, not only in its log.
LOG_TAIL_LINES = 8
CLUSTER_KEY_BYTES = 32
# What a local stack's nodes may call besides public addresses: this machine.
DEV_TARGETS_ALLOW = "127.0.0.0/8"


def cluster_keys(environ: Mapping[str, str]) -> tuple[str, str]:
    """(CLUSTER_KEYS for the nodes, how gossip is signed): the user's when
    set, even empty; else a random key for this run of the stack only."""
    if "CLUSTER_KEYS" in environ:
        keys = environ["CLUSTER_KEYS"]
        if not keys.strip():
            return keys, "unsigned (CLUSTER_KEYS is set, and empty)"
        return keys, "signed with CLUSTER_KEYS from the environment"
    key = base64.b64encode(secrets.token_bytes(CLUSTER_KEY_BYTES)).decode("ascii")
    return key, "signed with a key generated for this run"


@dataclass(frozen=True, kw_only=True)
class DevOptions:
    nodes: int = 3
    http_port: int = 8080
    gossip_port: int = 7946
    mongo_port: int = 27017
    kafka_port: int = 9092
    data_dir: Path = Path("dev-data")
    host: str = "127.0.0.1"
    database: str = "scheduler"


@dataclass
class Child:
    name: str
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path


class DevStack:
    def __init__(
        self,
        options: DevOptions,
        out: IO[str] = sys.stdout,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.options = options
        self.out = out
        self.children: list[Child] = []
        self.stop_requested = threading.Event()
        self._log_files: list[IO[bytes]] = []
        self.environ = dict(os.environ if environ is None else environ)
        # Never printed or logged: describe() says only where it came from.
        self._cluster_keys, self.signing = cluster_keys(self.environ)
        # Printed: a receiver on this machine needs it to verify deliveries.
        self.signing_secret = self.environ.get("HTTP_SIGNING_SECRET") or new_secret()
        self.secret_origin = (
            "from the environment" if "HTTP_SIGNING_SECRET" in self.environ else "made for this run"
        )

    def node_environment(self) -> dict[str, str]:
        """What each node runs with: ours, plus the cluster key(s). A user who
        set CLUSTER_KEYS empty asked for unsigned gossip, which a node runs
        only when told so (GOSSIP_UNSIGNED)."""
        env = {
            "HTTP_TARGETS_ALLOW": DEV_TARGETS_ALLOW,
            **self.environ,
            "CLUSTER_KEYS": self._cluster_keys,
            "HTTP_SIGNING_SECRET": self.signing_secret,
        }
        if not self._cluster_keys.strip():
            env["GOSSIP_UNSIGNED"] = "on"
        return env

    def taken_ports(self) -> list[str]:
        o = self.options
        wanted: list[tuple[str, int, socket.SocketKind]] = [
            ("MongoDB (--mongo-port)", o.mongo_port, socket.SOCK_STREAM),
            ("Kafka (--kafka-port)", o.kafka_port, socket.SOCK_STREAM),
        ]
        for i in range(o.nodes):
            wanted.append((f"node-{i + 1} HTTP (--http-port)", o.http_port + i, socket.SOCK_STREAM))
            wanted.append(
                (f"node-{i + 1} gossip (--gossip-port)", o.gossip_port + i, socket.SOCK_DGRAM)
            )
        problems: list[str] = []
        claimed: dict[tuple[int, socket.SocketKind], str] = {}
        for what, port, kind in wanted:
            if (port, kind) in claimed:
                problems.append(f"port {port} is asked for both {claimed[port, kind]} and {what}")
                continue
            claimed[port, kind] = what
            if embedded.port_taken(o.host, port, kind):
                problems.append(f"port {port} for {what} is already in use")
        return problems

    def _log(self, name: str) -> tuple[IO[bytes], Path]:
        logs = self.options.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"{name}.log"
        handle = path.open("ab")
        self._log_files.append(handle)
        return handle, path

    @staticmethod
    def _exited(child: Child) -> str:
        return f"{child.name} exited with {child.process.returncode} (log: {child.log_path})"

    @staticmethod
    def _log_tail(child: Child) -> str:
        """The last lines of a child's log, indented, one per line: the cause
        of an early exit belongs on the screen, not only in the log."""
        with contextlib.suppress(OSError):
            lines = child.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            return "".join(f"\n    {line}" for line in lines)
        return ""

    def _spawn(
        self,
        name: str,
        address: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        *,
        own_session: bool = False,
    ) -> Child:
        handle, path = self._log(name)
        process = embedded.spawn(argv, log=handle, env=env, own_session=own_session)
        child = Child(name, address, process, path)
        self.children.append(child)
        return child

    def start(self) -> None:
        o = self.options
        o.data_dir.mkdir(parents=True, exist_ok=True)
        mongo_uri = embedded.mongo_uri(o.host, o.mongo_port)
        mongo = self._spawn(
            "mongodb",
            mongo_uri,
            embedded.mongo_argv(o.host, o.mongo_port, o.data_dir / "mongo"),
            own_session=True,
        )
        kafka_address = f"{o.host}:{o.kafka_port}"
        kafka = self._spawn(
            "kafka",
            kafka_address,
            embedded.kafka_argv(o.host, o.kafka_port),
            env=embedded.kafka_environment(self.environ),
            own_session=True,
        )
        self._wait_port(mongo, o.mongo_port)
        self._wait_port(kafka, o.kafka_port)
        gossip = [f"{o.host}:{o.gossip_port + i}" for i in range(o.nodes)]
        nodes = []
        for i in range(o.nodes):
            name = f"node-{i + 1}"
            argv = [
                sys.executable, "-m", "node", "run",
                "--node-id", name,
                "--http-bind", f"{o.host}:{o.http_port + i}",
                "--gossip-bind", gossip[i],
                "--advertise-host", o.host,
                "--seeds", ",".join(g for g in gossip if g != gossip[i]),
                "--mongo-uri", mongo_uri,
                "--mongo-database", o.database,
                "--kafka-bootstrap", kafka_address,
                "--log-format", "console",
                "--auth", "off",  # a laptop's stack: no keys (docs/api.md, "Tenants")
            ]  # fmt: skip
            nodes.append(
                self._spawn(
                    name, f"http://{o.host}:{o.http_port + i}", argv, env=self.node_environment()
                )
            )
        for child in nodes:
            self._wait_ready(child)

    def _wait_port(self, child: Child, port: int) -> None:
        try:
            embedded.wait_for_port(self.options.host, port, READY_TIMEOUT, child.process)
        except embedded.EmbeddedError as exc:
            raise embedded.EmbeddedError(f"{child.name}: {exc} (log: {child.log_path})") from None

    def _wait_ready(self, child: Child) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            if child.process.poll() is not None:
                raise embedded.EmbeddedError(self._exited(child) + self._log_tail(child))
            with (
                contextlib.suppress(OSError, urllib.error.URLError, ValueError),
                urllib.request.urlopen(f"{child.address}/readyz", timeout=2) as response,
            ):
                if json.load(response).get("ready"):
                    return
            time.sleep(0.1)
        if not self.stop_requested.is_set():
            raise embedded.EmbeddedError(
                f"{child.name} was not ready within {READY_TIMEOUT:g} s (log: {child.log_path})"
            )

    def describe(self) -> str:
        o = self.options
        lines = []
        for child in self.children:
            extra = ""
            if child.name == "mongodb":
                extra = f"  data {o.data_dir / 'mongo'}"
            elif child.name.startswith("node-"):
                index = int(child.name.split("-")[1]) - 1
                extra = f"  gossip {o.host}:{o.gossip_port + index}"
            lines.append(f"{child.name:<8} {child.address}{extra}  pid {child.process.pid}")
        lines.append(f"gossip   {self.signing}")
        allow = self.node_environment()["HTTP_TARGETS_ALLOW"] or "public addresses only"
        lines.append(f"http     targets may reach {allow}")
        lines.append(f"signing  HTTP_SIGNING_SECRET={self.signing_secret}  ({self.secret_origin})")
        lines.append(f"logs     {o.data_dir / 'logs'}")
        return "\n".join(lines)

    def wait(self, err: IO[str] = sys.stderr) -> str | None:
        """Block until a stop is requested (None) or the database or broker dies
        (what to print: which, why, and its log's last lines).

        A node that exits is reported and the rest keep running, so a user
        can kill one on purpose and watch its buckets move to another.
        """
        reported: set[str] = set()
        while not self.stop_requested.wait(0.2):
            for child in self.children:
                if child.process.poll() is None or child.name in reported:
                    continue
                if not child.name.startswith("node-"):
                    return f"{self._exited(child)}; stopping everything{self._log_tail(child)}"
                reported.add(child.name)
                print(
                    f"dev: {self._exited(child)}; the other nodes keep running"
                    + self._log_tail(child),
                    file=err,
                    flush=True,
                )
        return None

    def stop(self) -> None:
        nodes = [c for c in self.children if c.name.startswith("node-")]
        servers = [c for c in self.children if not c.name.startswith("node-")]
        for child in nodes:  # graceful leave, all at once
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        for child in nodes:
            embedded.stop(child.process, timeout=15)
        for child in reversed(servers):
            embedded.stop(child.process, timeout=15)
        for handle in self._log_files:
            handle.close()


def run_dev(options: DevOptions, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> int:
    stack = DevStack(options, out)
    taken = stack.taken_ports()
    if taken:
        for line in taken:
            print(f"dev: {line}", file=err)
        print("dev: choose other ports with the flags named above", file=err)
        return 1

    def request_stop(signum: int, _frame: object) -> None:
        stack.stop_requested.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        print(f"dev: starting MongoDB, Kafka and {options.nodes} nodes ...", file=out, flush=True)
        stack.start()
        if stack.stop_requested.is_set():
            return 0
        print(stack.describe(), file=out, flush=True)
        print("dev: ready. Ctrl-C stops everything.", file=out, flush=True)
        failure = stack.wait(err)
        if failure:
            print(f"dev: {failure}", file=err, flush=True)
            return 1
        return 0
    except embedded.EmbeddedError as exc:
        print(f"dev: {exc}", file=err, flush=True)
        return 1
    finally:
        print("dev: stopping ...", file=out, flush=True)
        stack.stop()
        print("dev: stopped", file=out, flush=True)
