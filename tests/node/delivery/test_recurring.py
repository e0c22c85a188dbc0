"""Recurring schedules and per-schedule retries through the real HTTP API,
store and broker: every occurrence delivered once, the chain materialised
by the owner's fenced write, misfire policies after a stopped cluster, DELETE
ending a chain, failures going to the dead-letter topic without breaking it.

Time-zone and DST arithmetic is tested without IO in tests/node/schedule/test_recurrence.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from node.process import Node
from tests.conftest import (
    EmbeddedServers,
    NodeFactory,
    NodeHandle,
    TopicReader,
    make_config,
    unique,
    wait_until,
)
from tests.helpers import FailingPublisher, parse, stamp


def execute_ats(records: list[Any], schedule_id: str) -> list[str]:
    return [
        dict(r.headers)["execute-at"].decode()
        for r in records
        if dict(r.headers)["schedule-id"].decode() == schedule_id
    ]


async def get(node: NodeHandle, schedule_id: str) -> dict[str, Any]:
    status, body = await node.request("GET", f"/v1/schedules/{schedule_id}")
    assert status == 200, body
    return dict(body)


async def test_an_interval_chain_delivers_each_occurrence_once_then_ends(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("every")
    node = await start_node()
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    status, created = await node.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "tick",
            "topic": topic,
            "payload": {"n": 1},
            "recurrence": {
                "every": "PT1S",
                "start": stamp(start),
                "end": stamp(start + timedelta(seconds=2)),
            },
        },
    )
    assert status == 201, created
    assert created["nextExecuteAt"] == created["executeAt"] == stamp(start)
    assert created["recurrence"]["every"] == "PT1S" and created["occurrences"] == 0
    expected = [stamp(start + timedelta(seconds=k)) for k in range(3)]

    async def ended() -> bool:
        return (await get(node, "tick"))["status"] == "DELIVERED"

    await wait_until(ended, what="the chain to end")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        records = await reader.wait_for(3)
    assert execute_ats(records, "tick") == expected  # each once, in order, none early
    done = await get(node, "tick")
    assert done["occurrences"] == 3 and done["nextExecuteAt"] is None
    assert [o["executeAt"] for o in done["lastOccurrences"]] == expected[::-1]
    assert {o["outcome"] for o in done["lastOccurrences"]} == {"delivered"}


async def test_cron_in_a_time_zone_shows_its_next_local_occurrence(
    start_node: NodeFactory, mongo: Any
) -> None:
    node = await start_node()
    status, created = await node.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "morning",
            "topic": "cron-test",
            "payload": None,
            "recurrence": {"cron": "0 9 * * *", "timeZone": "Europe/Berlin"},
        },
    )
    assert status == 201, created
    local = parse(created["nextExecuteAt"]).astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (9, 0)
    assert parse(created["nextExecuteAt"]) - datetime.now(UTC) <= timedelta(days=1)
    assert created["recurrence"] == {
        "cron": "0 9 * * *",
        "timeZone": "Europe/Berlin",
        "misfire": "fire_once",
    }


@pytest.mark.parametrize(
    ("recurrence", "field"),
    [
        ({"every": "PT1M", "cron": "* * * * *"}, "recurrence.cron"),
        ({"every": "P1M"}, "recurrence.every"),
        ({"cron": "61 * * * *"}, "recurrence.cron"),
        ({"cron": "0 9 * * *", "timeZone": "Mars/Olympus"}, "recurrence.timeZone"),
        ({"every": "PT1M", "misfire": "sometimes"}, "recurrence.misfire"),
        ({"every": "PT1M", "end": "2001-01-01T00:00:00Z"}, "recurrence.end"),
    ],
)
async def test_bad_recurrences_are_refused_and_store_nothing(
    start_node: NodeFactory, mongo: Any, recurrence: dict[str, Any], field: str
) -> None:
    node = await start_node()
    status, body = await node.request(
        "POST", "/v1/schedules", json={"topic": "t", "payload": 1, "recurrence": recurrence}
    )
    assert (status, body["error"]["field"]) == (400, field), body
    status, body = await node.request(
        "POST",
        "/v1/schedules",
        json={"topic": "t", "payload": 1, "recurrence": {"every": "PT1M"}, "executeAt": "x"},
    )
    assert (status, body["error"]["field"]) == (400, "executeAt")
    assert await mongo.schedules.count_documents({}) == 0


async def test_delete_ends_the_chain(start_node: NodeFactory, servers: EmbeddedServers) -> None:
    topic = unique("endless")
    node = await start_node()
    request = {"id": "endless", "topic": topic, "payload": 1, "recurrence": {"every": "PT1S"}}
    status, _ = await node.request("POST", "/v1/schedules", json=request)
    assert status == 201

    async def delivered_twice() -> bool:
        return (await get(node, "endless"))["occurrences"] >= 2

    await wait_until(delivered_twice, what="two occurrences")
    # The same request later is the same schedule, though its anchor was "now".
    status, again = await node.request("POST", "/v1/schedules", json=request)
    assert (status, again["id"]) == (200, "endless")
    cancelled: dict[str, Any] = {}

    async def cancel() -> bool:  # 409 while an occurrence is in flight: again
        status, body = await node.request("DELETE", "/v1/schedules/endless")
        cancelled.update(body)
        return status == 200

    await wait_until(cancel, what="the chain to be cancelled")
    cancelled_at = datetime.now(UTC)
    assert cancelled["status"] == "CANCELLED" and cancelled["nextExecuteAt"] is None
    # A one-shot due after the chain's next occurrence: once it is out, an
    # occurrence the chain still had would be out too.
    await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "sentinel", "topic": topic, "payload": 2, "executeAt": stamp(cancelled_at)},
    )
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:

        async def sentinel_seen() -> bool:
            return bool(execute_ats(await reader.poll(), "sentinel"))

        await wait_until(sentinel_seen, what="the sentinel")
        ticks = [parse(t) for t in execute_ats(reader.records, "endless")]
    assert len(ticks) >= 2
    assert all(t < cancelled_at for t in ticks)
    assert len(set(ticks)) == len(ticks)


async def test_misfire_policies_after_a_stopped_cluster(
    servers: EmbeddedServers, database_name: str, start_node: NodeFactory
) -> None:
    """Three chains every second; the only node stops for several periods;
    a new node finds them all missed. fire_once delivers the overdue one and
    jumps to the present; fire_all delivers maxCatchUp overdue ones, in
    order; skip delivers none of them."""
    topic = unique("misfire")
    first = Node(make_config(servers, database_name, misfire_threshold="1"))
    node = await start_node(first)
    policies = {"once": {"misfire": "fire_once"}, "all": {"misfire": "fire_all", "maxCatchUp": 3}}
    policies["skip"] = {"misfire": "skip"}
    for name, policy in policies.items():
        status, _ = await node.request(
            "POST",
            "/v1/schedules",
            json={
                "id": name,
                "topic": topic,
                "payload": name,
                "recurrence": {"every": "PT1S", **policy},
            },
        )
        assert status == 201

    async def all_running() -> bool:
        return all([(await get(node, n))["occurrences"] >= 1 for n in policies])

    await wait_until(all_running, what="every chain's first occurrence")
    await first.stop()
    stopped_at = datetime.now(UTC)
    outage = 6.0

    async def long_outage() -> bool:
        return (datetime.now(UTC) - stopped_at).total_seconds() >= outage

    await wait_until(long_outage, within=outage + 5, what="the outage")
    second = await start_node(
        Node(make_config(servers, database_name, node_id="node-b", misfire_threshold="1"))
    )
    back_at = datetime.now(UTC)

    async def caught_up() -> bool:
        views = [await get(second, n) for n in policies]
        return all(parse(v["nextExecuteAt"]) > back_at for v in views)

    await wait_until(caught_up, what="every chain to be back on time")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        await reader.wait_for(3)

        async def settled() -> bool:  # the next on-time occurrence of each is out
            await reader.poll()
            return all(
                any(parse(t) > back_at for t in execute_ats(reader.records, n)) for n in policies
            )

        await wait_until(settled, what="an on-time occurrence of each chain")
        delivered = {n: [parse(t) for t in execute_ats(reader.records, n)] for n in policies}

    def overdue(name: str) -> list[datetime]:
        """Occurrences due during the outage, delivered after it."""
        return [t for t in delivered[name] if stopped_at < t < back_at - timedelta(seconds=1)]

    assert len(overdue("once")) == 1
    assert len(overdue("all")) == 3
    assert overdue("all") == sorted(overdue("all"))
    assert overdue("skip") == []
    for name in policies:
        assert len(set(delivered[name])) == len(delivered[name]), name  # none twice
    view = {n: await get(second, n) for n in policies}
    assert view["once"]["skippedOccurrences"] >= 2
    assert view["skip"]["skippedOccurrences"] >= 3
    assert "skipped" in {o["outcome"] for o in view["skip"]["lastOccurrences"]}


async def test_per_schedule_retry_then_dead_letter_and_the_chain_goes_on(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str
) -> None:
    topic, dead = unique("failing"), unique("dlq")
    node = Node(
        make_config(
            servers, database_name, max_attempts="10", retry_backoff="5", dead_letter_topic=dead
        )
    )
    # The broker cannot be made to refuse one topic, so this one fault is injected.
    node.publisher = node.poller.publisher = FailingPublisher(
        node.publisher, topic, {"doomed": 99, "chain": 99}
    )
    handle = await start_node(node)
    # Far enough ahead that both POSTs land before it on a loaded machine: a
    # chain created after its start has lost that occurrence (its first is
    # the next one at or after now), and would fail once, not twice.
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    status, created = await handle.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "doomed",
            "topic": topic,
            "payload": 1,
            "retry": {"maxAttempts": 2, "initialBackoff": "PT0.1S", "maxBackoff": "PT0.2S"},
            "executeAt": stamp(start),
        },
    )
    assert status == 201, created
    assert created["retry"] == {
        "maxAttempts": 2,
        "initialBackoff": "PT0.1S",
        "maxBackoff": "PT0.2S",
    }
    status, chain_created = await handle.request(
        "POST",
        "/v1/schedules",
        json={
            "id": "chain",
            "topic": topic,
            "payload": 2,
            "retry": {"maxAttempts": 1},
            # Both occurrences run however late the first one fails: with
            # fire_once, a first failure written more than the misfire
            # threshold after the second occurrence's time (a loaded CI
            # machine) jumped the chain past its end.
            "recurrence": {
                "every": "PT1S",
                "start": stamp(start),
                "end": stamp(start + timedelta(seconds=1)),
                "misfire": "fire_all",
                "maxCatchUp": 2,
            },
        },
    )
    assert status == 201, chain_created
    assert chain_created["executeAt"] == stamp(start), "created after its start: one occurrence"

    async def both_over() -> bool:
        return all(
            [(await get(handle, n))["status"] == "DELIVERY_FAILED" for n in ("doomed", "chain")]
        )

    await wait_until(both_over, what="both to fail for good")
    doomed = await get(handle, "doomed")
    # Its own limit (2), not the node's (10), and its own backoff (not 5 s).
    assert doomed["attempts"] == 2
    assert "injected failure 2" in doomed["lastError"]
    chain = await get(handle, "chain")  # each occurrence failed once and the chain moved on
    assert [o["outcome"] for o in chain["lastOccurrences"]] == ["failed", "failed"]
    async with TopicReader(servers.kafka_bootstrap, dead) as reader:
        records = await reader.wait_for(3)
    assert sorted(dict(r.headers)["schedule-id"] for r in records) == [
        b"chain",
        b"chain",
        b"doomed",
    ]
    assert all(dict(r.headers)["original-topic"] == topic.encode() for r in records)
    assert all(b"injected failure" in dict(r.headers)["error"] for r in records)
    assert len(set(execute_ats(records, "chain"))) == 2  # one per occurrence


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ({"maxAttempts": 0}, "retry.maxAttempts"),
        ({"maxAttempts": True}, "retry.maxAttempts"),
        ({"initialBackoff": "5s"}, "retry.initialBackoff"),
        ({"initialBackoff": "PT1M", "maxBackoff": "PT1S"}, "retry.maxBackoff"),
        ({"tries": 3}, "retry.tries"),
    ],
)
async def test_bad_retry_policies_are_refused(
    start_node: NodeFactory, mongo: Any, retry: dict[str, Any], field: str
) -> None:
    node = await start_node()
    status, body = await node.request(
        "POST",
        "/v1/schedules",
        json={"topic": "t", "payload": 1, "executeAt": stamp(datetime.now(UTC)), "retry": retry},
    )
    assert (status, body["error"]["field"]) == (400, field), body
    assert await mongo.schedules.count_documents({}) == 0


class VirtualWall:
    """The poller's wall clock, moved by the test: a night with a DST switch
    passes in a second, through the real store and broker."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def test_dst_switch_nights_through_the_real_stack(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str
) -> None:
    """Europe/Berlin 2027: 28 March 02:00 CET -> 03:00 CEST, 31 October
    03:00 CEST -> 02:00 CET. A job at 02:30 runs once each night (in the gap:
    when it ends); an hourly job runs every real hour, twice at 02:30 in
    October."""
    topic = unique("dst")
    wall = VirtualWall(datetime(2027, 3, 27, 22, tzinfo=UTC))
    node = Node(make_config(servers, database_name))
    node.poller.wall = wall
    handle = await start_node(node)
    chains = {
        "spring-fixed": ("30 2 * * *", "2027-03-27T22:00:00Z", "2027-03-28T22:00:00Z"),
        "spring-hourly": ("30 * * * *", "2027-03-27T23:45:00Z", "2027-03-28T02:00:00Z"),
        "autumn-fixed": ("30 2 * * *", "2027-10-30T22:00:00Z", "2027-10-31T22:00:00Z"),
        "autumn-hourly": ("30 * * * *", "2027-10-30T23:00:00Z", "2027-10-31T03:00:00Z"),
    }
    for name, (cron, start, end) in chains.items():
        status, body = await handle.request(
            "POST",
            "/v1/schedules",
            json={
                "id": name,
                "topic": topic,
                "payload": name,
                "recurrence": {
                    "cron": cron,
                    "timeZone": "Europe/Berlin",
                    "start": start,
                    "end": end,
                },
            },
        )
        assert status == 201, body
    # Move the poller's clock to each next occurrence in turn.
    while True:
        views = [await get(handle, name) for name in chains]
        upcoming = [parse(v["nextExecuteAt"]) for v in views if v["nextExecuteAt"]]
        if not upcoming:
            break
        due = min(upcoming)
        done_before = sum(v["occurrences"] for v in views)
        wall.now = due + timedelta(milliseconds=500)
        node.poller.leases_changed()  # wake it: its sleep was for the old time

        async def advanced(before: int = done_before) -> bool:
            views = [await get(handle, name) for name in chains]
            return sum(v["occurrences"] for v in views) > before

        await wait_until(advanced, what=f"the occurrence at {due}")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        records = await reader.wait_for(8)
    assert execute_ats(records, "spring-fixed") == ["2027-03-28T01:00:00.000Z"]  # 03:00 CEST
    assert execute_ats(records, "spring-hourly") == [
        "2027-03-28T00:30:00.000Z",  # 01:30 CET
        "2027-03-28T01:30:00.000Z",  # 03:30 CEST, one real hour later
    ]
    assert execute_ats(records, "autumn-fixed") == ["2027-10-31T00:30:00.000Z"]  # 02:30 CEST
    assert execute_ats(records, "autumn-hourly") == [
        "2027-10-30T23:30:00.000Z",  # 01:30 CEST
        "2027-10-31T00:30:00.000Z",  # 02:30 CEST
        "2027-10-31T01:30:00.000Z",  # 02:30 CET
        "2027-10-31T02:30:00.000Z",  # 03:30 CET
    ]
    for name in chains:
        assert (await get(handle, name))["status"] == "DELIVERED"
