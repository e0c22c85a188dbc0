"""Reads cost the store what they read, and nothing let one tenant's reads
starve the rest (issue 26, finding 5): per-tenant read budgets (virtual
time, then through the API), counts capped and cached, and a connection
pool of the API's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.errors import RateLimited, StoreUnavailable
from node.tenants.model import Tenant
from node.tenants.reads import BURST_SECONDS, KEPT, ReadBudget, TenantReads
from tests.conftest import NodeFactory


def test_a_budget_lets_a_call_through_until_it_is_overdrawn_then_refills() -> None:
    budget = ReadBudget(default_rate=0.2)  # a fifth of the store's time
    tenant = Tenant(name="a")
    budget.check(tenant, now=0.0, nodes=1)  # full: 1 s (5 s of 0.2)
    budget.charge(tenant, 1.5, now=0.0, nodes=1)  # one slow call may overdraw
    with pytest.raises(RateLimited) as refused:
        budget.check(tenant, now=0.0, nodes=1)
    assert refused.value.retry_after == pytest.approx(2.5)  # 0.5 s owed at 0.2 s/s
    budget.check(tenant, now=2.5, nodes=1)  # paid back
    budget.charge(tenant, 0.01, now=2.5, nodes=1)
    with pytest.raises(RateLimited):
        budget.check(tenant, now=2.5, nodes=1)


def test_each_node_grants_its_share_and_a_tenant_may_have_its_own_budget() -> None:
    budget = ReadBudget(default_rate=0.2)
    shared, own = Tenant(name="shared"), Tenant(name="own", read_budget=2.0)
    budget.charge(shared, 0.2 / 4 * BURST_SECONDS, now=0.0, nodes=4)
    budget.check(shared, now=0.0, nodes=4)  # exactly spent, not overdrawn
    budget.charge(shared, 0.001, now=0.0, nodes=4)
    with pytest.raises(RateLimited):
        budget.check(shared, now=0.0, nodes=4)
    budget.charge(own, 9.0, now=0.0, nodes=1)  # within its own 10 s
    budget.check(own, now=0.0, nodes=1)


def test_budgets_of_made_up_tenant_names_are_bounded() -> None:
    budget = ReadBudget(default_rate=1.0)
    for i in range(KEPT + 10):
        budget.charge(Tenant(name=f"t{i}"), 0.1, now=0.0, nodes=1)
    assert len(budget._buckets) == KEPT


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Policies:
    async def policy(self, name: str) -> Tenant:
        return Tenant(name=name)


async def test_a_call_is_charged_the_time_its_store_work_took_even_when_it_failed() -> None:
    clock = Clock()
    reads = TenantReads(
        Policies(),  # type: ignore[arg-type]
        default_rate=0.2,
        alive_nodes=lambda: 1,
        clock=clock,
    )
    with pytest.raises(StoreUnavailable):
        async with reads.reading("slow"):
            clock.now += 5.0  # a store call that timed out after 5 s
            raise StoreUnavailable("timed out")
    with pytest.raises(RateLimited):  # 4 s owed: refused before any store work
        async with reads.reading("slow"):
            raise AssertionError("refused calls never reach the store")
    async with reads.reading("other"):  # another tenant's budget is its own
        clock.now += 0.01


def at(seconds: float) -> str:
    when = datetime.now(UTC) + timedelta(seconds=seconds)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def post_many(node: Any, tenant: str, count: int) -> None:
    items = [
        {"topic": "reads", "executeAt": at(3600), "payload": i, "tenant": tenant}
        for i in range(count)
    ]
    for start in range(0, count, 1000):
        status, answer = await node.request(
            "POST", "/v1/schedules:batch", json={"schedules": items[start : start + 1000]}
        )
        assert status == 200 and answer["created"] == len(items[start : start + 1000])


async def test_a_tenant_over_its_read_budget_gets_429_and_another_tenant_does_not(
    start_node: NodeFactory,
) -> None:
    # A thousandth of the store's time: 5 ms at once, which a page of 100
    # (with its counts) takes more than.
    node = await start_node(read_budget="0.001")
    await post_many(node, "flood", 100)
    await post_many(node, "quiet", 1)
    query = "/v1/schedules?tenant=flood&limit=100&counts=true"
    answers = [(await node.request("GET", query))[0] for _ in range(3)]
    assert answers[0] == 200 and 429 in answers[1:]
    async with node.session.get(node.url + "/v1/schedules?tenant=flood&limit=1") as response:
        body = await response.json()
        assert response.status == 429 and body["error"]["code"] == "rate_limited"
        assert int(response.headers["Retry-After"]) >= 1
    status, page = await node.request("GET", "/v1/schedules?tenant=quiet")
    assert status == 200 and len(page["schedules"]) == 1


async def test_counts_stop_at_a_thousand_and_are_kept_a_while(start_node: NodeFactory) -> None:
    """Counting 20,000 took 4.27 s of the store, every refresh of a page."""
    node = await start_node()
    await post_many(node, "big", 1005)
    status, page = await node.request("GET", "/v1/schedules?tenant=big&counts=true&limit=1")
    assert status == 200
    assert page["counts"]["PENDING"] == 1000 and page["countsCapped"] == ["PENDING"]
    assert page["counts"]["CANCELLED"] == 0
    victim = page["schedules"][0]["id"]
    assert (await node.request("DELETE", f"/v1/schedules/{victim}?tenant=big"))[0] == 200
    # Within COUNTS_CACHE_SECONDS the counts are the kept ones: no store read.
    status, again = await node.request("GET", "/v1/schedules?tenant=big&counts=true&limit=1")
    assert status == 200 and again["counts"]["CANCELLED"] == 0


async def test_the_api_reads_through_a_pool_of_its_own(start_node: NodeFactory) -> None:
    """Lease renewals, the store probe and the owner's reads go through one
    client, the API's calls through another with a small pool: a flood of
    reads queues for the API's connections, never for the owner's."""
    node = await start_node(api_pool_size="3")
    n = node.node
    assert n.store.database.client is n.api_client
    assert n.directory.store.tenants.database.client is n.api_client  # type: ignore[attr-defined]
    assert n.history.collection.database.client is n.api_client
    assert n.delivery_store.database.client is n.client
    assert n.lease_store.collection.database.client is n.client
    assert n.poller.store is n.delivery_store
    assert n.api_client.options.pool_options.max_pool_size == 3


async def test_a_sliced_listing_pages_exactly_as_one_query_would(mongo: Any) -> None:
    """On the embedded store a listing by status is read a bucket at a time
    (a scan it could not stop would hold the whole server); its pages, and
    its counts, are exactly those of the one query a MongoDB runs."""
    from node.store.listing import Cursor, Listing
    from node.store.schedules import ScheduleStore
    from tests.helpers import store_overdue

    store = ScheduleStore(mongo, 16)
    await store_overdue(store, "sliced", [f"s{i:03}" for i in range(120)])
    # Half of them due at one time (ties broken by id), the rest spread out.
    for i in range(0, 120, 2):
        await mongo.schedules.update_one(
            {"_id": f"s{i:03}"}, {"$set": {"dueAt": datetime(2001, 1, 1, tzinfo=UTC)}}
        )
    await mongo.schedules.update_many(
        {"_id": {"$in": ["s001", "s003"]}}, {"$set": {"status": "PAUSED"}}
    )
    assert store.sliced  # the embedded store: prepare() asked
    pages: dict[bool, list[list[str]]] = {}
    counts: dict[bool, dict[str, int]] = {}
    for sliced in (True, False):
        store.sliced = sliced
        after: Cursor | None = None
        pages[sliced] = []
        while True:
            listing = Listing(tenant="default", limit=25, status="PENDING", after=after)
            page = await store.list_page(listing)
            pages[sliced].append([d["_id"] for d in page.docs])
            if not page.more:
                break
            last = page.docs[-1]
            after = Cursor(after=last["_id"], due=last["dueAt"])
        counts[sliced] = await store.count_by_status(
            Listing(tenant="default", limit=1, status="PENDING"), limit=50
        )
    assert pages[True] == pages[False]
    assert sum(len(p) for p in pages[True]) == 118
    assert counts[True] == counts[False] == {**counts[False], "PENDING": 50, "PAUSED": 2}
