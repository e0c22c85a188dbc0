"""The verbs after "schedule it", through a real node, store and broker:
PATCH (reschedule and change), pause and resume, trigger, retry (redrive),
labels and the list's filters, cancel by selector, and expiry.

Each verb races delivery somewhere: the tests that matter most fire a verb
at schedules the poller is claiming at that moment and check that each one
had exactly one outcome, in Kafka and in the store.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from node.errors import ScheduleInFlight
from node.schedule import changes
from tests.conftest import (
    EmbeddedServers,
    NodeFactory,
    NodeHandle,
    TopicReader,
    unique,
    wait_until,
)
from tests.helpers import at, failing_node, parse, status_of, wait_status

FAR = 3600.0  # seconds ahead: a schedule that will not come due during a test


async def post(node: NodeHandle, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = await node.request("POST", "/v1/schedules", json=body)
    assert status == 201, answer
    return dict(answer)


async def get(node: NodeHandle, schedule_id: str, tenant: str | None = None) -> dict[str, Any]:
    query = f"?tenant={tenant}" if tenant else ""
    status, answer = await node.request("GET", f"/v1/schedules/{schedule_id}{query}")
    assert status == 200, answer
    return dict(answer)


def header(record: Any, name: str) -> str:
    return dict(record.headers)[name].decode()


# -- PATCH -------------------------------------------------------------------------


async def test_a_reschedule_is_delivered_once_at_its_new_time_never_at_the_old(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("patch")
    node = await start_node()
    created = await post(node, {"id": "r", "topic": topic, "executeAt": at(FAR), "payload": 1})
    assert created["version"] == 1
    new_time = at(1)
    status, changed = await node.request(
        "PATCH",
        "/v1/schedules/r",
        json={"executeAt": new_time, "payload": {"v": 2}, "labels": {"order": "42"}},
        headers={"If-Match": '"1"'},
    )
    assert status == 200, changed
    assert changed["executeAt"] == new_time
    assert changed["payload"] == {"v": 2}
    assert changed["labels"] == {"order": "42"}
    assert changed["version"] == 2
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        [record] = await reader.wait_for(1)
        delivered = await wait_status(node, "r", "DELIVERED")
        await reader.poll()
        assert len(reader.records) == 1
    assert header(record, "execute-at") == new_time
    assert record.value == b'{"v":2}'
    assert parse(delivered["deliveredAt"]) >= parse(new_time)


async def test_if_match_with_a_stale_version_is_a_412_and_changes_nothing(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    topic = unique("etag")
    await post(node, {"id": "e", "topic": topic, "executeAt": at(FAR), "payload": 1})
    async with node.session.get(node.url + "/v1/schedules/e") as response:
        assert response.headers["ETag"] == '"1"'
    assert (await node.request("PATCH", "/v1/schedules/e", json={"key": "k1"}))[0] == 200
    before = await get(node, "e")
    for method, path, body in [
        ("PATCH", "/v1/schedules/e", {"key": "k2"}),
        ("POST", "/v1/schedules/e:pause", None),
        ("DELETE", "/v1/schedules/e", None),
    ]:
        status, answer = await node.request(method, path, json=body, headers={"If-Match": '"1"'})
        assert status == 412, (method, path, answer)
        assert answer["error"]["code"] == "version_mismatch"
    assert await get(node, "e") == before
    # The current version, or *, goes through.
    status, answer = await node.request(
        "POST", "/v1/schedules/e:pause", headers={"If-Match": f'"{before["version"]}"'}
    )
    assert (status, answer["status"]) == (200, "PAUSED")
    status, answer = await node.request("DELETE", "/v1/schedules/e", headers={"If-Match": "*"})
    assert (status, answer["status"]) == (200, "CANCELLED")


async def test_recurrence_and_execute_at_turn_a_schedule_into_the_other_kind(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    topic = unique("kind")
    await post(node, {"id": "k", "topic": topic, "executeAt": at(FAR), "payload": 1})
    status, answer = await node.request(
        "PATCH", "/v1/schedules/k", json={"recurrence": {"every": "PT1H"}}
    )
    assert status == 200, answer
    assert answer["recurrence"]["every"] == "PT1H" and answer["occurrences"] == 0
    later = at(2 * FAR)
    status, answer = await node.request("PATCH", "/v1/schedules/k", json={"executeAt": later})
    assert status == 200, answer
    assert "recurrence" not in answer and answer["executeAt"] == later
    # expireAfter is for one-shots: refused on a recurring one, kept on a one-shot.
    status, answer = await node.request(
        "PATCH", "/v1/schedules/k", json={"expireAfter": "PT5M", "key": None}
    )
    assert status == 200 and answer["expireAfter"] == "PT5M"
    assert parse(answer["deadline"]) == parse(later) + timedelta(minutes=5)
    before = await get(node, "k")
    status, answer = await node.request(
        "PATCH", "/v1/schedules/k", json={"recurrence": {"every": "PT1H"}}
    )
    assert (status, answer["error"]["field"]) == (400, "expireAfter")
    assert await get(node, "k") == before


# -- pause, resume -------------------------------------------------------------------


async def test_a_paused_schedule_is_never_delivered_and_a_resumed_one_is_due_at_once(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("pause")
    node = await start_node()
    await post(node, {"id": "p", "topic": topic, "executeAt": at(1), "payload": 1})
    status, paused = await node.request("POST", "/v1/schedules/p:pause")
    assert (status, paused["status"]) == (200, "PAUSED"), paused
    # Pausing again changes nothing; nor does resuming a PENDING one (below).
    status, again = await node.request("POST", "/v1/schedules/p:pause")
    assert (status, again["version"]) == (200, paused["version"])
    # A later schedule on the topic marks the time the paused one would have gone.
    await post(node, {"id": "marker", "topic": topic, "executeAt": at(1.5), "payload": 2})
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        await reader.wait_for(1)
        await wait_status(node, "marker", "DELIVERED")
        await reader.poll()
        assert set(reader.by_id()) == {"marker"}
        assert await status_of(node, "p") == "PAUSED"
        status, resumed = await node.request("POST", "/v1/schedules/p:resume")
        assert (status, resumed["status"]) == (200, "PENDING")
        await reader.wait_for(2)
        await wait_status(node, "p", "DELIVERED")
        assert len(reader.by_id()["p"]) == 1
    status, answer = await node.request("POST", "/v1/schedules/p:resume")
    assert (status, answer["error"]["code"]) == (409, "invalid_state")


async def test_a_recurring_schedule_resumed_after_missed_occurrences_follows_its_misfire_policy(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("resume-chain")
    node = await start_node(misfire_threshold="1")
    start = datetime.now(UTC) + timedelta(seconds=1)
    stamp = start.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    await post(
        node,
        {
            "id": "chain",
            "topic": topic,
            "payload": 1,
            "recurrence": {"every": "PT1S", "start": stamp, "misfire": "skip"},
        },
    )
    status, answer = await node.request("POST", "/v1/schedules/chain:pause")
    assert status == 200, answer
    paused_at = answer["executeAt"]

    async def missed_some() -> bool:
        return datetime.now(UTC) > parse(paused_at) + timedelta(seconds=3.5)

    await wait_until(missed_some, what="three occurrences to pass while paused")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        status, answer = await node.request("POST", "/v1/schedules/chain:resume")
        assert (status, answer["status"]) == (200, "PENDING")
        records = await reader.wait_for(1)
        chain = await get(node, "chain")
    # skip: the occurrence missed while paused is not published; the first
    # record is an occurrence after the resume, and the misses are counted.
    assert parse(header(records[0], "execute-at")) > parse(paused_at)
    assert "skipped" in [o["outcome"] for o in chain["lastOccurrences"]]


# -- expiry ---------------------------------------------------------------------------


async def test_a_one_shot_past_its_deadline_expires_unpublished_and_its_history_says_so(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("expire")
    node = await start_node()
    # Due 10 s ago with 1 s to spare: as after an outage of the cluster.
    await post(
        node, {"id": "late", "topic": topic, "executeAt": at(-10), "expireAfter": "PT1S",
               "payload": 1},
    )  # fmt: skip
    await post(node, {"id": "marker", "topic": topic, "executeAt": at(0), "payload": 2})
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        await reader.wait_for(1)
        expired = await wait_status(node, "late", "EXPIRED")
        await wait_status(node, "marker", "DELIVERED")
        await reader.poll()
        assert set(reader.by_id()) == {"marker"}
    assert expired["expiredAt"] is not None
    _, history = await node.request("GET", "/v1/schedules/late/history")
    assert [h["outcome"] for h in history["history"]] == ["expired"]
    _, metrics = await node.request("GET", "/metrics")
    assert 'scheduler_deliveries_total{outcome="expired"} 1.0' in metrics
    for verb in ("pause", "resume", "trigger", "retry"):
        status, answer = await node.request("POST", f"/v1/schedules/late:{verb}")
        assert (status, answer["error"]["code"]) == (409, "invalid_state"), verb


async def test_resuming_a_one_shot_past_its_deadline_expires_it_at_once(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    topic = unique("expire-paused")
    await post(
        node, {"id": "x", "topic": topic, "executeAt": at(1), "expireAfter": "PT0.5S",
               "payload": 1},
    )  # fmt: skip
    assert (await node.request("POST", "/v1/schedules/x:pause"))[0] == 200

    async def past_deadline() -> bool:
        return datetime.now(UTC) > parse((await get(node, "x"))["deadline"])

    await wait_until(past_deadline, what="the deadline to pass")
    status, answer = await node.request("POST", "/v1/schedules/x:resume")
    assert (status, answer["status"]) == (200, "EXPIRED")


# -- trigger -------------------------------------------------------------------------


async def test_trigger_delivers_a_one_shot_now(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("trigger")
    node = await start_node()
    await post(node, {"id": "t", "topic": topic, "executeAt": at(FAR), "payload": 1})
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        status, answer = await node.request("POST", "/v1/schedules/t:trigger")
        assert status == 200, answer
        [record] = await reader.wait_for(1)
    assert header(record, "execute-at") == answer["executeAt"]
    await wait_status(node, "t", "DELIVERED")


async def test_trigger_fires_an_extra_occurrence_and_the_chain_goes_on(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("trigger-chain")
    node = await start_node()
    await post(node, {"id": "c", "topic": topic, "payload": 1, "recurrence": {"every": "PT1H"}})
    before = await get(node, "c")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        status, answer = await node.request("POST", "/v1/schedules/c:trigger")
        assert status == 200, answer
        [record] = await reader.wait_for(1)

        async def back_to_its_chain() -> bool:
            chain = await get(node, "c")
            return chain["status"] == "PENDING" and "triggeredAt" not in chain

        await wait_until(back_to_its_chain, what="the chain to wait for its next occurrence")
    after = await get(node, "c")
    assert header(record, "execute-at") == answer["triggeredAt"]
    assert after["nextExecuteAt"] == before["nextExecuteAt"]
    assert after["occurrences"] == before["occurrences"]
    assert after["lastOccurrences"][0]["executeAt"] == answer["triggeredAt"]


# -- retry (redrive) -----------------------------------------------------------------


async def test_retry_redrives_a_failed_schedule_with_fresh_attempts(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str, mongo: Any
) -> None:
    topic = unique("redrive")
    node = await failing_node(
        start_node,
        servers,
        database_name,
        topic,
        {"f": 2},
        retry_backoff="0.05",
        max_attempts="2",
        retention="3600",
    )
    await post(node, {"id": "f", "topic": topic, "executeAt": at(0), "payload": 1})
    failed = await wait_status(node, "f", "DELIVERY_FAILED")
    assert failed["attempts"] == 2
    assert "expireAt" in await mongo.schedules.find_one({"_id": "f"})
    node.node.poller.publisher.failures = {}  # whatever failed it is mended
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        status, answer = await node.request("POST", "/v1/schedules/f:retry")
        assert (status, answer["status"]) == (200, "PENDING"), answer
        assert answer["attempts"] == 0
        [record] = await reader.wait_for(1)
        delivered = await wait_status(node, "f", "DELIVERED")
    assert header(record, "attempt") == "1"
    assert delivered["attempts"] == 1
    assert "expireAt" in await mongo.schedules.find_one({"_id": "f"})  # ended again
    status, answer = await node.request("POST", "/v1/schedules/f:retry")
    assert (status, answer["error"]["code"]) == (409, "invalid_state")


# -- labels, list filters, cancel by selector -----------------------------------------


async def test_list_filters_by_label_key_topic_status_and_due_window_with_counts(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    topic, other_topic = unique("list"), unique("list-other")
    now = datetime.now(UTC)

    def when(hours: float) -> str:
        return (
            (now + timedelta(hours=hours)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        )

    for i in range(6):
        await post(
            node,
            {
                "id": f"l{i}",
                "topic": topic if i < 4 else other_topic,
                "executeAt": when(i + 1),
                "payload": i,
                "key": "even" if i % 2 == 0 else "odd",
                "labels": {"training": "t1" if i < 3 else "t2", "kind": "reminder"},
            },
        )
    assert (await node.request("POST", "/v1/schedules/l1:pause"))[0] == 200

    async def ids(query: str) -> list[str]:
        status, answer = await node.request("GET", "/v1/schedules?" + query)
        assert status == 200, (query, answer)
        return [s["id"] for s in answer["schedules"]]

    assert await ids("label=training=t1") == ["l0", "l1", "l2"]
    assert await ids("label=training=t2&label=kind=reminder") == ["l3", "l4", "l5"]
    assert await ids("label=training=t3") == []
    assert await ids("key=odd") == ["l1", "l3", "l5"]
    assert await ids(f"topic={other_topic}") == ["l4", "l5"]
    assert await ids("status=PAUSED") == ["l1"]
    assert await ids(f"dueAfter={when(2)}&dueBefore={when(4)}") == ["l1", "l2"]
    assert await ids(f"status=PENDING&dueBefore={when(3.5)}") == ["l0", "l2"]
    assert await ids("label=training=t1&status=PENDING&key=even") == ["l0", "l2"]
    # Pages in due order follow their cursor to the end, each id once.
    seen: list[str] = []
    query = f"dueAfter={when(0)}&limit=2"
    while True:
        _, answer = await node.request("GET", "/v1/schedules?" + query)
        seen += [s["id"] for s in answer["schedules"]]
        if answer["next"] is None:
            break
        query = f"dueAfter={when(0)}&limit=2&after={answer['next']}"
    assert seen == [f"l{i}" for i in range(6)]
    _, answer = await node.request("GET", "/v1/schedules?label=training=t1&counts=true")
    assert answer["counts"]["PENDING"] == 2 and answer["counts"]["PAUSED"] == 1
    assert sum(answer["counts"].values()) == 3


async def test_cancel_by_selector_cancels_live_matches_only_and_is_safe_to_repeat(
    start_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from node.store import schedules as schedule_store

    monkeypatch.setattr(schedule_store, "BULK_BATCH", 2)
    monkeypatch.setattr(schedule_store, "BULK_LIMIT", 4)
    node = await start_node()
    topic = unique("bulk")
    for i in range(7):
        await post(
            node,
            {"id": f"train-{i}", "topic": topic, "executeAt": at(FAR + i), "payload": i,
             "labels": {"training": "t9"}},
        )  # fmt: skip
    await post(node, {"id": "keep", "topic": topic, "executeAt": at(FAR), "payload": 0,
                      "labels": {"training": "t8"}})  # fmt: skip
    assert (await node.request("POST", "/v1/schedules/train-0:pause"))[0] == 200
    assert (await node.request("DELETE", "/v1/schedules/train-6"))[0] == 200
    selector = {"labels": {"training": "t9"}}
    status, answer = await node.request(
        "POST", "/v1/schedules:cancel", json={**selector, "dryRun": True}
    )
    assert (status, answer) == (200, {"matched": 6, "changed": 0, "more": False, "dryRun": True})
    status, answer = await node.request("POST", "/v1/schedules:cancel", json=selector)
    assert (status, answer) == (200, {"matched": 4, "changed": 4, "more": True, "cancelled": 4})
    status, answer = await node.request("POST", "/v1/schedules:cancel", json=selector)
    assert (status, answer) == (200, {"matched": 2, "changed": 2, "more": False, "cancelled": 2})
    status, answer = await node.request("POST", "/v1/schedules:cancel", json=selector)
    assert (status, answer) == (200, {"matched": 0, "changed": 0, "more": False, "cancelled": 0})
    assert {(await get(node, f"train-{i}"))["status"] for i in range(7)} == {"CANCELLED"}
    assert (await get(node, "keep"))["status"] == "PENDING"
    # By id prefix, and only what is due before a time.
    for i in range(3):
        await post(node, {"id": f"pre-{i}", "topic": topic, "executeAt": at(FAR * (i + 1)),
                          "payload": i})  # fmt: skip
    status, answer = await node.request(
        "POST", "/v1/schedules:cancel", json={"idPrefix": "pre-", "dueBefore": at(FAR * 2.5)}
    )
    assert (status, answer["cancelled"]) == (200, 2)
    assert (await get(node, "pre-2"))["status"] == "PENDING"
    assert (await get(node, "keep"))["status"] == "PENDING"


# -- races with delivery ----------------------------------------------------------------


async def test_a_verb_that_loses_to_a_claim_is_judged_again_on_what_is_stored(
    start_node: NodeFactory,
) -> None:
    """A verb reads, decides and writes under the status and version it
    read. A claim landing between its read and its write makes that write
    match nothing, and the verb is judged again on the schedule as it is
    (IN_FLIGHT: refused), never applied to the stale copy."""
    node = await start_node()
    store = node.node.store
    now = datetime.now(UTC)
    await post(node, {"id": "r", "topic": unique("lost-race"), "executeAt": at(0), "payload": 1})
    node.node.poller.stop()  # this test is the only claimer
    read = await store.get("r")
    assert read is not None and read["status"] == "PENDING"
    calls: list[str] = []

    def decide(doc: dict[str, Any]) -> changes.Change | None:
        calls.append(doc["status"])
        return changes.pause(doc, now)

    [claimed] = await store.claim([read], {read["bucket"]: 1}, "someone", now + timedelta(1))
    stale = changes.pause(read, now)
    assert stale is not None
    condition = {"status": read["status"], "version": read["version"]}
    written = await store.schedules.update_one(
        {"_id": "r", "bucket": read["bucket"], **condition}, {"$set": stale.set}
    )
    assert written.modified_count == 0
    with pytest.raises(ScheduleInFlight):
        await store.change("r", decide, now)
    assert calls == ["IN_FLIGHT"]
    assert (await get(node, "r"))["status"] == "IN_FLIGHT"
    assert claimed.id == "r"


async def race(
    node: NodeHandle, topic: str, count: int, verb: str, body: Any = None
) -> dict[str, int]:
    """``count`` schedules due now, and ``verb`` sent to each at once while
    the poller claims them; returns id -> the verb's HTTP status."""
    results: dict[str, int] = {}

    async def one(schedule_id: str) -> None:
        method, path = (
            ("PATCH", f"/v1/schedules/{schedule_id}")
            if verb == "patch"
            else ("POST", f"/v1/schedules/{schedule_id}:{verb}")
        )
        status, answer = await node.request(method, path, json=body)
        assert status in (200, 409), answer
        if status == 409:
            assert answer["error"]["code"] in ("in_flight", "invalid_state"), answer
        results[schedule_id] = status

    ids = [f"{verb}-{i}" for i in range(count)]
    due = at(0.3)
    for schedule_id in ids:
        await post(node, {"id": schedule_id, "topic": topic, "executeAt": due, "payload": 1})
    await asyncio.sleep(0.25)  # the race: the verbs land around the due time
    await asyncio.gather(*(one(i) for i in ids))
    return results


