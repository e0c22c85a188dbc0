"""The delivery workloads and how a run of one is judged. Pure: no IO, no clock.

A workload is when each of its schedules falls due, as seconds after the
run's T0. A run is judged from what a consumer of the topic saw (one
``Delivery`` per record) and when the run stopped watching: throughput,
lateness, duplicates, and what had not arrived by then. A system too slow
to finish within the run's budget is judged on what it did within it; its
undelivered schedules count in the lateness as late as the cut-off at
least (the figure is then a lower bound, and says so).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.stack import Delivery, summary


@dataclass(frozen=True)
class Workload:
    name: str
    offsets: tuple[float, ...]  # seconds after T0 that each schedule is due

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def span(self) -> float:
        return max(self.offsets, default=0.0)


def burst(count: int) -> Workload:
    """``count`` schedules due at the same instant."""
    return Workload("burst", (0.0,) * count)


def spread(count: int, seconds: float) -> Workload:
    """``count`` schedules due evenly over ``seconds``."""
    step = seconds / count
    return Workload("spread", tuple(i * step for i in range(count)))


def steady(rate: float, seconds: float, share: float) -> Workload:
    """A constant ``rate`` per second for ``seconds``; ``share`` names it
    (the fraction of the system's measured capacity it stands for)."""
    count = max(1, round(rate * seconds))
    return Workload(f"steady-{round(share * 100)}", tuple(i / rate for i in range(count)))


@dataclass(frozen=True)
class Judgement:
    expected: int
    delivered: int  # distinct schedules seen
    duplicates: int  # records beyond the first per schedule
    unexpected: int  # records of schedules not in the workload
    undelivered: int  # not seen by the cut-off
    seconds: float  # T0 until the last first delivery (or the cut-off when unfinished)
    records_per_s: float  # distinct schedules delivered per second of that
    lateness_s: dict[str, float]  # p50, p99, max, mean of first deliveries
    lateness_is_lower_bound: bool  # undelivered ones counted as late as the cut-off
    first_lateness_s: float  # the earliest record's lateness: how soon delivery began

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def judge(
    ids: Sequence[str],
    due: Sequence[float],
    t0: float,
    deliveries: Sequence[Delivery],
    cutoff: float,
) -> Judgement:
    """Judge a run: ``ids[i]`` was due at ``due[i]`` (epoch seconds), the run
    began at ``t0`` and stopped watching at ``cutoff``."""
    due_of = dict(zip(ids, due, strict=True))
    first: dict[str, float] = {}
    duplicates = unexpected = 0
    for delivery in sorted(deliveries, key=lambda d: d.at):
        if delivery.schedule_id not in due_of:
            unexpected += 1
        elif delivery.schedule_id in first:
            duplicates += 1
        else:
            first[delivery.schedule_id] = delivery.at
    undelivered = [i for i in ids if i not in first]
    # A record stamped before its due time would show as negative lateness:
    # kept as it is, so an early delivery is visible rather than hidden.
    lateness = [at - due_of[i] for i, at in first.items()]
    lateness += [max(0.0, cutoff - due_of[i]) for i in undelivered]
    end = cutoff if undelivered or not first else max(first.values())
    seconds = max(end - t0, 1e-9)
    return Judgement(
        expected=len(ids),
        delivered=len(first),
        duplicates=duplicates,
        unexpected=unexpected,
        undelivered=len(undelivered),
        seconds=seconds,
        records_per_s=len(first) / seconds,
        lateness_s=summary(lateness),
        lateness_is_lower_bound=bool(undelivered),
        first_lateness_s=min((at - due_of[i] for i, at in first.items()), default=math.nan),
    )


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs; NaN where either is missing or theirs is zero."""
    if theirs == 0 or math.isnan(ours) or math.isnan(theirs):
        return math.nan
    return ours / theirs


__all__ = ["Judgement", "Workload", "burst", "judge", "ratio", "spread", "steady"]
