"""``python -m node dev`` as a user runs it: a real process tree."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from node import config as node_config
from node.ops import embedded
from node.ops.devstack import DevOptions, DevStack
from ring import bucket_for
from tests.conftest import TopicReader, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.servers]


def consecutive_free_ports(count: int, kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    return embedded.consecutive_free_ports(count, (kind,))


class DevProcess:
    def __init__(
        self, args: list[str], env: dict[str, str] | None = None, *, terminal: bool = False
    ) -> None:
        # terminal: in a process group of its own, as a shell runs a command
        # in the foreground, so a test can send the group what Ctrl-C sends.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "node", "dev", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=terminal,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def read_until(self, marker: str, within: float = 120) -> list[str]:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.output.append(line)
            if marker in line:
                return self.output
        raise AssertionError(f"no {marker!r} in dev output:\n" + "\n".join(self.output))


def http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.load(response)


ANSI = re.compile(r"\x1b\[[0-9;]*m")
# structlog's console renderer: "[error    ]".
CONSOLE_LEVEL = re.compile(r"\[(error|critical|exception)\s*\]")
# The standard library's, Tansu's (tracing) and SecantusDB's level words.
LEVEL_WORD = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b")


def error_lines(text: str) -> list[str]:
    """The lines of a log at error level or above, whatever wrote them: a
    JSON line's "level", a console line's level marker or word, and a
    traceback."""
    found = []
    for raw in text.splitlines():
        line = ANSI.sub("", raw).strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    if str(record.get("level", "")).lower() in {"error", "critical", "exception"}:
                        found.append(line)
                    continue
        if line.startswith("Traceback") or CONSOLE_LEVEL.search(line) or LEVEL_WORD.search(line):
            found.append(line)
    return found


def dev_logs(data_dir: Path) -> dict[str, str]:
    """Every log the dev stack wrote under its data dir, by file name."""
    return {path.name: path.read_text(errors="replace") for path in (data_dir / "logs").iterdir()}


async def settled(http_port: int, nodes: int) -> bool:
    """Every node sees every node alive, and holds every bucket its placement
    gives it, and every bucket is held where it is placed."""
    names = {f"node-{i + 1}" for i in range(nodes)}
    for i in range(nodes):
        with contextlib.suppress(OSError, ValueError):
            _, view = http("GET", f"http://127.0.0.1:{http_port + i}/v1/cluster")
            alive = {m["id"] for m in view["members"] if m["state"] == "alive"}
            buckets, owners = view["buckets"], view["buckets"]["owners"]
            if (
                alive == names
                and buckets["settled"]
                and buckets["held"] == buckets["wanted"] > 0
                and all(o["owner"] == o["placed"] for o in owners)
                and {o["owner"] for o in owners} == names
            ):
                continue
        return False
    return True


def child_pids(output: list[str]) -> dict[str, int]:
    """The pid of each child the dev stack printed: mongodb, kafka, node-N."""
    return {
        line.split()[0]: int(m.group(1))
        for line in output
        if (m := re.search(r"  pid (\d+)", line))
    }


def exit_order(pids: dict[str, int], within: float = 90) -> list[set[str]]:
    """Wait for every process in ``pids`` to exit (each a pidfd, readable
    once it has); the names in the order seen, those seen at one wake-up
    together."""
    fds = {os.pidfd_open(pid): name for name, pid in pids.items()}
    order: list[set[str]] = []
    deadline = time.monotonic() + within
    try:
        while len(fds) > sum(len(seen) for seen in order):
            waiting = [fd for fd, name in fds.items() if not any(name in s for s in order)]
            ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"still running after {within:g} s: {waiting}")
            order.append({fds[fd] for fd in ready})
    finally:
        for fd in fds:
            os.close(fd)
    return order


def dev_args(nodes: int, http_port: int, kafka_port: int, data_dir: Path) -> list[str]:
    return [
        "--nodes",
        str(nodes),
        "--http-port",
        str(http_port),
        "--gossip-port",
        str(consecutive_free_ports(nodes, socket.SOCK_DGRAM)),
        "--mongo-port",
        str(embedded.free_port()),
        "--kafka-port",
        str(kafka_port),
        "--data-dir",
        str(data_dir),
    ]


async def test_dev_stack_delivers_and_stops_every_child(tmp_path: Path) -> None:
    http_port, kafka_port = consecutive_free_ports(2), embedded.free_port()
    dev = DevProcess(dev_args(2, http_port, kafka_port, tmp_path / "data"))
    try:
        output = dev.read_until("dev: ready")
        pids = [int(m.group(1)) for line in output if (m := re.search(r"pid (\d+)", line))]
        assert len(pids) == 4  # mongodb, kafka, node-1, node-2
        assert any(line.startswith("node-2 ") and str(http_port + 1) in line for line in output)

        execute_at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat().replace("+00:00", "Z")
        status, _ = http(
            "POST",
            f"http://127.0.0.1:{http_port + 1}/v1/schedules",
            {"id": "dev-1", "topic": "dev-topic", "executeAt": execute_at, "payload": {"a": 1}},
        )
        assert status == 201
        async with TopicReader(f"127.0.0.1:{kafka_port}", "dev-topic") as reader:
            [record] = await reader.wait_for(1, within=60)
        assert record.key == b"dev-1"
        assert record.value == b'{"a":1}'
        assert dict(record.headers)["schedule-id"] == b"dev-1"

        async def delivered() -> bool:
            _, body = http("GET", f"http://127.0.0.1:{http_port}/v1/schedules/dev-1")
            return bool(body["status"] == "DELIVERED")

        await wait_until(delivered, what="DELIVERED seen from the other node")

        # The two nodes split the buckets; kill -9 node-2: node-1 takes its
        # buckets once their leases expire, and the stack keeps running.
        async def split() -> bool:
            _, view = http("GET", f"http://127.0.0.1:{http_port}/v1/cluster")
            owners = {o["owner"] for o in view["buckets"]["owners"]}
            return bool(view["buckets"]["settled"]) and owners == {"node-1", "node-2"}

        await wait_until(split, within=90, what="the two nodes to split the buckets")
        _, view = http("GET", f"http://127.0.0.1:{http_port}/v1/cluster")
        assert {m["id"]: m["state"] for m in view["members"]} == {
            "node-1": "alive",
            "node-2": "alive",
        }
        owner_of = {o["bucket"]: o["owner"] for o in view["buckets"]["owners"]}
        # A schedule in one of node-2's buckets, to be delivered by node-1.
        orphan = next(
            f"dev-2-{i}"
            for i in range(10_000)
            if owner_of[bucket_for(f"dev-2-{i}", 256)] == "node-2"
        )
        node2_pid = next(
            int(m.group(1))
            for line in output
            if line.startswith("node-2 ") and (m := re.search(r"pid (\d+)", line))
        )
        os.kill(node2_pid, signal.SIGKILL)
        dev.read_until("node-2 exited with -9")

        async def node2_dead() -> bool:
            _, view = http("GET", f"http://127.0.0.1:{http_port}/v1/cluster")
            return {m["id"]: m["state"] for m in view["members"]}["node-2"] == "dead"

        await wait_until(node2_dead, within=90, what="gossip to declare the killed node dead")
        survivor_port = http_port
        status, _ = http(
            "POST",
            f"http://127.0.0.1:{survivor_port}/v1/schedules",
            {"id": orphan, "topic": "dev-topic", "executeAt": execute_at, "payload": 2},
        )
        assert status == 201

        async def failed_over() -> bool:
            _, body = http("GET", f"http://127.0.0.1:{survivor_port}/v1/schedules/{orphan}")
            return bool(body["status"] == "DELIVERED")

        await wait_until(failed_over, within=90, what="the survivor to deliver after the kill")

        dev.process.send_signal(signal.SIGTERM)
        assert dev.process.wait(timeout=90) == 0
        dev.read_until("dev: stopped")
        still_running = [pid for pid in pids if embedded.pid_alive(pid)]
        assert still_running == []
    finally:
        if dev.process.poll() is None:
            dev.process.kill()
            dev.process.wait()


def test_dev_refuses_a_taken_port_and_names_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "node",
                "dev",
                "--kafka-port",
                str(port),
                "--mongo-port",
                str(embedded.free_port()),
                "--http-port",
                str(consecutive_free_ports(3)),
                "--gossip-port",
                str(consecutive_free_ports(3, socket.SOCK_DGRAM)),
                "--data-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"port {port} for Kafka (--kafka-port) is already in use" in result.stderr
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_dev_shows_why_a_node_exited_and_stops_everything(tmp_path: Path) -> None:
    # A setting the nodes refuse (they read the environment like any node):
    # the reason must be on the screen, not only in the node's log.
    dev = DevProcess(
        dev_args(1, consecutive_free_ports(1), embedded.free_port(), tmp_path / "data"),
        env={"LEASE_TTL": "soon"},
    )
    try:
        assert dev.process.wait(timeout=120) == 1
        output = "\n".join(dev.read_until("dev: stopped"))
    finally:
        if dev.process.poll() is None:
            dev.process.kill()
            dev.process.wait()
    assert "node-1 exited with 2" in output
    assert "config error:" in output and "LEASE_TTL" in output, output
    assert "dev: ready" not in output


def test_dev_signs_gossip_with_a_fresh_key_unless_one_is_given() -> None:
    options = DevOptions(nodes=1)
    runs = [DevStack(options, environ={"PATH": "/bin"}) for _ in range(2)]
    keys = [run.node_environment()["CLUSTER_KEYS"] for run in runs]
    assert keys[0] != keys[1]  # a new key per start of the stack
    assert all(len(base64.b64decode(key, validate=True)) == 32 for key in keys)
    # The nodes accept it, and still get the rest of the environment.
    config = node_config.load({}, environ={"NODE_ID": "n1", "CLUSTER_KEYS": keys[0]})
    assert config.cluster_keys == (base64.b64decode(keys[0]),)
    assert runs[0].node_environment()["PATH"] == "/bin"
    assert "signed with a key generated for this run" in runs[0].describe()
    assert keys[0] not in runs[0].describe()  # the key itself is never shown

    given = DevStack(options, environ={"CLUSTER_KEYS": keys[1]})
    assert given.node_environment()["CLUSTER_KEYS"] == keys[1]
    assert "from the environment" in given.describe()
    # Set but empty: the user turned signing off on purpose.
    off = DevStack(options, environ={"CLUSTER_KEYS": ""})
    assert off.node_environment()["CLUSTER_KEYS"] == ""
    # ... which a node takes only when told so.
    assert off.node_environment()["GOSSIP_UNSIGNED"] == "on"
    assert "GOSSIP_UNSIGNED" not in given.node_environment()
    assert "unsigned" in off.describe()


def test_dev_refuses_a_port_asked_for_twice() -> None:
    base = consecutive_free_ports(3)
    stack = DevStack(DevOptions(nodes=3, http_port=base, kafka_port=base + 2))
    assert (
        f"port {base + 2} is asked for both Kafka (--kafka-port) and node-3 HTTP (--http-port)"
        in stack.taken_ports()
    )
    # Gossip is UDP: the same number as a TCP port is no clash.
    apart = DevOptions(
        nodes=1,
        http_port=base,
        gossip_port=base,
        mongo_port=embedded.free_port(),
        kafka_port=embedded.free_port(),
    )
    assert DevStack(apart).taken_ports() == []


def test_dev_signs_http_deliveries_with_a_printed_secret_and_allows_only_loopback() -> None:
    options = DevOptions(nodes=1)
    made = DevStack(options, environ={"PATH": "/bin"})
    secret = made.node_environment()["HTTP_SIGNING_SECRET"]
    # Printed: a receiver on this machine needs it to verify what it gets.
    assert f"HTTP_SIGNING_SECRET={secret}" in made.describe()
    assert "made for this run" in made.describe()
    config = node_config.load(
        {}, environ={"NODE_ID": "n1", "GOSSIP_UNSIGNED": "on", **made.node_environment()}
    )
    assert config.http_signing_secret == secret
    assert config.http_targets_allow.refusal("127.0.0.1") is None
    assert config.http_targets_allow.refusal("10.0.0.1") is not None
    assert DevStack(options, environ={}).node_environment()["HTTP_SIGNING_SECRET"] != secret

    own = "whsec_" + base64.b64encode(b"k" * 32).decode()
    given = DevStack(options, environ={"HTTP_SIGNING_SECRET": own, "HTTP_TARGETS_ALLOW": ""})
    assert given.node_environment()["HTTP_SIGNING_SECRET"] == own
    assert given.node_environment()["HTTP_TARGETS_ALLOW"] == ""  # the user's choice stands
    assert "from the environment" in given.describe()


async def test_a_healthy_dev_start_and_stop_logs_nothing_at_error_level(tmp_path: Path) -> None:
    """An error-level line means someone must act: a healthy stack has none,
    in its own output or in any log it writes (nodes, broker, database)."""
    nodes, http_port, data = 2, consecutive_free_ports(2), tmp_path / "data"
    dev = DevProcess(dev_args(nodes, http_port, embedded.free_port(), data))
    try:
        dev.read_until("dev: ready")
        await wait_until(
            lambda: settled(http_port, nodes), within=90, what="every node alive and settled"
        )
        dev.process.send_signal(signal.SIGTERM)
        assert dev.process.wait(timeout=90) == 0
        output = dev.read_until("dev: stopped")
    finally:
        if dev.process.poll() is None:
            dev.process.kill()
            dev.process.wait()
    logs = dev_logs(data)
    assert set(logs) == {"mongodb.log", "kafka.log", "node-1.log", "node-2.log"}
    found = {name: error_lines(text) for name, text in {"dev": "\n".join(output), **logs}.items()}
    assert {name: lines for name, lines in found.items() if lines} == {}
    # The embedded broker refuses an idempotent producer, as KAFKA_IDEMPOTENCE=auto
    # expects: each node says so once, as a warning.
    for i in range(nodes):
        said = [
            line
            for line in logs[f"node-{i + 1}.log"].splitlines()
            if "the broker refused an idempotent producer" in line
        ]
        assert len(said) == 1 and "[warning" in said[0], said


async def test_ctrl_c_stops_every_node_before_the_broker_and_the_store(tmp_path: Path) -> None:
    """A terminal's Ctrl-C is SIGINT to its whole foreground group: it must
    not reach the broker and the store, which the nodes need while they
    leave (hand leases over, flush); the stack stops those last."""
    nodes, http_port, data = 2, consecutive_free_ports(2), tmp_path / "data"
    dev = DevProcess(dev_args(nodes, http_port, embedded.free_port(), data), terminal=True)
    try:
        pids = child_pids(dev.read_until("dev: ready"))
        assert set(pids) == {"mongodb", "kafka", "node-1", "node-2"}
        await wait_until(
            lambda: settled(http_port, nodes), within=90, what="every node alive and settled"
        )
        os.killpg(dev.process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        order = exit_order(pids)
        assert dev.process.wait(timeout=90) == 0
        dev.read_until("dev: stopped")
    finally:
        if dev.process.poll() is None:
            dev.process.kill()
            dev.process.wait()
    # Processes seen gone at one wake-up cannot be told apart; none of the
    # servers may be seen gone before the last node.
    seen = {name: index for index, names in enumerate(order) for name in names}
    last_node = max(seen["node-1"], seen["node-2"])
    assert seen["kafka"] >= last_node and seen["mongodb"] >= last_node, order
    # ... and the nodes' leave found both answering: leases handed over, no errors.
    logs = dev_logs(data)
    for i in range(nodes):
        lines = logs[f"node-{i + 1}.log"].splitlines()
        leaving = next(n for n, line in enumerate(lines) if "node leaving" in line)
        assert any("leases released" in line for line in lines[leaving:]), lines[leaving:]
        assert "node stopped" in lines[-1], lines[leaving:]
        assert error_lines("\n".join(lines[leaving:])) == []
        assert not any("could not release leases" in line for line in lines[leaving:])


def test_a_dev_stack_killed_hard_takes_its_children_along(tmp_path: Path) -> None:
    """The broker and the store are out of the terminal's process group, but
    still children that die with the stack (PR_SET_PDEATHSIG), as the nodes do."""
    dev = DevProcess(
        dev_args(1, consecutive_free_ports(1), embedded.free_port(), tmp_path / "data"),
        terminal=True,
    )
    try:
        pids = child_pids(dev.read_until("dev: ready"))
        assert set(pids) == {"mongodb", "kafka", "node-1"}
        dev.process.kill()
        dev.process.wait()
        order = exit_order(pids)
    finally:
        if dev.process.poll() is None:
            dev.process.kill()
            dev.process.wait()
    assert set().union(*order) == set(pids)