async def test_pause_racing_the_claim_has_exactly_one_outcome_each(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("race-pause")
    node = await start_node(batch_size="5")
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        results = await race(node, topic, 60, "pause")
        paused = {i for i, status in results.items() if status == 200}

        async def settled() -> bool:
            statuses = {i: await status_of(node, i) for i in results}
            return all(s in ("PAUSED", "DELIVERED") for s in statuses.values())

        await wait_until(settled, what="every schedule paused or delivered")
        # Each one delivered is DELIVERED in the store, and no paused one
        # ever reached the topic: a marker published after them all shows it.
        await post(node, {"id": "marker", "topic": topic, "executeAt": at(0), "payload": 0})
        await reader.wait_for(len(results) - len(paused) + 1)
        await wait_status(node, "marker", "DELIVERED")
        await reader.poll()
    delivered = set(reader.by_id()) - {"marker"}
    assert delivered.isdisjoint(paused)
    assert all(len(copies) == 1 for copies in reader.by_id().values())
    for schedule_id in results:
        expected = "PAUSED" if schedule_id in paused else "DELIVERED"
        assert await status_of(node, schedule_id) == expected, schedule_id
    assert delivered == set(results) - paused


async def test_a_reschedule_racing_the_claim_is_delivered_once_at_one_time(
    start_node: NodeFactory, servers: EmbeddedServers
) -> None:
    topic = unique("race-patch")
    node = await start_node(batch_size="5")
    later = at(2.5)
    async with TopicReader(servers.kafka_bootstrap, topic) as reader:
        results = await race(node, topic, 60, "patch", {"executeAt": later})
        await reader.wait_for(len(results))
        for schedule_id in results:
            await wait_status(node, schedule_id, "DELIVERED")
        await post(node, {"id": "marker", "topic": topic, "executeAt": at(0), "payload": 0})
        await wait_status(node, "marker", "DELIVERED")
        await reader.wait_for(len(results) + 1)
    by_id = reader.by_id()
    for schedule_id, status in results.items():
        [record] = by_id[schedule_id]  # once, whichever won
        if status == 200:  # rescheduled before any claim: only at the new time
            assert header(record, "execute-at") == later, schedule_id
            assert record.timestamp / 1000 >= parse(later).timestamp() - 0.05
        else:  # claimed first: at its first time, the PATCH refused
            assert header(record, "execute-at") != later, schedule_id


# -- bad input, other tenants -------------------------------------------------------

VERBS = [
    ("PATCH", "", {"key": "k2"}),
    ("POST", ":pause", None),
    ("POST", ":resume", None),
    ("POST", ":trigger", None),
    ("POST", ":retry", None),
    ("DELETE", "", None),
    ("GET", "", None),
]


async def test_another_tenant_s_schedule_is_not_found_by_any_verb(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    topic = unique("tenancy")
    await post(node, {"id": "mine", "tenant": "alpha", "topic": topic, "executeAt": at(FAR),
                      "payload": 1, "labels": {"g": "1"}})  # fmt: skip
    before = await get(node, "mine", tenant="alpha")
    for method, suffix, body in VERBS:
        for path in (f"/v1/schedules/mine{suffix}?tenant=beta", f"/v1/schedules/mine{suffix}"):
            status, answer = await node.request(method, path, json=body)
            assert (status, answer["error"]["code"]) == (404, "not_found"), (method, path)
    # Nor does another tenant's bulk verb (nor its dry run) or listing reach it.
    for verb in ("cancel", "pause", "resume", "retry"):
        for dry in (False, True):
            status, answer = await node.request(
                "POST",
                f"/v1/schedules:{verb}",
                json={"tenant": "beta", "labels": {"g": "1"}, "dryRun": dry},
            )
            assert (status, answer["matched"], answer["changed"]) == (200, 0, 0), (verb, dry)
    _, listed = await node.request("GET", "/v1/schedules?tenant=beta&label=g=1")
    assert listed["schedules"] == []
    assert await get(node, "mine", tenant="alpha") == before


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "field"),
    [
        ("PATCH", "/v1/schedules/b", {}, {}, 400, None),
        ("PATCH", "/v1/schedules/b", [], {}, 400, None),
        ("PATCH", "/v1/schedules/b", {"topic": "bad topic"}, {}, 400, "topic"),
        ("PATCH", "/v1/schedules/b", {"topic": "t", "http": {"url": "https://x.example/"}}, {},
         400, "topic"),
        ("PATCH", "/v1/schedules/b", {"http": {"url": "http://10.0.0.1/"}}, {}, 400, "http.url"),
        ("PATCH", "/v1/schedules/b", {"http": {"url": "https://x.example/", "timeout": "PT61S"}},
         {}, 400, "http.timeout"),
        ("PATCH", "/v1/schedules/b", {"id": "c"}, {}, 400, "id"),
        ("PATCH", "/v1/schedules/b", {"executeAt": None}, {}, 400, "executeAt"),
        ("PATCH", "/v1/schedules/b", {"executeAt": "yesterday"}, {}, 400, "executeAt"),
        ("PATCH", "/v1/schedules/b", {"executeAt": "2999-01-01T00:00:00Z"}, {}, 400, "executeAt"),
        ("PATCH", "/v1/schedules/b", {"executeAt": at(5), "recurrence": {"every": "PT1H"}}, {},
         400, "executeAt"),
        ("PATCH", "/v1/schedules/b", {"payload": 1, "payloadBase64": "AA=="}, {}, 400, "payload"),
        ("PATCH", "/v1/schedules/b", {"payloadBase64": "not base64!"}, {}, 400, "payloadBase64"),
        ("PATCH", "/v1/schedules/b", {"labels": {"a=b": "1"}}, {}, 400, "labels"),
        ("PATCH", "/v1/schedules/b", {"labels": {"a": "\x00"}}, {}, 400, "labels"),
        ("PATCH", "/v1/schedules/b", {"labels": {"a": "\ud800"}}, {}, 400, "labels"),
        ("PATCH", "/v1/schedules/b", {"labels": {f"l{i}": "v" for i in range(17)}}, {}, 400,
         "labels"),
        ("PATCH", "/v1/schedules/b", {"labels": {"a": "v" * 129}}, {}, 400, "labels"),
        ("PATCH", "/v1/schedules/b", {"headers": {"tenant": "x"}}, {}, 400, "headers"),
        ("PATCH", "/v1/schedules/b", {"expireAfter": "P1M"}, {}, 400, "expireAfter"),
        ("PATCH", "/v1/schedules/b", {"expireAfter": "PT0S"}, {}, 400, "expireAfter"),
        ("PATCH", "/v1/schedules/b", {"retry": {"maxAttempts": 0}}, {}, 400, "retry.maxAttempts"),
        ("PATCH", "/v1/schedules/b", {"key": "k"}, {"If-Match": "1"}, 400, "If-Match"),
        ("PATCH", "/v1/schedules/b", {"key": "k"}, {"If-Match": 'W/"1"'}, 400, "If-Match"),
        ("PATCH", "/v1/schedules/b%2Fx", {"key": "k"}, {}, 400, "id"),
        ("PATCH", "/v1/schedules/b%00", {"key": "k"}, {}, 400, "id"),
        ("POST", "/v1/schedules/b:pause?force=1", None, {}, 400, "force"),
        ("POST", "/v1/schedules/b:pause", {"now": True}, {}, 413, None),
        ("POST", "/v1/schedules/b:bogus", None, {}, 405, None),
        ("POST", "/v1/schedules:cancel", {}, {}, 400, "labels"),
        ("POST", "/v1/schedules:cancel", {"dueBefore": at(5)}, {}, 400, "labels"),
        ("POST", "/v1/schedules:cancel", {"labels": {}}, {}, 400, "labels"),
        ("POST", "/v1/schedules:cancel", {"labels": "g=1"}, {}, 400, "labels"),
        ("POST", "/v1/schedules:cancel", {"idPrefix": "b/"}, {}, 400, "idPrefix"),
        ("POST", "/v1/schedules:cancel", {"key": ""}, {}, 400, "key"),
        ("POST", "/v1/schedules:cancel", {"key": None}, {}, 400, "key"),
        ("POST", "/v1/schedules:cancel", {"key": None, "labels": None}, {}, 400, "labels"),
        ("POST", "/v1/schedules:cancel", {"idPrefix": None}, {}, 400, "idPrefix"),
        ("POST", "/v1/schedules:cancel", {"key": "k", "status": "DELIVERED"}, {}, 400, "status"),
        ("POST", "/v1/schedules:cancel", {"key": "k", "status": []}, {}, 400, "status"),
        ("POST", "/v1/schedules:pause", {"key": "k", "status": "PAUSED"}, {}, 400, "status"),
        ("POST", "/v1/schedules:retry", {"key": "k", "status": ["PENDING"]}, {}, 400, "status"),
        ("POST", "/v1/schedules:resume", {}, {}, 400, "labels"),
        ("POST", "/v1/schedules:retry", {"destination": "http"}, {}, 400, "labels"),
        ("POST", "/v1/schedules:retry", {"dueBefore": at(5), "status": "DELIVERY_FAILED"}, {},
         400, "labels"),
        ("POST", "/v1/schedules:pause", {"key": "k", "dryRun": "yes"}, {}, 400, "dryRun"),
        ("POST", "/v1/schedules:pause", {"key": "k", "destination": "sms"}, {}, 400,
         "destination"),
        ("POST", "/v1/schedules:pause", {"host": "a/b"}, {}, 400, "host"),
        ("POST", "/v1/schedules:pause", {"host": 7}, {}, 400, "host"),
        ("POST", "/v1/schedules:pause", {"topic": ".."}, {}, 400, "topic"),
        ("POST", "/v1/schedules:pause", {"key": "k" * 10_000}, {}, 400, "key"),
        ("POST", "/v1/schedules:pause", {"key": "k", "everything": True}, {}, 400, "everything"),
        ("POST", "/v1/schedules:pause", [{"key": "k"}], {}, 400, None),
        ("POST", "/v1/schedules:pause?dryRun=true", {"key": "k"}, {}, 400, "dryRun"),
        ("POST", "/v1/schedules:cancel", {"key": "k", "dueBefore": "soon"}, {}, 400,
         "dueBefore"),
        ("GET", "/v1/schedules?label=novalue", None, {}, 400, "label"),
        ("GET", "/v1/schedules?label=a%3Db%3Dc%00", None, {}, 400, "label"),
        ("GET", "/v1/schedules?topic=..", None, {}, 400, "topic"),
        ("GET", "/v1/schedules?dueAfter=tomorrow", None, {}, 400, "dueAfter"),
        ("GET", "/v1/schedules?counts=yes", None, {}, 400, "counts"),
        ("GET", "/v1/schedules?status=PAUSED&status=PENDING", None, {}, 400, "status"),
        ("GET", "/v1/schedules?status=PAUSED&after=eyJhZnRlciI6ICJiIn0", None, {}, 400, "after"),
    ],
)  # fmt: skip
async def test_bad_input_to_a_verb_is_a_clear_4xx_and_changes_nothing(
    start_node: NodeFactory,
    method: str,
    path: str,
    body: Any,
    headers: dict[str, str],
    status: int,
    field: str | None,
) -> None:
    node = await start_node()
    await post(node, {"id": "b", "topic": unique("bad"), "executeAt": at(FAR), "payload": 1,
                      "key": "k", "labels": {"g": "1"}})  # fmt: skip
    before = await get(node, "b")
    answer_status, answer = await node.request(method, path, json=body, headers=headers)
    assert answer_status == status, answer
    assert set(answer) == {"error"} and answer["error"]["message"], answer
    assert answer["error"].get("field") == field, answer
    assert await get(node, "b") == before


