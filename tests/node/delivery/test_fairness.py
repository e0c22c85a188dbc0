"""Fair polling: one tenant's backlog does not hold another tenant's due
schedules behind it. The selection is pure; the whole path runs on a real
node, store and broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.delivery.due_book import Read
from node.delivery.fairness import fair_share, next_window
from node.delivery.poller import BucketPoller
from node.metrics import NodeMetrics
from node.schedule.model import Limits
from node.schedule.parse import parse_schedule_object
from node.store.schedules import MAX_TENANTS_PER_ROUND, ScheduleStore
from node.store.tenants import TenantStore
from node.tenants.model import Tenant
from tests.conftest import NodeFactory, wait_until
from tests.helpers import stamp

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LIMITS = Limits(max_payload_bytes=1024, horizon=timedelta(days=1))


def doc(tenant: str, seconds: float) -> dict[str, Any]:
    return {"_id": f"{tenant}{seconds}", "tenant": tenant, "dueAt": T0 + timedelta(seconds=seconds)}


def test_windows_of_tenants_cover_all_of_them_in_turn() -> None:
    names = [f"t{i:03}" for i in range(200)]
    start, asked = 0, []
    for _ in range(7):  # ceil(200 / 32)
        window, start = next_window(names, start, {"t000"}, 32)
        assert len(window) == 32 and "t000" not in window
        asked += window
    assert set(asked) == set(names) - {"t000"}
    assert next_window([], 5, set(), 32) == ([], 0)
    assert next_window(["a", "b"], 7, {"a"}, 32) == (["b"], 0)


class AskedStore:
    """What the poller asks of the store when a view hides other tenants:
    as the real store, the first MAX_TENANTS_PER_ROUND it is given."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def oldest_due_of(
        self, tenants: list[str], until: datetime, buckets: list[int], limit: int
    ) -> list[dict[str, Any]]:
        self.asked.append(list(tenants[:MAX_TENANTS_PER_ROUND]))
        return []


async def test_with_200_tenants_eight_rounds_ask_every_one_of_them() -> None:
    """A full view of one tenant's backlog hides the others: each round asks
    32 more of them (before, the window moved one tenant a round, and 8
    rounds asked 39 of 200)."""
    names = [f"t{i:03}" for i in range(200)]

    async def tenant_names() -> list[str]:
        return names

    store = AskedStore()
    owner = BucketPoller(
        store,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        NodeMetrics(),
        node_id="a",
        batch_size=10,
        poll_interval=1.0,
        rules=None,  # type: ignore[arg-type]
        tenant_names=tenant_names,
    )
    owner.book.sync({0: 1})
    backlog = [{**doc("t000", s), "bucket": 0} for s in range(16)]
    owner.book.learned(Read(0, 1, T0 + timedelta(hours=1), 16), backlog, 0.0)
    for _ in range(8):
        await owner._choose(T0 + timedelta(minutes=1), 10)
    asked = {t for window in store.asked for t in window}
    assert asked == set(names) - {"t000"}


def test_a_burst_shares_the_batch_with_every_other_tenant() -> None:
    burst = [doc("a", s) for s in range(100)]
    late = [doc("b", 200), doc("b", 201), doc("c", 300)]
    chosen = fair_share(burst + late, 10)
    assert [d["tenant"] for d in chosen].count("a") == 7
    assert {d["_id"] for d in late} <= {d["_id"] for d in chosen}
    assert chosen == sorted(chosen, key=lambda d: d["dueAt"])  # oldest first for the poller
    assert [d["_id"] for d in chosen if d["tenant"] == "a"] == [f"a{s}" for s in range(7)]


def test_a_lone_tenant_gets_the_whole_batch_oldest_first() -> None:
    docs = [doc("a", s) for s in range(50, 0, -1)]
    assert [d["_id"] for d in fair_share(docs, 5)] == [f"a{s}" for s in range(1, 6)]
    assert fair_share([], 5) == []


@pytest.mark.parametrize("fair", ["on", "off"])
async def test_a_backlog_does_not_delay_another_tenant(
    start_node: NodeFactory, mongo: Any, fair: str
) -> None:
    """Tenant A has 300 overdue schedules, tenant B three due now, and a batch
    holds 20. Fair: B's go out in the first batches, long before A's last.
    Oldest first (off), they wait for all of A's: the test shows the difference."""
    now = datetime.now(UTC)
    store = ScheduleStore(mongo, 16)
    await store.prepare(now)
    tenants = TenantStore(mongo)
    for name in ("A", "B"):
        await tenants.add(Tenant(name=name), now)
    work = [("A", f"a{i}", now - timedelta(seconds=30)) for i in range(300)]
    work += [("B", f"b{i}", now) for i in range(3)]
    for tenant, schedule_id, when in work:
        body = {"id": schedule_id, "topic": "fair", "payload": 1, "executeAt": stamp(when)}
        new = parse_schedule_object(body, LIMITS, now, lambda _, t=tenant: t)
        await store.insert(new, now)

    await start_node(batch_size="20", fair_tenants=fair)

    async def all_delivered() -> bool:
        return await mongo.schedules.count_documents({"status": {"$ne": "DELIVERED"}}) == 0

    await wait_until(all_delivered, within=120, what="all 303 delivered")
    a_last = max(d["deliveredAt"] for d in await mongo.schedules.find({"tenant": "A"}).to_list())
    b_last = max(d["deliveredAt"] for d in await mongo.schedules.find({"tenant": "B"}).to_list())
    if fair == "on":
        assert b_last < a_last
    else:
        assert b_last >= a_last
