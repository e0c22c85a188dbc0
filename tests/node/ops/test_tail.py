"""``python -m node tail``: the dev stack's record reader."""

from __future__ import annotations

import asyncio
import json
import sys

from tests.conftest import EmbeddedServers, NodeFactory, unique


async def test_tail_prints_key_headers_and_value(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("tail")
    node = await start_node()
    status, _ = await node.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "t-1",
            "topic": topic,
            "executeAt": "2000-01-01T00:00:00Z",
            "payload": {"hello": "world"},
            "headers": {"h": "v"},
        },
    )
    assert status == 201
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "node", "tail", topic,
        "--bootstrap", servers.kafka_bootstrap,
        "--from-beginning", "--count", "1",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0
    [line] = stdout.decode().splitlines()
    record = json.loads(line)
    assert record["topic"] == topic
    assert record["key"] == "t-1"
    assert record["value"] == '{"hello":"world"}'
    assert record["headers"]["schedule-id"] == "t-1"
    assert record["headers"]["h"] == "v"
    assert record["headers"]["attempt"] == "1"
