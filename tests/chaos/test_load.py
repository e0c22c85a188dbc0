"""The chaos load's clients against a stand-in node: what each answer
becomes in the history, and how the unknown outcomes settle from the
schedules' views after the run."""

from __future__ import annotations

import inspect
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from chaos import load as load_module
from chaos.checker.model import bulk_calls, changes, expected, facts, unsettled, verb_answers
from chaos.history import (
    BULK_CANCEL,
    BULK_PAUSE,
    CANCEL,
    CREATE,
    FAIL,
    HTTP,
    INFO,
    KAFKA,
    OK,
    PATCH,
    PAUSE,
    RESUME,
    History,
)
from chaos.lab.harness import iso
from chaos.load import RETRY_AFTER_CAP, Api, Load, Webhook, retry_after
from chaos.settle import needs_views, read_views, settle

Handler = Callable[[web.Request], web.Response | Awaitable[web.Response]]


@pytest.fixture
async def node() -> AsyncIterator[tuple[str, dict[str, Handler]]]:
    """A local app routing to ``handlers``, keyed "METHOD path"; its URL."""
    handlers: dict[str, Handler] = {}

    async def route(request: web.Request) -> web.Response:
        handler = handlers.get(f"{request.method} {request.path}")
        if handler is None:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        answered = handler(request)
        return await answered if inspect.isawaitable(answered) else answered

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", handlers
    finally:
        await runner.cleanup()


def answer(status: int, body: Any) -> Handler:
    return lambda _request: web.json_response(body, status=status)


def view(status: str, execute_at: float = 100.0) -> dict[str, Any]:
    return {"status": status, "executeAt": iso(datetime.fromtimestamp(execute_at, UTC))}


@asynccontextmanager
async def a_load(url: str, history: History) -> AsyncIterator[Load]:
    """A load of one node at ``url``; its clients closed after."""
    async with Api(lambda: [url], random.Random(1)) as api:
        yield Load(history, api, random.Random(1), topic="t", rate=1.0, duration=1.0)


def created(history: History, schedule_id: str, at: float = 100.0, group: str = "g0") -> None:
    op = history.invoke(schedule_id, CREATE, 1.0, schedule_id, executeAt=at, group=group)
    history.complete(op, OK, 1.1, version=1)


def called(history: History, schedule_id: str, f: str, type_: str, at: float, **value: Any) -> None:
    op = history.invoke(schedule_id, f, at - 0.1, schedule_id, **value)
    history.complete(op, type_, at, status={OK: 200, FAIL: 409, INFO: 503}[type_])


