"""A hung store (finding 5): every call has a deadline, so a store that
stops answering turns into 503s and a lease loop that keeps going, never
into requests and loops waiting forever; a slow store fills a bounded
insert queue and further inserts are refused at once.

The store is a SecantusDB of the test's own, frozen with SIGSTOP (it keeps
its connections open and answers nothing: what a hung primary looks like).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from node.ops import embedded
from tests.conftest import HOST, EmbeddedServers, NodeFactory, NodeHandle, start_mongo, wait_until
from tests.helpers import metric, stamp


@pytest.fixture
def own_store(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    process, port = start_mongo(tmp_path / "mongo")
    try:
        yield embedded.mongo_uri(HOST, port), process
    finally:
        embedded.discard(process)


def with_signal(process: Any, sig: signal.Signals) -> None:
    if process.poll() is None:
        os.kill(process.pid, sig)


@pytest.fixture
async def frozen(
    start_node: NodeFactory, own_store: tuple[str, Any]
) -> AsyncIterator[tuple[NodeHandle, Any]]:
    uri, process = own_store
    # The driver's monitor would notice the frozen server after its connect
    # timeout (20 s) and reset the pool, failing what waits: made longer than
    # the tests' hang guards, so only the node's own deadlines can answer.
    slow_monitor = uri + "&connectTimeoutMS=300000&heartbeatFrequencyMS=300000"
    node = await start_node(mongo_uri=slow_monitor, store_timeout="1", lease_ttl="3")
    # One insert first: the tenant's policy is then cached (for 5 s), so the
    # calls below reach the insert queue rather than stop at the policy.
    body = {"topic": "hung", "executeAt": later(), "payload": 0}
    assert (await node.request("POST", "/v1/schedules", json=body))[0] == 201
    with_signal(process, signal.SIGSTOP)
    try:
        yield node, process
    finally:
        with_signal(process, signal.SIGCONT)


def later(seconds: float = 3600) -> str:
    return stamp(datetime.now(UTC) + timedelta(seconds=seconds))


async def test_a_hung_store_is_a_503_not_a_hang_and_the_lease_loop_goes_on(
    frozen: tuple[NodeHandle, Any], servers: EmbeddedServers
) -> None:
    node, process = frozen
    errors_before = await metric(node, "scheduler_lease_errors_total")
    body = {"topic": "hung", "executeAt": later(), "payload": 1}

    # A hang guard, not a performance assertion: before, this never answered.
    async def post() -> tuple[int, Any, str | None]:
        async with node.session.post(node.url + "/v1/schedules", json=body) as response:
            return response.status, await response.json(), response.headers.get("Retry-After")

    status, answer, retry_after = await asyncio.wait_for(post(), timeout=60)
    assert status == 503 and answer["error"]["code"] == "store_unavailable"
    assert retry_after == "1"  # a client waits a moment, not a tight loop

    # Readiness says what the node's own store probe last found (every
    # LEASE_TTL/3 here): false from the first probe the store leaves unanswered.
    async def unready() -> bool:
        status, answer = await node.request("GET", "/readyz")
        return status == 503 and answer["checks"]["store"] is False

    await wait_until(unready, within=60, what="/readyz to say the store is out of reach")

    async def renews_fail_and_go_on() -> bool:
        return await metric(node, "scheduler_lease_errors_total") >= errors_before + 2

    await wait_until(renews_fail_and_go_on, within=60, what="the lease loop to keep going")

    with_signal(process, signal.SIGCONT)

    async def served() -> bool:
        status, _ = await node.request("POST", "/v1/schedules", json=body)
        return status == 201

    await wait_until(served, within=60, what="the store back")


async def test_a_slow_store_fills_a_bounded_queue_and_the_rest_is_refused_at_once(
    frozen: tuple[NodeHandle, Any],
) -> None:
    node, _ = frozen

    async def batch(n: int) -> Any:
        items = [{"topic": "hung", "executeAt": later(), "payload": i} for i in range(1000)]
        return await node.request("POST", "/v1/schedules:batch", json={"schedules": items})

    answers = await asyncio.wait_for(asyncio.gather(*(batch(n) for n in range(3))), timeout=120)
    codes = [r["error"]["code"] for _, body in answers for r in body["results"] if "error" in r]
    assert len(codes) == 3000  # nothing stored while the store is frozen
    assert "store_busy" in codes  # the queue is bounded: past it, refused at once
    assert set(codes) <= {"store_busy", "store_unavailable"}
    busy = next(
        r
        for _, body in answers
        for r in body["results"]
        if r.get("error", {}).get("code") == "store_busy"
    )
    assert busy["status"] == 503
