"""Fair polling: one tenant's backlog does not hold another tenant's due
schedules behind it. The selection is pure; the whole path runs on a real
node, store and broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.delivery.fairness import fair_share
from node.schedule.model import Limits
from node.schedule.parse import parse_schedule_object
from node.store.schedules import ScheduleStore
from node.store.tenants import TenantStore
from node.tenants.model import Tenant
from tests.conftest import NodeFactory, wait_until
from tests.test_recurring import stamp

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LIMITS = Limits(max_payload_bytes=1024, horizon=timedelta(days=1))


def doc(tenant: str, seconds: float) -> dict[str, Any]:
    return {"_id": f"{tenant}{seconds}", "tenant": tenant, "dueAt": T0 + timedelta(seconds=seconds)}


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
