"""Short chaos scenarios end to end with real node processes (what CI runs):
the zombie owner, paused past its lease and resumed; an isolated node; and
the soak scaled down to a minute, with auth and signed gossip."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from chaos.checker.model import facts
from chaos.history import CANCEL, INFO, OK, History
from chaos.lab.network import probe
from chaos.load import Api, Load
from chaos.run import Run, keep_failed_logs
from chaos.scenario import load
from chaos.settle import needs_views, read_views, settle
from chaos.summary import write
from tests.conftest import NodeFactory
from tests.helpers import Svgs

pytestmark = [pytest.mark.slow, pytest.mark.servers]


def evidence(result: dict[str, Any], data_dir: Path) -> str:
    """What a failed run's message shows: the checker's findings, then every
    node's log lines that name a lost schedule or warn (lease losses,
    abandoned batches, recoveries with their ids)."""
    found = {
        k: result.get(k)
        for k in (
            "lost_ids",
            "early_ids",
            "early_received_ids",
            "duplicates_same_claim_ids",
            "stale_claims_ids",
            "garbage_failed",
            "refusals",
            "events",
        )
    }
    ids = [re.escape(i) for i in result["lost_ids"][:5]]
    named = re.compile(rf"\b({'|'.join(ids)})\b") if ids else None
    lines = []
    for log in sorted((data_dir / "logs").glob("node-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "[warning" in line or "[error" in line or (named and named.search(line)):
                lines.append(f"{log.stem}: {line[:300]}")
    return f"{found}\n" + "\n".join(lines[-80:])


async def test_a_zombie_owner_paused_past_its_lease_loses_nothing(tmp_path: Path) -> None:
    scenario = load("zombie-pause").scaled(nodes=None, duration=40, rate=25)
    [pause] = scenario.steps
    assert pause.lasting > 10  # longer than the nodes' lease TTL
    run = Run(scenario, tmp_path, seed=1)
    result = await run.run()
    assert result["passed"], evidence(result, tmp_path)
    assert result["accepted"] - result["occurrences"] + result["refused"] == 1000
    # Eight recurring schedules ran through the pause, every occurrence owed once.
    assert result["chains"] == 8 and result["occurrences"] >= 8 * 15
    assert result["refused"] == 0, result["refusals"]
    assert result["lost"] == result["early"] == result["cancelled_delivered"] == 0
    # The paused node's buckets were taken over while it slept, and it was
    # taken back in after it woke.
    steps = [e["step"] for e in result["events"]]
    assert steps == [pause.label, "resume"]
    assert all(e["settled_after_s"] is not None for e in result["events"])
    [window] = result["windows"]
    assert window["lateness_s"]["count"] > 0
    # The report a person opens: the three plots, with the pause and resume marked.
    write(result, tmp_path / "out", run.judged)
    # The history beside it reads back to what was judged.
    again = History.read(tmp_path / "out" / "history.jsonl")
    assert [op.as_dict() for op in again] == [op.as_dict() for op in run.judged]
    assert facts(again).accepted == facts(run.judged).accepted
    page = Svgs()
    page.feed((tmp_path / "out" / "report.html").read_text())
    assert set(page.plots) == {"lateness", "buckets", "members"}
    assert all(plot["event"] == 2 for plot in page.plots.values())
    assert page.plots["buckets"]["series"] == 3


async def test_without_the_fence_the_zombie_double_claims_and_the_checker_says_so(
    tmp_path: Path,
) -> None:
    # CHAOS_MODE=unfenced: no token conditions, no local lease checks. The
    # paused owner wakes up and keeps claiming in buckets a newer owner holds.
    scenario = load("zombie-pause").scaled(nodes=None, duration=30, rate=20)
    result = await Run(scenario, tmp_path, seed=1, unfenced=True, settle_within=15).run()
    assert not result["passed"]
    assert result["stale_claims"] > 0, result["events"]
    # Delivery can break too (the checker would count it as lost), though
    # rarely, so it is not asserted either way: a newer owner that hands a
    # bucket back while a claim of its own is on the way abandons that claim
    # for the next owner to recover, and the woken zombie never recovers it,
    # since it never retakes the lease it trusts.


async def test_an_isolated_node_loses_nothing_and_rejoins(tmp_path: Path) -> None:
    # Network namespaces where this machine allows them (a cut link), else
    # the nodes' chaos-mode gossip filter; the report names which.
    scenario = load("isolate-one").scaled(nodes=None, duration=30, rate=20)
    result = await Run(scenario, tmp_path, seed=1).run()
    assert result["passed"], evidence(result, tmp_path)
    assert result["lost"] == result["stale_claims"] == 0
    assert result["network"].startswith(("network namespaces", "in-process gossip filter"))
    steps = [e["step"] for e in result["events"]]
    assert steps == [scenario.steps[0].label, "heal"]
    # The cut-off node's buckets moved while it was away; it was taken back.
    assert all(e["settled_after_s"] is not None for e in result["events"])


async def test_a_delete_without_an_answer_is_settled_by_asking_a_node_afterwards(
    start_node: NodeFactory,
) -> None:
    # A node paused while a DELETE waited for its answer may have cancelled
    # the schedule: the run asks afterwards instead of calling it lost.
    node = await start_node()
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    history = History(started=0.0)
    for schedule_id in ("s1", "s2", "never-stored"):
        body = {"id": schedule_id, "topic": "t", "executeAt": later, "payload": 1}
        if schedule_id != "never-stored":
            assert (await node.request("POST", "/v1/schedules", json=body))[0] == 201
        created = history.invoke(schedule_id, "create", 1.0, schedule_id, executeAt=2.0)
        history.complete(created, OK, 1.0)
    assert (await node.request("DELETE", "/v1/schedules/s1"))[0] == 200
    for schedule_id in ("s1", "s2", "never-stored"):
        cancel = history.invoke(schedule_id, CANCEL, 3.0, schedule_id)
        history.complete(cancel, INFO, 4.0, status=None)
    views = await read_views(lambda: [node.url], needs_views(history), {})
    settled = settle(history, views)
    assert facts(settled).cancelled == {"s1"}
    types = {c.schedule: c.type for c in settled.calls(CANCEL)}
    assert types == {"s1": OK, "s2": "fail", "never-stored": INFO}  # no node could say


async def test_a_delete_answered_with_a_5xx_is_settled_like_one_without_an_answer() -> None:
    # The store failed mid-call (everything, seed 3: the cancel landed, the
    # read after it did not, so the node answered 503): not a refusal, an
    # unknown outcome, settled by asking after the run.
    answers = {"s-503": 503, "s-200": 200, "s-409": 409}

    async def delete(request: web.Request) -> web.Response:
        return web.json_response({}, status=answers[request.match_info["id"]])

    app = web.Application()
    app.router.add_delete("/v1/schedules/{id}", delete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    history = History(started=0.0)
    try:
        async with Api(lambda: [f"http://127.0.0.1:{port}"], random.Random(1)) as api:
            load = Load(history, api, random.Random(1), topic="t", rate=1, duration=1)
            for schedule_id in answers:
                await load._cancel(schedule_id)
    finally:
        await runner.cleanup()
    types = {c.schedule: c.type for c in history.calls(CANCEL)}
    assert types == {"s-503": INFO, "s-200": OK, "s-409": "fail"}
    assert needs_views(history) == {"s-503"}


# The soak's drawn timeline at this seed, scaled to a minute, has every
# step kind of issue 17 (the draw is the same for the same seed; at 60 s
# only some seeds fit all four among the dozen or so steps).
SOAK_SEED = 38
NEW_STEPS = {"cut-store", "cut-broker", "skew-clock", "garbage-gossip"}


async def test_the_soak_scaled_to_a_minute_loses_nothing_with_auth_and_signed_gossip(
    tmp_path: Path,
) -> None:
    scenario = load("soak").scaled(nodes=4, duration=60, rate=20)
    drawn = {step.do for step in scenario.timeline(SOAK_SEED)}
    assert drawn >= NEW_STEPS, f"seed {SOAK_SEED} no longer draws {NEW_STEPS - drawn}"
    result = await Run(scenario, tmp_path, seed=SOAK_SEED).run()
    assert result["passed"], evidence(result, tmp_path)
    assert result["auth"] and result["cluster_keys"]
    assert result["refused"] == 0, result["refusals"]
    assert result["lost"] == result["early"] == result["early_received"] == 0
    assert result["stale_claims"] == result["duplicates_same_claim"] == 0
    played = {e["do"] for e in result["events"] if "skipped" not in e}
    # A step that names a random node finds none free while a restart is
    # still coming up on a slow machine (CI once skipped cut-broker so):
    # skipped for that reason only, and at most one kind of them.
    no_target = {
        e["do"]
        for e in result["events"]
        if str(e.get("skipped", "")).startswith("no such running node")
    }
    assert {"skew-clock", "garbage-gossip"} <= played, result["events"]
    if probe() is None:  # the cuts need network namespaces
        assert played | no_target >= NEW_STEPS, result["events"]
        assert len(NEW_STEPS - played) <= 1, result["events"]
        assert {"reconnect", "heal"} & played
    [flood, *_] = [e for e in result["events"] if e["do"] == "garbage-gossip"]
    report = flood["garbage"]
    assert report["passed"] and report["signed"] and report["datagrams"] > 100
    # Signed gossip: most noise fails the MAC; signed malformed packets reach the decoder.
    assert report["dropped"].get("mac", 0) > 0 and report["dropped"].get("malformed", 0) > 0
    [skew, *_] = [e for e in result["events"] if e["do"] == "skew-clock"]
    assert skew["skew_s"] and skew["settled_after_s"] is not None


def test_a_failed_runs_logs_are_kept_beside_its_summary_and_a_passed_runs_are_not(
    tmp_path: Path,
) -> None:
    """Without --keep a run's data directory goes with it: a failed run's
    logs are copied to the summary's folder first, a passed run's are not,
    nor anything without --out."""
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    (data / "logs" / "node-1.log").write_text("a line\n")
    (data / "mongo").mkdir()
    out = tmp_path / "out"
    assert keep_failed_logs({"passed": True}, data, out) is None
    assert not (out / "logs").exists()
    assert keep_failed_logs({"passed": False}, data, None) is None
    kept = keep_failed_logs({"passed": False}, data, out)
    assert kept == out / "logs"
    assert (kept / "node-1.log").read_text() == "a line\n"
    assert not (out / "mongo").exists()
