"""``python -m chaos simulate``: seeds of the whole cluster in one process,
each judged by the chaos checker; a failing one printed with the command
that replays it, its faults and its first violation.

The simulation runs with a fixed PYTHONHASHSEED (the command starts itself
again with one where it has none): nothing it does may depend on the order
a set of strings happens to iterate in, and a replay must not either.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence

import structlog

from chaos.sim.mutants import MUTANTS
from chaos.sim.run import Outcome, simulate

HASH_SEED = "0"
TRACE_FAULTS = 12  # a failing seed's faults shown, at most


def seeds_of(text: str) -> list[int]:
    """``7`` or ``1-200``."""
    first, _, last = text.partition("-")
    low, high = int(first), int(last or first)
    if high < low:
        raise ValueError(f"{text}: the range runs backwards")
    return list(range(low, high + 1))


def run(seeds: Sequence[int], minutes: float, mutant: str, verbose: bool) -> int:
    """Every seed; 0 if all passed (or, with a mutant, if one was caught)."""
    # The nodes' own logs would be the simulation's noise: only its verdicts.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    began, simulated, failed = time.monotonic(), 0.0, []
    for seed in seeds:
        started = time.monotonic()
        outcome = simulate(seed, minutes, mutant=mutant)
        simulated += outcome.simulated
        if verbose or not outcome.passed:
            print(line(outcome, time.monotonic() - started))
        if not outcome.passed:
            failed.append(seed)
            print(trace(outcome, mutant))
            if mutant:
                break  # caught: the first seed that catches it is the answer
    wall = time.monotonic() - began
    ratio = simulated / wall if wall else 0.0
    print(
        f"{len(seeds) if not (mutant and failed) else seeds.index(failed[0]) + 1} seeds, "
        f"{simulated / 60:.0f} simulated minutes in {wall:.1f} s ({ratio:.0f}x): "
        f"{len(failed)} failed" + (f" (first {failed[0]})" if failed else "")
    )
    if mutant:
        return 0 if failed else 1
    return 1 if failed else 0


def line(outcome: Outcome, seconds: float) -> str:
    verdict = "ok" if outcome.passed else "FAILED"
    return (
        f"seed {outcome.seed}: {outcome.nodes} nodes, {outcome.simulated:.0f} s simulated "
        f"in {seconds:.1f} s: {verdict}  digest {outcome.digest}"
    )


def trace(outcome: Outcome, mutant: str) -> str:
    """What a failing seed needs to be looked into: its replay, its faults,
    its first violation."""
    replay = f"python -m chaos simulate --seed {outcome.seed}"
    if mutant:
        replay += f" --mutant {mutant}"
    lines = [f"  replay: {replay}", "  faults:"]
    for fault in outcome.faults[:TRACE_FAULTS]:
        target = f" {fault.target}" if fault.target else ""
        lines.append(f"    {fault.at:8.2f} s  {fault.kind}{target} for {fault.lasts:.1f} s")
    if len(outcome.faults) > TRACE_FAULTS:
        lines.append(f"    ... {len(outcome.faults) - TRACE_FAULTS} more")
    for name, count in outcome.violations().items():
        first = list(outcome.result.get(f"{name}_ids", []))[:5]
        lines.append(f"  violation: {name} = {count}, first {first}")
    return "\n".join(lines)


def main(seeds: str | None, seed: int | None, minutes: float, mutant: str,
         list_mutants: bool, verbose: bool) -> int:  # fmt: skip
    if list_mutants:
        print("\n".join(MUTANTS))
        return 0
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        argv = [sys.executable, "-m", "chaos", *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    chosen = [seed] if seed is not None else seeds_of(seeds or "1-200")
    return run(chosen, minutes, mutant, verbose or seed is not None)
