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
    assert result["accepted"] + result["refused"] == 1000
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
