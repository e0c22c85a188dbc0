"""What is due is decided by the store's clock (finding 9): a node whose
own clock runs 30 s fast delivers nothing early. The clock's bookkeeping is
tested in virtual time; the skewed node through a real store and broker
(CHAOS_CLOCK_SKEW sets this node's wall clock off, as a host's can be)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.delivery.clock import StoreClock
from tests.conftest import EmbeddedServers, NodeFactory, TopicReader, unique, wait_until
from tests.helpers import stamp

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Virtual:
    def __init__(self) -> None:
        self.mono = 100.0
        self.trip = 0.1
        self.server_offset = 0.0

    def monotonic(self) -> float:
        return self.mono

    def host_wall(self) -> datetime:
        return T0 + timedelta(seconds=self.mono + 30.0)  # this host: 30 s fast

    async def server_time(self) -> datetime:
        self.mono += self.trip / 2
        answer = T0 + timedelta(seconds=self.mono + self.server_offset)
        self.mono += self.trip / 2
        return answer


async def test_the_store_s_time_is_its_reading_plus_monotonic_time_since() -> None:
    v = Virtual()
    clock = StoreClock(v.server_time, monotonic=v.monotonic, wall=v.host_wall)
    assert clock.now() == v.host_wall()  # before any reading: this host's
    await clock.read()
    assert clock.now() == T0 + timedelta(seconds=v.mono)
    assert clock.offset == -30.0
    assert clock.uncertainty == pytest.approx(0.05)
    v.mono += 12.5
    assert clock.now() == T0 + timedelta(seconds=v.mono)  # the host's jumps do not matter


async def test_the_fastest_reading_of_the_last_few_is_the_one_used() -> None:
    v = Virtual()
    clock = StoreClock(v.server_time, monotonic=v.monotonic, wall=v.host_wall)
    v.trip = 0.01
    await clock.read()
    v.trip, v.server_offset = 2.0, 0.5  # a slow reading: its midpoint is uncertain
    await clock.read()
    assert clock.uncertainty == pytest.approx(0.005)
    assert clock.now() == T0 + timedelta(seconds=v.mono)


async def test_readings_from_before_a_frozen_monotonic_clock_are_dropped() -> None:
    """Found by ``python -m chaos simulate`` (seed 60): a VM frozen with its
    monotonic clock (22 s here) came back with readings that put the store's
    time 22 s back; the fastest of them, older, outranked the new one for
    six readings, and everything due was delivered that late."""
    v = Virtual()
    clock = StoreClock(v.server_time, monotonic=v.monotonic, wall=v.host_wall)
    await clock.read()
    await clock.read()
    v.server_offset = 22.0  # the store's clock ran on; the monotonic one stood still
    v.trip = 0.2  # the new reading is even the slower one
    await clock.read()
    assert clock.now() == T0 + timedelta(seconds=v.mono + 22.0)
    assert clock.uncertainty == pytest.approx(0.1)


async def test_readings_that_agree_within_their_round_trips_are_all_kept() -> None:
    v = Virtual()
    clock = StoreClock(v.server_time, monotonic=v.monotonic, wall=v.host_wall)
    v.trip = 0.01
    await clock.read()
    v.mono += 5.0
    v.trip, v.server_offset = 0.4, 0.19  # off by less than the two half round trips
    await clock.read()
    assert clock.uncertainty == pytest.approx(0.005)  # the fast reading still decides
    assert clock.now() == T0 + timedelta(seconds=v.mono)


async def test_of_equally_fast_readings_the_newest_is_used() -> None:
    v = Virtual()
    clock = StoreClock(v.server_time, monotonic=v.monotonic, wall=v.host_wall)
    await clock.read()
    v.mono += 5.0
    v.server_offset = 0.001  # within what two readings may disagree by
    await clock.read()
    assert clock.now() == T0 + timedelta(seconds=v.mono + 0.001)


async def test_a_node_whose_clock_runs_30_s_fast_delivers_nothing_early(
    start_node: NodeFactory, servers: EmbeddedServers, mongo: Any
) -> None:
    node = await start_node(chaos_mode="on", chaos_clock_skew="30")
    topic = unique("skew")
    due = {f"k{i}": datetime.now(UTC) + timedelta(seconds=2 + i) for i in range(3)}
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        for schedule_id, when in due.items():
            body = {"id": schedule_id, "topic": topic, "executeAt": stamp(when), "payload": 1}
            assert (await node.request("POST", "/v1/schedules", json=body))[0] == 201
        received: dict[str, float] = {}

        async def all_received() -> bool:
            for record in await reader.poll():
                received.setdefault(dict(record.headers)["schedule-id"].decode(), time.time())
            return len(received) == len(due)

        await wait_until(all_received, within=60, what="every schedule delivered")
    for schedule_id, when in due.items():
        # Read by this test on the real clock, which the store shares: not
        # before its time (before, it came 30 s early, at once).
        assert received[schedule_id] >= when.timestamp() - 0.5, schedule_id
    for record in reader.records:
        assert (
            record.timestamp
            >= 1000 * due[dict(record.headers)["schedule-id"].decode()].timestamp() - 50
        )
    _, text = await node.request("GET", "/metrics")
    offset = next(x for x in text.splitlines() if x.startswith("scheduler_clock_offset_seconds "))
    assert float(offset.split()[1]) < -29.0


async def test_the_verbs_judge_times_by_the_stores_clock_not_the_nodes(
    start_node: NodeFactory,
) -> None:
    """A node whose wall clock runs an hour fast: a trigger makes a schedule
    due now by the store's clock (before, an hour from now by the node's, so
    not delivered for an hour), and its horizon and deadline are the store's."""
    node = await start_node(chaos_mode="on", chaos_clock_skew="3600", horizon="1800", buckets="16")
    far = stamp(datetime.now(UTC) + timedelta(minutes=20))
    body = {"id": "skewed", "topic": unique("skew"), "executeAt": far, "payload": 1}
    status, created = await node.request("POST", "/v1/schedules", json=body)
    # Within the 30-minute horizon by the store's clock (by the node's, 40 minutes in the past).
    assert status == 201, created
    body = {**body, "id": "too-far", "executeAt": stamp(datetime.now(UTC) + timedelta(minutes=45))}
    status, refused = await node.request("POST", "/v1/schedules", json=body)
    assert status == 400 and refused["error"]["field"] == "executeAt"
    await node.request("POST", "/v1/schedules/skewed:pause")
    status, paused = await node.request("GET", "/v1/schedules/skewed")
    assert paused["status"] == "PAUSED"
    await node.request("POST", "/v1/schedules/skewed:resume")
    status, triggered = await node.request("POST", "/v1/schedules/skewed:trigger")
    assert status == 200, triggered
    moved_to = datetime.fromisoformat(triggered["executeAt"].replace("Z", "+00:00"))
    assert abs((moved_to - datetime.now(UTC)).total_seconds()) < 600
