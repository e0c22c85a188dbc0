"""The rebalancing scenario with real node processes: 3 nodes under load, a
4th joins, one is killed with SIGKILL, one leaves gracefully. Invariants
only; the lateness figures are measured by ``python -m chaos rebalance``."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.rebalance import CI, run

pytestmark = [pytest.mark.slow, pytest.mark.servers]


async def test_join_kill_and_leave_under_load_lose_nothing(tmp_path: Path) -> None:
    result = await run(CI, tmp_path)
    assert result["accepted"] == CI.schedules, result["refusals"]
    assert result["lost"] == 0, result["lost_ids"]
    # Repeats only for work in flight at the kill, each under a newer token.
    assert result["duplicates_unexplained"] == 0
    assert result["duplicates"] <= result["in_flight_bound"]
    # The killed node was noticed, and its buckets were served again.
    assert result["timeline_s"]["kill_detected_after"] > 0
    assert result["lateness_in_kill_window_s"]["count"] > 0
