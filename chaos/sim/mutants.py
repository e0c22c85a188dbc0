"""The protections a simulation can take out, one at a time, to show that
its checker catches what each guards against (``--mutant NAME``; test-only:
a node never runs one). Each is a bug this project had or guards against."""

from __future__ import annotations

# The lease fence: every lease trusted until released (no local deadline,
# no loss on a renew that matched nothing) and a claim or mark written
# whatever token the schedule carries; a paused owner is a true zombie
# (the real harness's CHAOS_MODE=unfenced).
UNFENCED = "unfenced"
# Leases judged by the monotonic clock alone: a resumed owner whose clock
# stood still through a freeze claims under leases that are over.
MONOTONIC_ONLY = "monotonic-only-leases"

MUTANTS: dict[str, str] = {
    UNFENCED: "no lease fence: leases trusted to their release, writes unfenced",
    MONOTONIC_ONLY: "leases judged by the monotonic clock alone (a frozen clock misses a freeze)",
}
