"""``python -m node run`` (node/process.py's ``serve``) as an operator runs it:
a start it must refuse ends in one line that says what to change, and exit
code 2, not a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

from node.ops import embedded
from tests.conftest import HOST, TEST_CLUSTER_KEY, EmbeddedServers
from tests.helpers import ROOT

# The tree under test: the node process must import this code, not another
# installed copy.


def run_node(servers: EmbeddedServers, database: str, **settings: str) -> tuple[int, list[str]]:
    """Run a node to its end; its exit code and its stderr lines."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "NODE_ID": "taken",
        "CLUSTER_KEYS": TEST_CLUSTER_KEY,
        "HTTP_BIND": f"{HOST}:0",
        "GOSSIP_BIND": f"{HOST}:0",
        "MONGO_URI": servers.mongo_uri,
        "MONGO_DATABASE": database,
        "KAFKA_BOOTSTRAP": servers.kafka_bootstrap,
        "AUTH": "off",
        "LOG_FORMAT": "json",
        # The embedded broker refuses an idempotent producer: not this file's subject.
        "KAFKA_IDEMPOTENCE": "off",
        **settings,
    }
    done = subprocess.run(
        [sys.executable, "-m", "node", "run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout == ""
    return done.returncode, done.stderr.splitlines()


def the_refusal(lines: list[str]) -> dict[str, Any]:
    """The one line that says why the node would not start: the last, and
    the only one at error level."""
    assert not any("Traceback" in line or "Unclosed" in line for line in lines), lines
    assert len(lines) < 10, lines
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r for r in records if r["level"] in {"error", "critical"}] == [records[-1]], lines
    assert lines[-1].startswith("{")
    refusal = records[-1]
    assert refusal["event"] == "refusing to start"
    return refusal


def test_a_taken_http_port_is_one_line_and_exit_2(
    servers: EmbeddedServers, database_name: str
) -> None:
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, lines = run_node(servers, database_name, HTTP_BIND=f"{HOST}:{port}")
    assert code == 2
    message = the_refusal(lines)["error"]
    assert f"cannot listen for HTTP on {HOST}:{port} (Address already in use)" in message
    assert "another process holds it" in message and "--http-bind (HTTP_BIND)" in message


def test_a_taken_gossip_port_is_one_line_and_exit_2(
    servers: EmbeddedServers, database_name: str
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind((HOST, 0))
        port = holder.getsockname()[1]
        code, lines = run_node(servers, database_name, GOSSIP_BIND=f"{HOST}:{port}")
    assert code == 2
    message = the_refusal(lines)["error"]
    assert f"cannot listen for gossip (UDP and TCP) on {HOST}:{port}" in message
    assert "(Address already in use)" in message and "--gossip-bind (GOSSIP_BIND)" in message


def test_an_address_not_of_this_host_says_which_setting_to_change(
    servers: EmbeddedServers, database_name: str
) -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): no host has it.
    port = embedded.free_port(HOST)
    code, lines = run_node(servers, database_name, HTTP_BIND=f"192.0.2.1:{port}")
    assert code == 2
    message = the_refusal(lines)["error"]
    assert f"cannot listen for HTTP on 192.0.2.1:{port}" in message
    assert "another address with --http-bind (HTTP_BIND)" in message
