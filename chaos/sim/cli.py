"""``python -m chaos simulate``: seeds of the whole cluster in one process,
each judged by the chaos checker; a failing one printed with the command
that replays it, its faults and its first violation.

The simulation runs with a fixed PYTHONHASHSEED (the command starts itself
again with one where it has none): nothing it does may depend on the order
a set of strings happens to iterate in, and a replay must not either.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence

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


def run(seeds: Sequence[int], minutes: float, mutant: str, verbose: bool, jobs: int = 1) -> int:
    """Every seed (``jobs`` at once, each in a process of its own, the
    verdicts in seed order); 0 if all passed (or, with a mutant, if one was
    caught)."""
    quiet()
    began, simulated, failed, done = time.monotonic(), 0.0, [], 0
    with _outcomes(seeds, minutes, mutant, jobs) as outcomes:
        for outcome, seconds in outcomes:
            done += 1
            simulated += outcome.simulated
            if verbose or not outcome.passed:
                print(line(outcome, seconds), flush=True)
            if not outcome.passed:
                failed.append(outcome.seed)
                print(trace(outcome, mutant), flush=True)
                if mutant:
                    break  # caught: the first seed that catches it is the answer
    wall = time.monotonic() - began
    ratio = simulated / wall if wall else 0.0
    print(
        f"{done} seeds, {simulated / 60:.0f} simulated minutes in {wall:.1f} s ({ratio:.0f}x): "
        f"{len(failed)} failed" + (f" (first {failed[0]})" if failed else "")
    )
    if mutant:
        return 0 if failed else 1
    return 1 if failed else 0


def every_mutant(seeds: Sequence[int], minutes: float, jobs: int = 1) -> int:
    """Each mutant over ``seeds`` until one catches it: a line each, with
    the first seed that did and the violation it showed; 0 if every one
    was caught."""
    quiet()
    escaped = []
    for mutant in MUTANTS:
        began, done, caught = time.monotonic(), 0, None
        with _outcomes(seeds, minutes, mutant, jobs) as outcomes:
            for outcome, _seconds in outcomes:
                done += 1
                if not outcome.passed:
                    caught = outcome
                    break
        took = f"{done} seeds, {time.monotonic() - began:.1f} s"
        if caught is None:
            escaped.append(mutant)
            print(f"{mutant:<32} NOT CAUGHT in seeds {seeds[0]}-{seeds[-1]} ({took})", flush=True)
            continue
        name, count = next(iter(caught.violations().items()))
        first = list(caught.result.get(f"{name}_ids", []))[:3]
        shown = f"{name} = {count}, first {first}"
        print(f"{mutant:<32} caught by seed {caught.seed:<4} {shown} ({took})", flush=True)
    return 1 if escaped else 0


def quiet() -> None:
    """The nodes' own logs would be the simulation's noise: only its verdicts."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def timed(seed: int, minutes: float, mutant: str) -> tuple[Outcome, float]:
    """One seed's outcome, and the seconds it took."""
    started = time.monotonic()
    outcome = simulate(seed, minutes, mutant=mutant)
    return outcome, time.monotonic() - started


@contextlib.contextmanager
def _outcomes(
    seeds: Sequence[int], minutes: float, mutant: str, jobs: int
) -> Iterator[Iterator[tuple[Outcome, float]]]:
    """Each seed's outcome, in seed order: here, or from ``jobs`` processes
    (each seed runs whole in one of them: its digest is the same)."""
    if jobs == 1:
        yield (timed(seed, minutes, mutant) for seed in seeds)
        return
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=quiet) as pool:
        yield pool.imap(functools.partial(timed, minutes=minutes, mutant=mutant), seeds)
        pool.terminate()  # what a caught mutant left running


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
        skew = f" by {fault.skew:+.1f} s" if fault.skew else ""
        lines.append(f"    {fault.at:8.2f} s  {fault.kind}{target}{skew} for {fault.lasts:.1f} s")
    if len(outcome.faults) > TRACE_FAULTS:
        lines.append(f"    ... {len(outcome.faults) - TRACE_FAULTS} more")
    for name, count in outcome.violations().items():
        first = list(outcome.result.get(f"{name}_ids", []))[:5]
        lines.append(f"  violation: {name} = {count}, first {first}")
    return "\n".join(lines)


def main(seeds: str | None, seed: int | None, minutes: float, mutant: str,
         list_mutants: bool, verbose: bool, jobs: int = 1,
         all_mutants: bool = False) -> int:  # fmt: skip
    if list_mutants:
        print("\n".join(MUTANTS))
        return 0
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        argv = [sys.executable, "-m", "chaos", *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    chosen = [seed] if seed is not None else seeds_of(seeds or "1-200")
    if all_mutants:
        return every_mutant(chosen, minutes, jobs)
    return run(chosen, minutes, mutant, verbose or seed is not None, jobs)
