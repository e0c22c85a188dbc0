"""``python -m node ctl`` against real nodes: members, owners, schedule (with
labels), get, list, reschedule, pause, resume, trigger, retry, cancel (one or
by filter), and drain (graceful leave without exiting). What the node cannot
be made to answer on demand (a bulk cancel that never ends, a cursor chain)
is played by a stub HTTP server that records what ctl sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from node.api.cluster import view_of
from node.ops import ctl as ctl_module
from node.ops.cli import build_parser
from node.process import Node
from node.store import schedules as schedule_store
from tests.conftest import EmbeddedServers, NodeFactory, NodeHandle, make_config, unique, wait_until
from tests.helpers import FailingPublisher, at, cluster, ctl, ctl_with_errors


def settled(*handles: NodeHandle) -> Any:
    async def condition() -> bool:
        views = [await view_of(h.node) for h in handles]
        return all(v["buckets"]["settled"] for v in views) and all(
            o["owner"] == o["placed"] for v in views for o in v["buckets"]["owners"]
        )

    return condition


async def test_members_owners_and_a_schedule_round_trip(start_node: NodeFactory) -> None:
    a, b = await cluster(start_node, ["ctl-a", "ctl-b"])
    await wait_until(settled(a, b), 60, "the two nodes to settle")

    code, out = await ctl(a, "members")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert set(rows) == {"ctl-a", "ctl-b"} and all(" alive " in r for r in rows.values())
    held = [int(r.split()[4]) for r in rows.values()]
    assert sum(held) == 32 and min(held) > 0
    assert "(this node)" in rows["ctl-a"] and out.splitlines()[-1].endswith("settled")

    code, out = await ctl(b, "owners", "--bucket", "7")
    assert code == 0
    [line] = out.splitlines()[1:]
    assert line.split()[0] == "7" and line.split()[1] in {"ctl-a", "ctl-b"}

    code, out = await ctl(b, "schedule", "ctl-topic", "--in", "3600", "--id", "order:1",
                          "--payload", '{"n": 1}', "--key", "k")  # fmt: skip
    assert code == 0 and json.loads(out)["status"] == "PENDING"
    code, out = await ctl(a, "get", "order:1")  # from the other node
    assert code == 0 and json.loads(out)["key"] == "k"
    code, out = await ctl(a, "cancel", "order:1")
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"
    code, out = await ctl(a, "cancel", "order:1")
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"  # cancel is idempotent
    code, _ = await ctl(a, "get", "missing")
    assert code == 1


async def test_drain_hands_every_bucket_over_and_keeps_the_api(start_node: NodeFactory) -> None:
    a, b = await cluster(start_node, ["drain-a", "drain-b"])
    await wait_until(settled(a, b), 60, "the two nodes to settle")
    assert b.node.leases.held

    code, out = await ctl(b, "drain")
    assert code == 0 and json.loads(out) == {"node": "drain-b", "state": "drained"}
    assert not b.node.leases.held

    async def a_holds_everything() -> bool:
        return len(a.node.leases.usable()) == 32

    await wait_until(a_holds_everything, 60, "drain-a to take every bucket")
    assert (await b.request("GET", "/readyz"))[0] == 503
    # Still an API node: what it accepts is delivered by the rest.
    code, out = await ctl(b, "schedule", "drained-topic", "--in", "0.5", "--id", "after-drain")
    assert code == 0

    async def delivered() -> bool:
        return (await a.request("GET", "/v1/schedules/after-drain"))[1]["status"] == "DELIVERED"

    await wait_until(delivered, 60, "the schedule to be delivered by drain-a")
    code, _ = await ctl(b, "drain")
    assert code == 1  # 409: already drained


# -- the command line alone, and what ctl sends (a stub node) ------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["reschedule", "x"],  # neither --at nor --in
        ["reschedule", "x", "--at", "2030-01-01T00:00:00Z", "--in", "5"],
        ["pause", "x", "--if-match", "abc"],
        ["resume", "x", "--if-match", 'W/"1"'],
        ["schedule", "t", "--in", "1", "--label", "no-value-separator"],
        ["schedule", "t", "--in", "1", "--label", "=v"],
        ["cancel", "--label", "team"],
        ["list", "--limit", "0"],
    ],
)
def test_impossible_command_lines_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["ctl", *argv])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("given", "sent"), [("3", '"3"'), ('"3"', '"3"'), ("007", '"7"'), ("*", "*")]
)
def test_if_match_takes_a_version_as_get_or_an_etag_shows_it(given: str, sent: str) -> None:
    args = build_parser().parse_args(["ctl", "trigger", "x", "--if-match", given])
    assert args.if_match == sent


class Stub:
    """A scripted node: each (method, path) answers from its queue in turn,
    and every request is recorded as (method, path, query, headers, body)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], list[tuple[int, Any]]] = {}
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    def answer(self, method: str, path: str, *answers: tuple[int, Any]) -> None:
        self.answers.setdefault((method, path), []).extend(answers)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        self.requests.append(
            {
                "method": handler.command,
                "path": url.path,
                "query": parse_qsl(url.query),
                "headers": dict(handler.headers),
                "body": json.loads(raw) if raw else None,
            }
        )
        queue = self.answers.get((handler.command, url.path)) or [(404, {"error": {}})]
        status, body = queue.pop(0)
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


