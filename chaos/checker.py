"""The invariants of a chaos run, judged from what the load generator was
told (201s, cancellations) and what Kafka received. Pure: no IO, no clock.

* lost: accepted, not cancelled, never delivered;
* early: delivered before its executeAt;
* cancelled but delivered: a DELETE that answered 200 and a record anyway;
* duplicates: delivered more than once; each must be explained by a change
  of fencing token (a new owner took over) or a later attempt of the same
  owner, never by two copies under one (token, attempt): that would be two
  owners claiming with one token, which the fence exists to prevent. One
  exception is explained: copies on both sides of a database crash. Claims
  and completions are acknowledged before they are journaled (losing one
  only means delivering again), so the owner may claim the same schedule
  again with the same token and attempt number;
* stale claims: a delivery under token t of a schedule that fell due after
  a newer token t' of its bucket had already delivered something. Claims
  take only due schedules, so t claimed it while t' held the bucket: two
  live owners, the double claim the fence exists to prevent. (A former
  owner finishing a batch it claimed before losing the lease delivers only
  schedules due before the new owner's first delivery: never flagged.)
* vanished: seen in the topic during the run, gone when a fresh reader
  reads it again at the end (the broker lost an acknowledged record);
* lateness (first delivery - executeAt) overall and inside each fault's
  window, from the fault to the end of its recovery allowance.

A recurring schedule is judged occurrence by occurrence: each is a unit of
its own, ``<id>@<execute-at>``, expected once like a one-shot schedule (so a
missing occurrence is lost, a repeated one a duplicate to explain), and an
occurrence nobody expected (off the chain's grid, or past its end) is an
``unexpected_occurrence``: a chain that doubled or drifted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chaos.stats import percentile
from ring import bucket_for

# Between a recurring schedule's id and an occurrence's time in a unit's
# name; ids cannot contain it.
OCCURRENCE = "@"

# Record timestamps are milliseconds, taken on the publishing node's clock
# (the same host here): anything sooner than this before executeAt is early.
EARLY_TOLERANCE = 0.002


@dataclass(frozen=True)
class Delivery:
    schedule_id: str  # the unit: a schedule, or one occurrence of a recurring one
    token: int
    attempt: int
    at: float  # epoch seconds (the Kafka record timestamp)

    @property
    def schedule(self) -> str:
        return self.schedule_id.partition(OCCURRENCE)[0]


def occurrence(schedule_id: str, execute_at: str) -> str:
    """The unit name of one occurrence of a recurring schedule."""
    return f"{schedule_id}{OCCURRENCE}{execute_at}"


@dataclass(frozen=True)
class Window:
    label: str
    start: float  # epoch seconds
    end: float


def check(
    accepted: Mapping[str, float],
    cancelled: set[str],
    deliveries: Sequence[Delivery],
    windows: Sequence[Window] = (),
    *,
    buckets: int = 256,
    kept: set[str] | None = None,
    store_crashes: Sequence[float] = (),
) -> dict[str, Any]:
    """``accepted``: schedule id -> executeAt (epoch seconds); ``buckets``:
    the cluster's bucket count, to tell each schedule's bucket; ``kept``:
    the ids a fresh reader found in the topic at the end (None: not read);
    ``store_crashes``: when the database was killed (epoch seconds)."""
    by_id: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        by_id[delivery.schedule_id].append(delivery)
    lost = sorted(set(accepted) - cancelled - set(by_id))
    cancelled_delivered = sorted(cancelled & set(by_id))
    duplicates = {i: d for i, d in by_id.items() if len(d) > 1}
    repeated = {
        i: d for i, d in duplicates.items() if len({(x.token, x.attempt) for x in d}) < len(d)
    }
    across_crash = sorted(
        i
        for i, d in repeated.items()
        if any(min(x.at for x in d) <= crash <= max(x.at for x in d) for crash in store_crashes)
    )
    same_claim = sorted(set(repeated) - set(across_crash))
    lateness: list[tuple[float, float]] = []  # (executeAt, lateness)
    early: list[str] = []
    for schedule_id, execute_at in accepted.items():
        if schedule_id in by_id:
            first = min(d.at for d in by_id[schedule_id])
            if first < execute_at - EARLY_TOLERANCE:
                early.append(schedule_id)
            lateness.append((execute_at, max(0.0, first - execute_at)))
    stale = _stale_claims(accepted, deliveries, buckets)
    vanished = sorted(set(by_id) - kept) if kept is not None else []
    outside = [late for due, late in lateness if not any(w.start <= due <= w.end for w in windows)]
    return {
        "accepted": len(accepted),
        "cancelled": len(cancelled),
        "delivered": len(by_id),
        **_counted("lost", lost),
        **_counted("cancelled_delivered", cancelled_delivered),
        **_counted("early", sorted(early)),
        "duplicates": len(duplicates),
        **_counted("duplicates_same_claim", same_claim),
        "duplicates_across_store_crash": len(across_crash),
        **_counted("vanished", vanished),
        **_counted("stale_claims", stale),
        "unknown_deliveries": len(set(by_id) - set(accepted)),
        **_counted(
            "unexpected_occurrences",
            sorted(u for u in set(by_id) - set(accepted) if OCCURRENCE in u),
        ),
        "occurrences": sum(1 for u in accepted if OCCURRENCE in u),
        "lateness_s": _summary([late for _, late in lateness]),
        "lateness_outside_windows_s": _summary(outside),
        "lateness_points": sorted([round(due, 3), round(late, 4)] for due, late in lateness),
        "windows": [
            {
                "label": w.label,
                "start": w.start,
                "end": w.end,
                "lateness_s": _summary([late for due, late in lateness if w.start <= due <= w.end]),
            }
            for w in windows
        ],
    }


def passed(result: Mapping[str, Any]) -> bool:
    """The invariants that must hold whatever the faults."""
    return all(
        result[key] == 0
        for key in (
            "lost",
            "early",
            "cancelled_delivered",
            "duplicates_same_claim",
            "stale_claims",
            "vanished",
            "unexpected_occurrences",
        )
    )


def _counted(name: str, ids: list[str]) -> dict[str, Any]:
    """How many, and the first few ids to look up."""
    return {name: len(ids), f"{name}_ids": ids[:20]}


def _stale_claims(
    accepted: Mapping[str, float], deliveries: Sequence[Delivery], buckets: int
) -> list[str]:
    first_by_token: dict[tuple[int, int], float] = {}  # (bucket, token) -> first delivery
    for d in deliveries:
        key = (bucket_for(d.schedule, buckets), d.token)
        first_by_token[key] = min(d.at, first_by_token.get(key, d.at))
    by_bucket: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (bucket, token), first in first_by_token.items():
        by_bucket[bucket].append((token, first))
    stale = set()
    for d in deliveries:
        due = accepted.get(d.schedule_id)
        if due is None:
            continue
        newer = by_bucket[bucket_for(d.schedule, buckets)]
        if any(t > d.token and first < due - EARLY_TOLERANCE for t, first in newer):
            stale.add(d.schedule_id)
    return sorted(stale)


def _summary(values: list[float]) -> dict[str, float | int]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
    }
