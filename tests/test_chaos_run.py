"""A short chaos scenario end to end with real node processes (what CI runs):
the zombie owner, paused past its lease and resumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.runner import Run, write
from chaos.scenario import load
from tests.test_chaos import Svgs

pytestmark = pytest.mark.slow


async def test_a_zombie_owner_paused_past_its_lease_loses_nothing(tmp_path: Path) -> None:
    scenario = load("zombie-pause").scaled(nodes=None, duration=40, rate=25)
    [pause] = scenario.steps
    assert pause.lasting > 10  # longer than the nodes' lease TTL
    result = await Run(scenario, tmp_path, seed=1).run()
    assert result["passed"], {k: result[k] for k in ("lost_ids", "early_ids", "refusals")}
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
    write(result, tmp_path / "out")
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
    # What breaks is exclusivity, not delivery.
    assert result["lost"] == 0


async def test_an_isolated_node_loses_nothing_and_rejoins(tmp_path: Path) -> None:
    # Network namespaces where this machine allows them (a cut link), else
    # the nodes' chaos-mode gossip filter; the report names which.
    scenario = load("isolate-one").scaled(nodes=None, duration=30, rate=20)
    result = await Run(scenario, tmp_path, seed=1).run()
    assert result["passed"], {k: result[k] for k in ("lost_ids", "early_ids", "refusals")}
    assert result["lost"] == result["stale_claims"] == 0
    assert result["network"].startswith(("network namespaces", "in-process gossip filter"))
    steps = [e["step"] for e in result["events"]]
    assert steps == [scenario.steps[0].label, "heal"]
    # The cut-off node's buckets moved while it was away; it was taken back.
    assert all(e["settled_after_s"] is not None for e in result["events"])