async def test_the_cluster_counts_name_every_status_of_this_node_s_buckets(
    start_node: NodeFactory,
) -> None:
    node = await start_node()
    topic = unique("counts")
    for i in range(3):
        await post(node, {"id": f"n{i}", "topic": topic, "executeAt": at(FAR), "payload": i})
    assert (await node.request("POST", "/v1/schedules/n0:pause"))[0] == 200
    assert (await node.request("DELETE", "/v1/schedules/n1"))[0] == 200

    async def held_all() -> bool:
        return len(node.node.leases.usable()) == 16

    await wait_until(held_all, what="the node to hold every bucket")
    status, body = await node.request("GET", "/v1/cluster/counts")
    assert status == 200, body
    assert body["buckets"] == 16
    assert body["counts"] == {
        "PENDING": 1, "PAUSED": 1, "IN_FLIGHT": 0, "DELIVERED": 0,
        "DELIVERY_FAILED": 0, "CANCELLED": 1, "EXPIRED": 0,
    }  # fmt: skip


async def test_a_claim_of_a_copy_read_before_a_patch_takes_nothing(
    start_node: NodeFactory,
) -> None:
    """The poller reads due work, a PATCH lands, then the claim: the claim
    must not take the schedule, or it would publish the copy it read (the
    old payload, the old time) after the PATCH was answered 200."""
    node = await start_node()
    node.node.poller.stop()  # this test is the only claimer
    store = node.node.store
    await post(node, {"id": "v", "topic": unique("stale-read"), "executeAt": at(0), "payload": 1})
    bucket = (await get(node, "v"))["bucket"]
    [read] = await store.find_due(bucket, datetime.now(UTC), 10)
    status, changed = await node.request("PATCH", "/v1/schedules/v", json={"payload": 2})
    assert status == 200, changed
    now = datetime.now(UTC) + timedelta(seconds=1)
    assert await store.claim([read], {read["bucket"]: 1}, "poller", now) == []
    [fresh] = await store.find_due(read["bucket"], now, 10)
    [claimed] = await store.claim([fresh], {read["bucket"]: 1}, "poller", now)
    assert bytes(claimed.doc["payload"]) == b"2"
