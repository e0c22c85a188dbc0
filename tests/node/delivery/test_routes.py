"""A view's schedules by route (node/delivery/routes.py): every answer is
the one a walk over each schedule would give, and what holds work back is
asked once per route, not once per schedule."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from node.delivery.routes import KAFKA, Routes, held_routes, route
from node.schedule.destination import is_http, lane

T0 = datetime(2030, 1, 1, tzinfo=UTC)
URLS = [None, "https://a.example/x", "https://a.example/y", "https://b.example/x"]


def schedule(n: int, url: str | None, due: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": f"s{n}", "bucket": 1, "dueAt": T0 + timedelta(seconds=due)}
    if url is not None:
        doc["http"] = {"url": url, "host": url.split("/")[2]}
    return doc


schedules = st.lists(st.tuples(st.sampled_from(URLS), st.integers(0, 20)), max_size=40).map(
    lambda drawn: [schedule(n, url, due) for n, (url, due) in enumerate(drawn)]
)
routes_held = st.sets(st.sampled_from([route(schedule(0, url, 0)) for url in URLS]))


@given(schedules, st.integers(-1, 21), routes_held)
def test_each_answer_is_what_a_walk_over_every_schedule_gives(
    docs: list[dict[str, Any]], now_s: int, held: set[Any]
) -> None:
    now = T0 + timedelta(seconds=now_s)
    blocked = frozenset(held)
    routes = Routes(docs)

    def due(d: dict[str, Any]) -> bool:
        return bool(d["dueAt"] <= now)

    free = [d for d in docs if route(d) not in blocked]
    assert sorted(d["_id"] for d in routes.due(now, blocked)) == sorted(
        d["_id"] for d in free if due(d)
    )
    assert sorted(d["_id"] for d in routes.unheld(blocked)) == sorted(d["_id"] for d in free)
    assert routes.earliest(blocked) == min((d["dueAt"] for d in free), default=None)
    assert routes.in_hand(now, blocked) == any(due(d) and not is_http(d) for d in free)
    assert routes.calls_due(now) == any(due(d) and is_http(d) for d in docs)
    assert routes.due_lanes(now) == {lane(d) for d in docs if due(d)}
    calls = Counter(lane(d) for d in docs if due(d) and is_http(d))
    assert +routes.due_calls_by_host(now) == calls
    lanes = frozenset(lane(schedule(0, url, 0)) for url in URLS[:2])
    assert routes.all_due_of(lanes, now) == all(due(d) and lane(d) in lanes for d in docs)
    heads = dict(routes.due_heads(now))
    for found, head in heads.items():
        same = [d for d in docs if route(d) == found and due(d)]
        assert head["dueAt"] == min(d["dueAt"] for d in same)
    assert set(heads) == {route(d) for d in docs if due(d)}


def test_a_schedule_is_grouped_by_its_host_and_url_and_a_record_by_kafka() -> None:
    assert route(schedule(0, None, 0)) == KAFKA
    assert route(schedule(0, "https://a.example/x", 0)) == (
        "a.example",
        "https://a.example/x",
        None,
    )
    # The same host by two URLs: one bound (by host), two circuits (by URL).
    assert route(schedule(0, "https://a.example/y", 0))[:2] == ("a.example", "https://a.example/y")
    # A flow key: its own route (a key's limit holds back all of it, and
    # only it), the tenant's (two tenants' keys of one name are two).
    keyed = {**schedule(0, "https://a.example/x", 0), "flow": {"key": "crm"}, "tenant": "default"}
    assert route(keyed) == ("a.example", "https://a.example/x", "default\x00crm")
    record = {**schedule(0, None, 0), "flow": {"key": "crm", "rate": 1}, "tenant": "acme"}
    assert route(record) == (None, None, "acme\x00crm")


def test_what_holds_work_back_is_asked_once_per_route_whatever_the_backlog() -> None:
    hung = [schedule(n, "https://a.example/x", n % 5) for n in range(2_000)]
    views = [Routes(hung[i : i + 16]) for i in range(0, len(hung), 16)]
    views.append(Routes([schedule(9_000, "https://b.example/x", 1), schedule(9_001, None, 1)]))
    asked: list[str | None] = []

    def held(doc: dict[str, Any]) -> bool:
        asked.append(lane(doc))
        return lane(doc) == "a.example"

    blocked = held_routes(views, held)
    assert blocked == {("a.example", "https://a.example/x", None)}
    assert sorted(asked, key=str) == [None, "a.example", "b.example"]
    assert held_routes(views, None) == frozenset()
    now = T0 + timedelta(seconds=10)
    assert [d["_id"] for v in views for d in v.due(now, blocked)] == ["s9000", "s9001"]