async def test_a_patch_moves_a_schedule_only_on_a_200_and_a_503_is_unknown(
    node: tuple[str, dict[str, Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handlers = node
    monkeypatch.setattr(load_module, "VERB_DELAY", 0.0)
    monkeypatch.setattr(load_module, "RESCHEDULE_AGAIN", 0.0)
    handlers["PATCH /v1/schedules/ok"] = answer(200, {"status": "PENDING", "version": 3})
    handlers["PATCH /v1/schedules/claimed"] = answer(409, {"error": {"code": "in_flight"}})
    handlers["PATCH /v1/schedules/lost"] = answer(503, {"error": {"code": "store_unavailable"}})
    history = History(started=0.0)
    for schedule_id in ("ok", "claimed", "lost"):
        created(history, schedule_id)
    async with a_load(url, history) as load:
        for schedule_id in ("ok", "claimed", "lost"):
            await load._reschedule(schedule_id, 2)
    types = {c.schedule: c.type for c in history.calls(PATCH)}
    assert types == {"ok": OK, "claimed": FAIL, "lost": INFO}
    known = facts(history)
    [(first, _), (moved_to, answered)] = known.changes.moved["ok"]
    assert first == 100.0 and answered is not None
    assert known.accepted["ok"] == moved_to > answered  # at least half a second ahead
    assert known.accepted["claimed"] == 100.0
    # Unknown until settled: either time may go out.
    assert known.changes.unsure == {"lost"}
    assert verb_answers(history) == {
        "PATCH 200": 1,
        "PATCH 409 in_flight": 1,
        "PATCH 503 store_unavailable": 1,
    }


async def test_a_delete_is_ok_on_a_200_fail_on_a_409_and_unknown_on_a_5xx_or_no_answer(
    node: tuple[str, dict[str, Handler]],
) -> None:
    url, handlers = node
    handlers["DELETE /v1/schedules/s-200"] = answer(200, {})
    handlers["DELETE /v1/schedules/s-409"] = answer(409, {"error": {"code": "not_cancellable"}})
    handlers["DELETE /v1/schedules/s-503"] = answer(503, {})
    history = History(started=0.0)
    async with a_load(url, history) as load:
        for schedule_id in ("s-200", "s-409", "s-503"):
            await load._cancel(schedule_id)
        # No answer at all: the node is gone.
        async with Api(lambda: ["http://127.0.0.1:9"], random.Random(1)) as load.api:
            await load._cancel("s-gone")
    types = {c.schedule: c.type for c in history.calls(CANCEL)}
    assert types == {"s-200": OK, "s-409": FAIL, "s-503": INFO, "s-gone": INFO}


async def test_no_serving_node_means_no_call_and_nothing_in_the_history() -> None:
    history = History(started=0.0)
    async with Api(list, random.Random(1)) as api:
        load = Load(history, api, random.Random(1), topic="t", rate=1.0, duration=1.0)
        await load._cancel("s1")
    assert len(history) == 0


async def test_a_create_retries_as_long_as_a_503_asks_and_a_refusal_is_a_fail(
    node: tuple[str, dict[str, Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handlers = node
    waits: list[float] = []

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(load_module.asyncio, "sleep", no_sleep)
    answers = iter([(503, "1"), (503, None), (201, None)])

    def post(_request: web.Request) -> web.Response:
        status, after = next(answers)
        headers = {"Retry-After": after} if after else {}
        return web.json_response({"version": 1}, status=status, headers=headers)

    handlers["POST /v1/schedules"] = post
    history = History(started=0.0)
    async with a_load(url, history) as load:
        await load._schedule(1)
        handlers["POST /v1/schedules"] = answer(400, {"error": {"code": "invalid"}})
        await load._schedule(2)
    [one, two] = history.calls(CREATE)
    assert one.type == OK and one["version"] == 1
    assert waits[:2] == [1.0, 0.1]  # as the 503 asked, then the default
    assert two.type == FAIL and two["error"].startswith("HTTP 400")


def test_a_retry_after_paces_the_next_try_within_a_cap() -> None:
    assert retry_after(1.0, 0.1) == 1.0
    assert retry_after(30.0, 0.1) == RETRY_AFTER_CAP
    assert retry_after(None, 0.1) == 0.1
    assert retry_after(0.0, 0.1) == 0.1


async def test_a_bulk_verb_is_asked_again_while_more_remain(
    node: tuple[str, dict[str, Handler]],
) -> None:
    url, handlers = node
    pages = iter([{"cancelled": 500, "changed": 500, "more": True},
                  {"cancelled": 7, "changed": 7, "more": False}])  # fmt: skip
    handlers["POST /v1/schedules:cancel"] = lambda _request: web.json_response(next(pages))
    # A pause whose second answer changed nothing (a match in flight): asked
    # again a moment later, until more is false.
    paused = iter([{"changed": 3, "more": True}, {"changed": 0, "more": True},
                   {"changed": 1, "more": False}])  # fmt: skip
    handlers["POST /v1/schedules:pause"] = lambda _request: web.json_response(next(paused))
    history = History(started=0.0)
    async with a_load(url, history) as load:
        await load._bulk(BULK_CANCEL, "g3")
        await load._bulk(BULK_PAUSE, "g4")
    cancel, pause = bulk_calls(history)
    assert (cancel["verb"], cancel["group"], cancel["changed"]) == (BULK_CANCEL, "g3", 507)
    assert cancel["answers"] == [200, 200]
    assert (pause["verb"], pause["group"], pause["changed"]) == (BULK_PAUSE, "g4", 4)
    assert pause["answers"] == [200, 200, 200]


def unknown_verbs() -> History:
    """Schedules whose verbs' outcomes are unknown, and a bulk-cancelled group."""
    history = History(started=0.0)
    for schedule_id in ("b1", "b2", "p", "q", "m", "n", "x"):
        created(history, schedule_id, group="g1" if schedule_id in ("b1", "b2") else "g0")
    created(history, "b3", group="g2")
    bulk = history.invoke("bulk", "bulk-cancel", 49.0, None, group="g1")
    history.complete(bulk, OK, 50.0, status=200, cancelled=1)
    called(history, "p", PAUSE, INFO, 40.0)
    called(history, "q", PAUSE, OK, 41.0)
    called(history, "q", RESUME, INFO, 45.5)  # sent at 45.4
    called(history, "m", PATCH, INFO, 42.0, executeAt=102.5)
    called(history, "n", PATCH, INFO, 43.0, executeAt=103.0)
    called(history, "x", PATCH, INFO, 44.0, executeAt=104.0)
    return history


def test_the_unknown_outcomes_settle_from_the_views() -> None:
    history = unknown_verbs()
    assert needs_views(history) == {"b1", "b2", "p", "q", "m", "n", "x"}
    views = {
        "b1": view("CANCELLED"),
        "b2": view("DELIVERED"),
        "b3": view("CANCELLED"),  # not of a bulk-cancelled group
        "p": view("PAUSED"),
        "q": view("PAUSED"),  # the resume did not land
        "m": view("PENDING", 102.5),  # moved
        "n": view("DELIVERED"),  # still at 100: not moved
    }  # x: no node shows it
    settled = settle(history, views)
    found = changes(settled)
    assert found.bulk_cancelled == {"b1": 50.0}
    assert found.paused == {"p": [(40.0, None)], "q": [(41.0, None)]}
    assert not found.resumed
    assert found.moved["m"] == [(100.0, None), (102.5, 42.0)]
    assert facts(settled).accepted["m"] == 102.5
    assert "n" not in found.moved and facts(settled).accepted["n"] == 100.0
    # x: either time may go out, until a node can say.
    assert found.moved["x"] == [(100.0, None), (104.0, 44.0)] and found.unsure == {"x"}
    assert unsettled(settled) == 1
    # Asked again later, a node shows x still at 100: the first answers stand.
    again = settle(history, {**{"x": view("PENDING")}, **views})
    assert "x" not in changes(again).moved and not changes(again).unsure
    assert facts(again).accepted["x"] == 100.0 and unsettled(again) == 0


def test_a_bulk_pause_took_the_group_s_members_left_paused_but_those_paused_alone() -> None:
    history = History(started=0.0)
    for schedule_id in ("a", "b", "c", "d", "f"):
        created(history, schedule_id, group="g6")
    created(history, "e", group="g0")
    called(history, "c", PAUSE, OK, 41.0)  # paused on its own: not the bulk pause's
    called(history, "f", PAUSE, OK, 41.0)
    called(history, "f", RESUME, OK, 42.0)  # resumed (sent at 41.9): PAUSED later, by it
    first = history.invoke("bulk", BULK_PAUSE, 43.0, None, group="g6")
    history.complete(first, OK, 44.0, status=200, changed=2, more=True)
    last = history.invoke("bulk", BULK_PAUSE, 44.2, None, group="g6")
    history.complete(last, OK, 45.0, status=200, changed=0, more=False)
    assert needs_views(history) == {"a", "b", "c", "d", "f"}
    views = {"a": view("PAUSED"), "b": view("DELIVERED"), "c": view("PAUSED"),
             "d": view("PAUSED"), "e": view("PAUSED"), "f": view("PAUSED")}  # fmt: skip
    found = changes(settle(history, views))
    # Taken when its last call answered, never resumed: owed nothing.
    assert found.bulk_paused == {"a": 45.0, "d": 45.0, "f": 45.0}
    assert found.paused == {
        "a": [(45.0, None)], "c": [(41.0, None)], "d": [(45.0, None)],
        "f": [(41.0, 41.9), (45.0, None)],
    }  # fmt: skip
    assert expected(settle(history, views)) == {"b", "e"}


def test_a_resume_settles_resumed_unless_still_paused_or_cancelled() -> None:
    history = History(started=0.0)
    for schedule_id in ("r1", "r2", "r3"):
        created(history, schedule_id, group="g5" if schedule_id == "r2" else "g0")
        called(history, schedule_id, PAUSE, OK, 41.0)
        called(history, schedule_id, RESUME, FAIL, 45.5)  # refused: asked after the run
    bulk = history.invoke("bulk", "bulk-cancel", 44.0, None, group="g5")
    history.complete(bulk, OK, 45.0, status=200, cancelled=1)
    settled = settle(
        history, {"r1": view("PENDING"), "r2": view("CANCELLED"), "r3": view("PAUSED")}
    )
    found = changes(settled)
    assert found.resumed == {"r1": 45.5}
    # Cancelled while paused (by the bulk cancel): its pause ended when
    # the resume was sent, and it is owed nothing.
    assert found.paused["r2"] == [(41.0, 45.4)] and found.bulk_cancelled == {"r2": 45.0}
    assert found.paused["r3"] == [(41.0, None)]
    assert expected(settled) == {"r1"}


def test_a_cancel_or_pause_settles_by_the_status_the_view_shows() -> None:
    history = History(started=0.0)
    for schedule_id in ("c1", "c2", "c3", "p1", "p2"):
        created(history, schedule_id)
    for schedule_id in ("c1", "c2", "c3"):
        called(history, schedule_id, CANCEL, INFO, 30.0)
    for schedule_id in ("p1", "p2"):
        called(history, schedule_id, PAUSE, INFO, 31.0)
    views = {"c1": view("CANCELLED"), "c2": view("DELIVERED"), "p1": view("PAUSED")}
    settled = settle(history, views)
    assert facts(settled).cancelled == {"c1"}
    assert changes(settled).paused == {"p1": [(31.0, None)]}
    # c3 and p2: nobody could say; not owed while their outcome is unknown.
    assert expected(settled) == {"c2"}
    assert unsettled(settled) == 2


async def test_the_views_come_from_the_first_node_that_shows_the_schedule(
    node: tuple[str, dict[str, Handler]],
) -> None:
    url, handlers = node
    handlers["GET /v1/schedules/s1"] = answer(200, view("CANCELLED"))
    handlers["GET /v1/schedules/s2"] = answer(503, {"error": {"code": "store_unavailable"}})
    found = await read_views(lambda: ["http://127.0.0.1:9", url], {"s1", "s2", "s3"}, {})
    assert found == {"s1": view("CANCELLED")}


def taking(status: int, body: dict[str, Any], bodies: list[Any]) -> Handler:
    """Answer ``status`` and ``body``, keeping each request's JSON body."""

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response(body, status=status)

    return handler


async def test_an_http_schedule_names_the_receiver_and_its_create_notes_the_sink(
    node: tuple[str, dict[str, Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handlers = node
    monkeypatch.setattr(load_module, "CANCEL_SHARE", 0.0)
    monkeypatch.setattr(load_module, "RESCHEDULE_SHARE", 0.0)
    monkeypatch.setattr(load_module, "PAUSE_SHARE", 0.0)
    bodies: list[Any] = []
    handlers["POST /v1/schedules"] = taking(201, {"status": "PENDING", "version": 1}, bodies)
    history = History(started=0.0)
    async with a_load(url, history) as load:
        load.webhook = Webhook("http://10.0.0.4:8000", 0.25, random.Random(1))
        await load._schedule(4, http=True)
        await load._schedule(5)
    to_receiver, to_topic = bodies
    assert to_receiver["http"] == {
        "url": "http://10.0.0.4:8000/hooks/s4",
        "method": "PUT",  # the methods taken in turn
        "headers": {"x-chaos-schedule": "s4"},
        "timeout": "PT10S",
    }
    assert "topic" not in to_receiver and to_topic["topic"] == "t" and "http" not in to_topic
    assert {c.schedule: c["sink"] for c in history.calls(CREATE)} == {"s4": HTTP, "s5": KAFKA}
    assert facts(history).destinations.in_force("s4") == [HTTP]


async def test_a_switching_patch_moves_the_time_and_the_destination_together(
    node: tuple[str, dict[str, Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handlers = node
    monkeypatch.setattr(load_module, "VERB_DELAY", 0.0)
    monkeypatch.setattr(load_module, "RESCHEDULE_AGAIN", 0.0)
    monkeypatch.setattr(load_module, "SWITCH_SHARE", 1.0)
    bodies: list[Any] = []
    handlers["PATCH /v1/schedules/ok"] = taking(200, {"status": "PENDING", "version": 3}, bodies)
    history = History(started=0.0)
    op = history.invoke("ok", CREATE, 1.0, "ok", executeAt=100.0, group="g0", sink=KAFKA)
    history.complete(op, OK, 1.1, version=1)
    async with a_load(url, history) as load:
        load.webhook = Webhook("http://10.0.0.4:8000", 0.25, random.Random(1))
        await load._reschedule("ok", 1, 7, http=False)
    [body] = bodies
    assert set(body) == {"executeAt", "http"} and body["http"]["url"].endswith("/hooks/ok")
    [patch] = history.calls(PATCH)
    assert patch["sink"] == HTTP and patch.type == OK
    known = facts(history)
    assert known.destinations.in_force("ok") == [HTTP]
    assert known.accepted["ok"] == patch["executeAt"]