@pytest.fixture
def stub() -> Iterator[Stub]:
    node = Stub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self) -> None:
            node.handle(self)

        do_GET = do_POST = do_PATCH = do_DELETE = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    node.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    "argv",
    [
        ["cancel"],  # neither an id nor a filter
        ["cancel", "--due-before", "2030-01-01T00:00:00Z"],  # no filter that bounds it
        ["cancel", "x", "--label", "team=a"],  # an id and filters
        ["schedule", "t", "--in", "1", "--label", "a=1", "--label", "a=2"],
    ],
)
async def test_impossible_requests_exit_2_and_send_nothing(stub: Stub, argv: list[str]) -> None:
    code, out, err = await ctl_with_errors(stub.url, *argv)
    assert code == 2 and out == "" and err.startswith("ctl: ")
    assert stub.requests == []


async def test_a_bulk_cancel_calls_again_while_the_node_says_more(stub: Stub) -> None:
    stub.answer(
        "POST",
        "/v1/schedules:cancel",
        (200, {"matched": 10000, "changed": 10000, "more": True}),
        (200, {"matched": 10000, "changed": 9999, "more": True}),
        (200, {"matched": 7, "changed": 7, "more": False}),
    )
    code, out = await ctl(
        stub.url, "cancel", "--label", "team=a", "--label", "env=a=b", "--key", "k",
        "--id-prefix", "order-", "--due-before", "2030-01-01T00:00:00Z", "--topic", "t",
        "--destination", "kafka", "--status", "PAUSED",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == {"matched": 20007, "changed": 20006, "cancelled": 20006, "calls": 3}
    body = {
        "labels": {"team": "a", "env": "a=b"},
        "key": "k",
        "idPrefix": "order-",
        "topic": "t",
        "destination": "kafka",
        "status": ["PAUSED"],
        "dueBefore": "2030-01-01T00:00:00Z",
    }
    assert [(r["method"], r["path"], r["body"]) for r in stub.requests] == [
        ("POST", "/v1/schedules:cancel", body)
    ] * 3


async def test_a_bulk_verb_waits_out_what_is_in_flight_then_gives_up(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More, but nothing changed: what is left is in flight. Asked again a
    moment later, SETTLE_CALLS times in a row at most."""
    monkeypatch.setattr(ctl_module, "SETTLE_WAIT", 0.0)
    monkeypatch.setattr(ctl_module, "SETTLE_CALLS", 3)
    stub.answer(
        "POST",
        "/v1/schedules:pause",
        (200, {"matched": 3, "changed": 3, "more": True}),
        (200, {"matched": 0, "changed": 0, "more": True}),
        (200, {"matched": 1, "changed": 1, "more": False}),
    )
    code, out = await ctl(stub.url, "pause", "--key", "k")
    assert (code, json.loads(out)) == (0, {"matched": 4, "changed": 4, "calls": 3})
    stub.requests.clear()
    stub.answer(
        "POST",
        "/v1/schedules:pause",
        *[(200, {"matched": 0, "changed": 0, "more": True})] * 4,
    )
    code, out, err = await ctl_with_errors(stub.url, "pause", "--key", "k")
    assert code == 1 and out == "" and "stopped after changing 0" in err
    assert len(stub.requests) == 3


async def test_a_dry_run_sends_dry_run_once_and_prints_the_count(stub: Stub) -> None:
    answer = {"matched": 42, "changed": 0, "more": False, "dryRun": True}
    stub.answer("POST", "/v1/schedules:retry", (200, answer))
    code, out = await ctl(stub.url, "retry", "--host", "hooks.example", "--dry-run")
    assert (code, json.loads(out)) == (0, answer)
    [request] = stub.requests
    assert request["body"] == {"host": "hooks.example", "dryRun": True}


async def test_a_refusal_in_a_bulk_cancel_is_exit_1(stub: Stub) -> None:
    refusal = {"error": {"code": "store_unavailable", "message": "store down"}}
    stub.answer(
        "POST",
        "/v1/schedules:cancel",
        (200, {"matched": 10000, "changed": 10000, "more": True}),
        (503, refusal),
    )
    code, _, err = await ctl_with_errors(stub.url, "cancel", "--id-prefix", "a")
    assert code == 1 and "HTTP 503" in err and "store_unavailable" in err


def listed(*ids: str) -> list[dict[str, Any]]:
    return [
        {"id": i, "status": "PENDING", "executeAt": "2030-01-01T00:00:00.000Z", "topic": "t",
         "version": 1, "labels": {"team": "a"}}
        for i in ids
    ]  # fmt: skip


async def test_list_follows_next_until_the_limit_and_asks_counts_once(stub: Stub) -> None:
    stub.answer(
        "GET",
        "/v1/schedules",
        (200, {"schedules": listed("a", "b"), "next": "c1", "counts": {"PENDING": 9}}),
        (200, {"schedules": listed("c"), "next": "c2", "counts": {"PENDING": 9}}),
    )
    code, out = await ctl(
        stub.url, "list", "--label", "team=a", "--label", "env=prod", "--status", "PENDING",
        "--topic", "t", "--key", "k", "--counts", "--limit", "3", "--json",
    )  # fmt: skip
    assert code == 0
    answer = json.loads(out)
    assert [s["id"] for s in answer["schedules"]] == ["a", "b", "c"]
    assert answer["next"] == "c2" and answer["counts"] == {"PENDING": 9}
    filters = [("label", "team=a"), ("label", "env=prod"), ("status", "PENDING"),
               ("topic", "t"), ("key", "k")]  # fmt: skip
    first, second = (r["query"] for r in stub.requests)
    assert first == [*filters, ("limit", "3"), ("counts", "true")]
    assert second == [*filters, ("limit", "1"), ("after", "c1")]


async def test_list_prints_a_table_and_how_to_go_on(stub: Stub) -> None:
    stub.answer(
        "GET",
        "/v1/schedules",
        (200, {"schedules": listed("a"), "next": "c1", "counts": {"PENDING": 1, "PAUSED": 2}}),
    )
    code, out = await ctl(stub.url, "list", "--limit", "1", "--counts", "--after", "c0")
    assert code == 0
    header, row, total, counts = out.splitlines()
    assert header.split() == ["id", "status", "due", "version", "destination", "labels"]
    assert row.split() == ["a", "PENDING", "2030-01-01T00:00:00.000Z", "1", "t", "team=a"]
    assert total == "1 schedule(s); more: --after c1"
    assert counts == "counts: PENDING 1, PAUSED 2"
    assert stub.requests[0]["query"] == [("limit", "1"), ("after", "c0"), ("counts", "true")]


async def test_verbs_quote_the_id_and_send_if_match_only_when_asked(stub: Stub) -> None:
    view = {"id": "order:1/x", "status": "PAUSED"}
    quoted = "/v1/schedules/order%3A1%2Fx"
    for verb in ("pause", "resume", "trigger", "retry"):
        stub.answer("POST", f"{quoted}:{verb}", (200, view))
    stub.answer("PATCH", quoted, (200, view), (200, view))
    assert (await ctl(stub.url, "pause", "order:1/x", "--if-match", "4"))[0] == 0
    assert (await ctl(stub.url, "resume", "order:1/x"))[0] == 0
    assert (await ctl(stub.url, "trigger", "order:1/x", "--if-match", "*"))[0] == 0
    assert (await ctl(stub.url, "retry", "order:1/x"))[0] == 0
    code, out = await ctl(
        stub.url, "reschedule", "order:1/x", "--at", "2030-01-01T00:00:00Z", "--if-match", '"5"'
    )
    assert code == 0 and json.loads(out) == view
    before = datetime.now(UTC)
    assert (await ctl(stub.url, "reschedule", "order:1/x", "--in", "60"))[0] == 0
    sent = [
        (r["method"], r["path"], r["headers"].get("If-Match"), r["body"]) for r in stub.requests
    ]
    assert sent[:5] == [
        ("POST", f"{quoted}:pause", '"4"', None),
        ("POST", f"{quoted}:resume", None, None),
        ("POST", f"{quoted}:trigger", "*", None),
        ("POST", f"{quoted}:retry", None, None),
        ("PATCH", quoted, '"5"', {"executeAt": "2030-01-01T00:00:00Z"}),
    ]
    method, path, if_match, body = sent[5]
    assert (method, path, if_match) == ("PATCH", quoted, None)
    moved = datetime.fromisoformat(body["executeAt"].replace("Z", "+00:00"))
    assert before + timedelta(seconds=60) <= moved + timedelta(milliseconds=1)


# -- against a real node --------------------------------------------------------


async def get_view(handle: NodeHandle, schedule_id: str) -> dict[str, Any]:
    status, body = await handle.request("GET", f"/v1/schedules/{schedule_id}")
    assert status == 200, body
    return dict(body)


async def reaches(handle: NodeHandle, schedule_id: str, status: str) -> dict[str, Any]:
    async def reached() -> bool:
        view = await get_view(handle, schedule_id)
        return bool(view["status"] == status)

    await wait_until(reached, 60, f"{schedule_id} to be {status}")
    return await get_view(handle, schedule_id)


async def ok(handle: NodeHandle, *argv: str) -> Any:
    code, out, err = await ctl_with_errors(handle, *argv)
    assert code == 0, err
    return json.loads(out)


async def refused(handle: NodeHandle, *argv: str) -> str:
    """ctl's exit 1: the node refused; its error as ctl printed it."""
    code, out, err = await ctl_with_errors(handle, *argv)
    assert code == 1 and out == "", (code, out, err)
    return err


async def test_labels_list_filters_counts_and_paging(
    start_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start_node()
    topic = unique("ctl-list")
    a1 = await ok(node, "schedule", topic, "--in", "3600", "--id", "a1",
                  "--label", "team=a", "--label", "env=prod")  # fmt: skip
    assert a1["labels"] == {"team": "a", "env": "prod"} and a1["version"] == 1
    await ok(node, "schedule", topic, "--in", "3600", "--id", "a2", "--label", "team=a",
             "--key", "k2")  # fmt: skip
    await ok(node, "schedule", topic, "--in", "3600", "--id", "b1", "--label", "team=b")
    assert (await ok(node, "pause", "a2"))["status"] == "PAUSED"

    async def ids(*filters: str) -> list[str]:
        return [s["id"] for s in (await ok(node, "list", "--json", *filters))["schedules"]]

    assert sorted(await ids("--label", "team=a")) == ["a1", "a2"]
    assert await ids("--label", "team=a", "--label", "env=prod") == ["a1"]
    assert await ids("--label", "team=a", "--status", "PAUSED") == ["a2"]
    assert await ids("--status", "PAUSED") == ["a2"]
    assert await ids("--key", "k2") == ["a2"]
    assert sorted(await ids("--topic", topic)) == ["a1", "a2", "b1"]
    assert await ids("--topic", unique("ctl-other")) == []
    counted = await ok(node, "list", "--json", "--label", "team=a", "--counts")
    assert {k: v for k, v in counted["counts"].items() if v} == {"PENDING": 1, "PAUSED": 1}

    # Pages of one: ctl follows next up to its limit, and says where to go on.
    monkeypatch.setattr(ctl_module, "MAX_PAGE", 1)
    first = await ok(node, "list", "--json", "--topic", topic, "--limit", "2")
    assert len(first["schedules"]) == 2 and first["next"] is not None
    rest = await ok(node, "list", "--json", "--topic", topic, "--after", first["next"])
    assert rest["next"] is None
    assert sorted(s["id"] for s in first["schedules"] + rest["schedules"]) == ["a1", "a2", "b1"]

    code, out = await ctl(node, "list", "--label", "team=b")
    assert code == 0
    _, row, total = out.splitlines()
    assert row.split()[:2] == ["b1", "PENDING"] and row.split()[-2:] == [topic, "team=b"]
    assert total == "1 schedule(s)"
    assert "invalid_request" in await refused(node, "list", "--status", "ASLEEP")


async def test_pause_resume_reschedule_and_trigger_round_trip(start_node: NodeFactory) -> None:
    node = await start_node()
    topic = unique("ctl-verbs")
    created = await ok(node, "schedule", topic, "--in", "3600", "--id", "order:7")
    assert created["version"] == 1
    paused = await ok(node, "pause", "order:7")
    assert paused["status"] == "PAUSED" and paused["version"] == 2
    assert (await get_view(node, "order:7"))["status"] == "PAUSED"
    again = await ok(node, "pause", "order:7")  # idempotent: no write
    assert again["status"] == "PAUSED" and again["version"] == 2

    assert "invalid_state" in await refused(node, "trigger", "order:7")  # resume it first
    later = at(7200)
    err = await refused(node, "reschedule", "order:7", "--at", later, "--if-match", "1")
    assert "HTTP 412" in err and "version_mismatch" in err
    assert (await get_view(node, "order:7"))["executeAt"] == created["executeAt"]
    moved = await ok(node, "reschedule", "order:7", "--at", later, "--if-match", "2")
    assert moved["executeAt"] == later and moved["status"] == "PAUSED" and moved["version"] == 3
    assert (await get_view(node, "order:7"))["executeAt"] == later

    resumed = await ok(node, "resume", "order:7", "--if-match", "3")
    assert resumed["status"] == "PENDING" and resumed["version"] == 4
    assert (await ok(node, "resume", "order:7"))["version"] == 4  # idempotent
    triggered = await ok(node, "trigger", "order:7", "--if-match", "4")
    assert triggered["status"] in {"PENDING", "IN_FLIGHT", "DELIVERED"}
    assert triggered["executeAt"] < later
    delivered = await reaches(node, "order:7", "DELIVERED")
    assert delivered["executeAt"] == triggered["executeAt"]
    assert "invalid_state" in await refused(node, "pause", "order:7")
    assert "invalid_state" in await refused(node, "reschedule", "order:7", "--in", "60")
    assert "not_found" in await refused(node, "pause", "missing")


async def test_resume_past_the_deadline_expires_it(start_node: NodeFactory) -> None:
    node = await start_node()
    status, _ = await node.request(
        "POST",
        "/v1/schedules",
        json={"id": "late", "topic": unique("ctl-expiry"), "executeAt": at(3600),
              "payload": 1, "expireAfter": "PT1M"},
    )  # fmt: skip
    assert status == 201
    await ok(node, "pause", "late")
    # While paused, its time (and the deadline with it) moves an hour back.
    moved = await ok(node, "reschedule", "late", "--at", at(-3600))
    assert moved["status"] == "PAUSED" and moved["deadline"] < at(0)
    expired = await ok(node, "resume", "late")
    assert expired["status"] == "EXPIRED"
    assert (await get_view(node, "late"))["status"] == "EXPIRED"
    assert "invalid_state" in await refused(node, "resume", "late")


async def test_retry_redrives_a_failed_schedule(
    start_node: NodeFactory, servers: EmbeddedServers, database_name: str
) -> None:
    topic = unique("ctl-retry")
    node = Node(make_config(servers, database_name, max_attempts="1"))
    failing = FailingPublisher(node.publisher, topic, {"doomed": 1})
    node.publisher = node.poller.publisher = failing
    handle = await start_node(node)

    await ok(handle, "schedule", topic, "--in", "3600", "--id", "waiting")
    assert "invalid_state" in await refused(handle, "retry", "waiting")  # not failed
    await ok(handle, "schedule", topic, "--in", "0", "--id", "doomed")
    failed = await reaches(handle, "doomed", "DELIVERY_FAILED")
    assert "injected failure" in failed["lastError"]

    failing.failures.clear()  # the broker would take it now
    redriven = await ok(handle, "retry", "doomed", "--if-match", str(failed["version"]))
    assert redriven["status"] in {"PENDING", "IN_FLIGHT", "DELIVERED"}
    assert redriven["version"] > failed["version"]
    delivered = await reaches(handle, "doomed", "DELIVERED")
    assert delivered["attempts"] == 1 and delivered["lastError"] is None
    assert "invalid_state" in await refused(handle, "retry", "doomed")


async def test_bulk_cancel_repeats_while_more_and_spares_the_rest(
    start_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node cancels at most BULK_CANCEL_LIMIT a call: made small, five
    # matches take ctl more than one call.
    monkeypatch.setattr(schedule_store, "BULK_LIMIT", 2)
    monkeypatch.setattr(schedule_store, "BULK_BATCH", 2)
    node = await start_node()
    topic = unique("ctl-bulk")
    for n in range(5):
        await ok(node, "schedule", topic, "--in", "3600", "--id", f"r1-{n}", "--label", "run=r1")
    await ok(node, "schedule", topic, "--in", "3600", "--id", "r2-0", "--label", "run=r2")
    await ok(node, "pause", "r1-0")  # PAUSED ones are cancelled too

    answer = await ok(node, "cancel", "--label", "run=r1")
    assert answer["cancelled"] == 5 and answer["calls"] > 1
    counts = (await ok(node, "list", "--json", "--label", "run=r1", "--counts"))["counts"]
    assert {k: v for k, v in counts.items() if v} == {"CANCELLED": 5}
    assert (await get_view(node, "r2-0"))["status"] == "PENDING"
    assert await ok(node, "cancel", "--label", "run=r1") == {
        "matched": 0, "changed": 0, "cancelled": 0, "calls": 1
    }  # fmt: skip

    # By id prefix, due before a time; and by key.
    await ok(node, "schedule", topic, "--in", "600", "--id", "pre-soon")
    await ok(node, "schedule", topic, "--in", "7200", "--id", "pre-late", "--key", "K")
    answer = await ok(node, "cancel", "--id-prefix", "pre-", "--due-before", at(3600))
    assert answer == {"matched": 1, "changed": 1, "cancelled": 1, "calls": 1}
    assert (await get_view(node, "pre-soon"))["status"] == "CANCELLED"
    assert (await get_view(node, "pre-late"))["status"] == "PENDING"
    assert (await ok(node, "cancel", "--key", "K"))["cancelled"] == 1
    assert (await get_view(node, "pre-late"))["status"] == "CANCELLED"

    # One paused schedule, by its id.
    await ok(node, "pause", "r2-0")
    assert (await ok(node, "cancel", "r2-0"))["status"] == "CANCELLED"
    assert "invalid_request" in await refused(node, "cancel", "--label", "bad name=x")
