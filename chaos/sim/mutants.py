"""The protections a simulation can take out, one at a time, to show that
its checker catches what each guards against (``--mutant NAME``; test-only:
a node never runs one). Each is a bug this project had or guards against.

Some are settings of the simulated node (``chaos/sim/cluster.py`` reads
the name); the rest swap one statement of the store's for the run
(``applied``): the node's own code, one condition or write taken out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from node.store import statements
from node.store.memory import MemorySchedules

# The lease fence: every lease trusted until released (no local deadline,
# no loss on a renew that matched nothing) and a claim or mark written
# whatever token the schedule carries; a paused owner is a true zombie
# (the real harness's CHAOS_MODE=unfenced).
UNFENCED = "unfenced"
# Leases judged by the monotonic clock alone: a resumed owner whose clock
# stood still through a freeze claims under leases that are over.
MONOTONIC_ONLY = "monotonic-only-leases"
# What is due judged by the host's wall clock, not by the store's as the
# node estimates it: a node whose clock runs fast delivers early.
HOST_CLOCK = "due-by-host-clock"
# Marks written without waiting for the journal (w: 1): a
# store crash loses them, and the schedule is IN_FLIGHT again under its
# owner's live token, which no recovery of an older owner's work touches.
UNJOURNALED_MARKS = "unjournaled-marks"
# A claim that takes what it read whatever changed since: a PATCH that
# moved the schedule between the read and the claim goes out at the old time.
CLAIM_IGNORES_VERSION = "claim-ignores-version"
# Claims never published (a lease lost mid-batch, a claim whose answer was
# lost) left IN_FLIGHT, not put back: they wait for the sweep.
NO_PUT_BACK = "no-put-back"
# IN_FLIGHT work of an older token (a crashed or deposed owner's) never
# recovered by the new owner.
NO_RECOVERY = "no-recovery"
# A lease taken from a holder whose session is alive: two owners at once.
LEASE_STEAL = "leases-taken-from-live-holders"
# A cancel of a schedule in flight or delivered answered 200.
CANCEL_ANY = "cancel-whatever-the-status"

MUTANTS: dict[str, str] = {
    UNFENCED: "no lease fence: leases trusted to their release, writes unfenced",
    MONOTONIC_ONLY: "leases judged by the monotonic clock alone (a frozen clock misses a freeze)",
    HOST_CLOCK: "what is due judged by the host's wall clock, not the store's",
    UNJOURNALED_MARKS: "marks written without the journal: a store crash loses them",
    CLAIM_IGNORES_VERSION: "the claim without its version condition",
    NO_PUT_BACK: "abandoned claims not put back to PENDING",
    NO_RECOVERY: "no recovery of IN_FLIGHT work under older tokens",
    LEASE_STEAL: "leases taken from holders whose sessions are alive",
    CANCEL_ANY: "a cancel written whatever the schedule's status",
}


def _claimable_any_version(
    docs: Any, version: int, token: int, now: datetime, *, unfenced: bool
) -> dict[str, Any]:
    condition: dict[str, Any] = _ORIGINAL["claimable"](docs, version, token, now, unfenced=unfenced)
    condition.pop("version")
    return condition


async def _no_unclaim(self: MemorySchedules, claims: Any) -> int:
    return 0


def _left_behind_own_token_only(
    doc: dict[str, Any], token: int, stranded_before: datetime | None
) -> bool:
    if int(doc.get("token", 0)) < token:
        return False
    return bool(_ORIGINAL["left_behind"](doc, token, stranded_before))


def _takeable_from_anyone(
    lease: dict[str, Any], node_id: str, live_holders: Any, now: datetime
) -> bool:
    return bool(_ORIGINAL["lease_takeable"](lease, node_id, (), now))


def _cancellable_any_status(
    schedule_id: str, bucket_count: int, if_match: int | None
) -> dict[str, Any]:
    condition: dict[str, Any] = _ORIGINAL["cancellable"](schedule_id, bucket_count, if_match)
    condition.pop("status")
    return condition


_ORIGINAL: dict[str, Callable[..., Any]] = {
    "claimable": statements.claimable,
    "left_behind": statements.left_behind,
    "lease_takeable": statements.lease_takeable,
    "cancellable": statements.cancellable,
}
# Mutant -> (what is swapped, the attribute, its replacement).
_SWAPS: dict[str, tuple[Any, str, Any]] = {
    CLAIM_IGNORES_VERSION: (statements, "claimable", _claimable_any_version),
    NO_PUT_BACK: (MemorySchedules, "unclaim", _no_unclaim),
    NO_RECOVERY: (statements, "left_behind", _left_behind_own_token_only),
    LEASE_STEAL: (statements, "lease_takeable", _takeable_from_anyone),
    CANCEL_ANY: (statements, "cancellable", _cancellable_any_status),
}


@contextlib.contextmanager
def applied(mutant: str) -> Iterator[None]:
    """Within: ``mutant``'s statement swapped in, if it is one of those."""
    swap = _SWAPS.get(mutant)
    if swap is None:
        yield
        return
    owner, name, replacement = swap
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)
