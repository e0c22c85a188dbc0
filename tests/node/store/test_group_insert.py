"""Group commit of inserts against the real embedded store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymongo.errors import DuplicateKeyError

from node.store.group_insert import GroupInserter
from tests.conftest import NodeFactory, NodeHandle
from tests.helpers import schedule


@pytest.fixture
async def api_node(start_node: NodeFactory) -> NodeHandle:
    return await start_node()


async def test_concurrent_inserts_share_one_round_trip(mongo: Any) -> None:
    inserter = GroupInserter(mongo.schedules)
    # All 40 queue before the writer task first runs: one insert_many.
    await asyncio.gather(*(inserter.insert({"_id": f"g{i}", "n": i}) for i in range(40)))
    assert inserter.round_trips == 1
    assert await mongo.schedules.count_documents({}) == 40


async def test_each_caller_gets_its_own_outcome(mongo: Any) -> None:
    await mongo.schedules.insert_one({"_id": "taken"})
    inserter = GroupInserter(mongo.schedules)
    outcomes = await asyncio.gather(
        inserter.insert({"_id": "a"}),
        inserter.insert({"_id": "taken"}),
        inserter.insert({"_id": "b"}),
        inserter.insert({"_id": "a"}),  # the same id twice in one group
        return_exceptions=True,
    )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], DuplicateKeyError)
    assert isinstance(outcomes[3], DuplicateKeyError)
    assert inserter.round_trips == 1
    assert sorted(d["_id"] for d in await mongo.schedules.find().to_list()) == ["a", "b", "taken"]


async def test_a_group_larger_than_the_cap_goes_in_several_round_trips(mongo: Any) -> None:
    inserter = GroupInserter(mongo.schedules, max_group=10)
    await asyncio.gather(*(inserter.insert({"_id": f"c{i}"}) for i in range(25)))
    assert inserter.round_trips == 3
    assert await mongo.schedules.count_documents({}) == 25


async def test_a_cancelled_caller_does_not_break_the_group(mongo: Any) -> None:
    inserter = GroupInserter(mongo.schedules)
    first = asyncio.ensure_future(inserter.insert({"_id": "kept-1"}))
    gone = asyncio.ensure_future(inserter.insert({"_id": "orphan"}))
    last = asyncio.ensure_future(inserter.insert({"_id": "kept-2"}))
    await asyncio.sleep(0)  # all three queued; the request of the second goes away
    gone.cancel()
    await asyncio.gather(first, last)
    with pytest.raises(asyncio.CancelledError):
        await gone
    # The document was already on its way: stored, like an insert_one whose
    # client hung up mid-request; the others completed normally.
    assert await mongo.schedules.count_documents({"_id": {"$in": ["kept-1", "kept-2"]}}) == 2


async def test_concurrent_posts_with_one_id_create_it_once(api_node: NodeHandle) -> None:
    same = schedule(id="race")
    other = schedule(id="race-2")
    statuses = await asyncio.gather(
        *(api_node.request("POST", "/v1/schedules", json=same) for _ in range(5)),
        api_node.request("POST", "/v1/schedules", json=other),
        api_node.request("POST", "/v1/schedules", json={**other, "topic": "elsewhere"}),
    )
    codes = [status for status, _ in statuses]
    assert sorted(codes[:5]) == [200, 200, 200, 200, 201]
    assert sorted(codes[5:]) == [201, 409]
    bodies = {body["id"] for status, body in statuses[:5]}
    assert bodies == {"race"}
