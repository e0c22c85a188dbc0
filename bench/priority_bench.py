"""``python -m bench priority``: urgent work ahead of a backlog.

One node process on the embedded stack calls an HTTP receiver (in the
bench's process). ``lows`` schedules of priority 0 are stored due at once,
then ``highs`` of priority 9 due the same second: the receiver's arrival
order says where each high one went. The promise: every high one arrives
before the ``before``-th low one (the backlog takes many rounds to drain;
a high one waits at most for the round under way).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from bench.bulk_bench import http_cluster, serving, until
from bench.stack import iso


@dataclass(frozen=True)
class Plan:
    lows: int
    highs: int
    before: int
    nodes: int = 1


FULL = Plan(lows=5_000, highs=50, before=600)
QUICK = Plan(lows=300, highs=5, before=100)
# Seconds from the first batch stored to the due time (the lows stored first).
LEAD = 3.0


class Receiver:
    def __init__(self) -> None:
        self.arrivals: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(request.headers.get("schedule-id", ""))
        return web.Response(status=204)


async def run(plan: Plan) -> dict[str, Any]:
    receiver = Receiver()
    async with (
        serving(receiver.handle) as [base],
        http_cluster("priority", plan.nodes) as (api, _),
    ):
        url = f"{base}/hook"
        due = datetime.now(UTC) + timedelta(seconds=LEAD + plan.lows / 1000)
        print(f"  {plan.lows} low, then {plan.highs} high, due at once ...", flush=True)
        await api.create("low", plan.lows, url, due, priority=0)
        await api.create("high", plan.highs, url, due + timedelta(milliseconds=500), priority=9)
        stored_at = time.time()

        async def all_in() -> bool:
            return len(set(receiver.arrivals)) >= plan.lows + plan.highs

        await until(all_in, "every schedule delivered")
    return {
        "suite": "priority",
        "when": iso(datetime.now(UTC)),
        "plan": plan.__dict__,
        "stored_before_due_s": round(due.timestamp() - stored_at, 2),
        **placing(receiver.arrivals),
    }


def placing(arrivals: list[str]) -> dict[str, Any]:
    """Where the high ones arrived among the low ones: for each, how many
    low ones came before it."""
    lows_before, seen = [], 0
    for sid in arrivals:
        if sid.startswith("low"):
            seen += 1
        elif sid.startswith("high"):
            lows_before.append(seen)
    return {
        "lows_before_first_high": min(lows_before, default=None),
        "lows_before_last_high": max(lows_before, default=None),
        "highs": len(lows_before),
        "lows": seen,
    }


def aims(result: dict[str, Any]) -> dict[str, bool]:
    plan = result["plan"]
    last = result["lows_before_last_high"]
    return {
        f"every high one before the {plan['before']}th low one": result["highs"] == plan["highs"]
        and last is not None
        and last < plan["before"],
    }


def render(result: dict[str, Any]) -> str:
    plan = result["plan"]
    lines = [
        f"{plan['nodes']} node, {plan['lows']} of priority 0 then {plan['highs']} of priority 9 "
        f"due at once (stored {result['stored_before_due_s']} s before)",
        f"the high ones arrived after {result['lows_before_first_high']} to "
        f"{result['lows_before_last_high']} low ones (of {result['lows']})",
    ]
    lines += [f"  {'met   ' if ok else 'MISSED'} {aim}" for aim, ok in aims(result).items()]
    return "\n".join(lines)


__all__ = ["FULL", "QUICK", "render", "run"]
