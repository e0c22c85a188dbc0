"""The deterministic simulation (chaos/sim/): seeds of the whole cluster
under load and faults pass the chaos checker; a seed replays bit for bit,
in another process and under another hash seed; every mutant is caught;
a failing seed prints how to replay it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import structlog

from chaos.sim.cli import seeds_of
from chaos.sim.mutants import MUTANTS
from chaos.sim.run import simulate
from tests.helpers import ROOT

# The seeds make test runs, each 10 simulated minutes of load and faults.
SEEDS = range(1, 13)
# Within how many seeds each mutant must be caught.
CATCH_WITHIN = range(1, 6)


@pytest.fixture(autouse=True)
def quiet_nodes() -> Iterator[None]:
    """The simulated nodes' logs left out (as the command does), for this test only."""
    kept = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    yield
    structlog.configure(**kept)


def test_seeds_of_the_whole_cluster_pass_the_checker() -> None:
    failed = {}
    for seed in SEEDS:
        outcome = simulate(seed, minutes=10)
        assert outcome.simulated >= 600 and 1 <= outcome.nodes <= 7
        assert outcome.result["accepted"] > 2000 and outcome.result["delivered"] > 0
        if not outcome.passed:
            failed[seed] = outcome.violations()
    assert failed == {}


def test_the_seed_that_found_a_bucket_stranded_by_a_lost_answer_passes() -> None:
    # Seed 41: a lease take whose answer was lost left the bucket ours in
    # the store, unknown to the node, which then stopped wanting it; no other
    # node could take it while that node lived, and 35 schedules waited for
    # good (node/delivery/leases.py gives such buckets back).
    outcome = simulate(41, minutes=10)
    assert outcome.passed, outcome.violations()


def test_the_frozen_clock_seed_that_found_a_zombie_owner_passes() -> None:
    # Seed 8: a node paused with its monotonic clock stopped came back and
    # claimed under a lease another owner had taken (stale claims), until
    # leases ran out by the wall clock too (node/delivery/leases.py).
    assert simulate(8, minutes=10).passed
    assert not simulate(8, minutes=10, mutant="monotonic-only-leases").passed


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_every_mutant_is_caught_within_a_few_seeds_and_replays_alike(mutant: str) -> None:
    caught = next(
        (seed for seed in CATCH_WITHIN if not simulate(seed, minutes=10, mutant=mutant).passed),
        None,
    )
    assert caught is not None, f"{mutant} passed seeds {CATCH_WITHIN}"
    again = simulate(caught, minutes=10, mutant=mutant)
    assert not again.passed and again.violations()
    assert again.digest == simulate(caught, minutes=10, mutant=mutant).digest


def digest_in_a_process(seed: int, hash_seed: str) -> str:
    code = (
        "import logging, structlog\n"
        "structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))\n"
        f"from chaos.sim.run import simulate\nprint(simulate({seed}, minutes=3).digest)\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    return done.stdout.strip()


def test_a_seed_replays_bit_for_bit_in_another_process_whatever_the_hash_order() -> None:
    here = simulate(5, minutes=3).digest
    assert digest_in_a_process(5, "1") == digest_in_a_process(5, "2") == here
    assert simulate(6, minutes=3).digest != here


def test_a_failing_seed_prints_its_replay_faults_and_first_violation() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "chaos", "simulate", "--seed", "1", "--mutant", "unfenced"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # a mutant caught is what the run is for
    assert "replay: python -m chaos simulate --seed 1 --mutant unfenced" in done.stdout
    assert "violation: stale_claims" in done.stdout and "faults:" in done.stdout
    listed = subprocess.run([sys.executable, "-m", "chaos", "simulate", "--list-mutants"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listed.stdout.split() == list(MUTANTS)


def test_a_seed_range_is_read_as_written() -> None:
    assert seeds_of("7") == [7]
    assert seeds_of("1-3") == [1, 2, 3]
    with pytest.raises(ValueError):
        seeds_of("5-1")
