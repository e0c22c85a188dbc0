"""The delivery benchmark's workloads, judging and ratios (bench/workloads.py,
bench/delivery_bench.py): pure, checked on hand-made deliveries."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import delivery_bench, workloads
from bench.stack import Delivery


def test_workload_shapes() -> None:
    assert workloads.burst(3).offsets == (0.0, 0.0, 0.0)
    spread = workloads.spread(4, 2.0)
    assert spread.offsets == (0.0, 0.5, 1.0, 1.5) and spread.span == 1.5
    steady = workloads.steady(rate=10, seconds=3, share=0.8)
    assert steady.name == "steady-80" and steady.count == 30
    assert steady.offsets[1] - steady.offsets[0] == pytest.approx(0.1)


def test_judge_counts_first_deliveries_duplicates_and_strangers() -> None:
    t0 = 1000.0
    deliveries = [
        Delivery("a", t0, t0 + 0.1),
        Delivery("b", t0, t0 + 0.3),
        Delivery("a", t0, t0 + 0.5),  # a repeat of a
        Delivery("zz", t0, t0 + 0.2),  # not part of the workload
    ]
    verdict = workloads.judge(["a", "b"], [t0, t0], t0, deliveries, cutoff=t0 + 9)
    assert (verdict.delivered, verdict.duplicates, verdict.unexpected) == (2, 1, 1)
    assert verdict.undelivered == 0 and not verdict.lateness_is_lower_bound
    # Finished: throughput runs to the last first delivery, not the cut-off.
    assert verdict.seconds == pytest.approx(0.3)
    assert verdict.records_per_s == pytest.approx(2 / 0.3)
    assert verdict.lateness_s["max"] == pytest.approx(0.3)


def test_judge_counts_the_undelivered_as_late_as_the_cutoff() -> None:
    t0 = 50.0
    deliveries = [Delivery("a", t0, t0 + 1.0)]
    verdict = workloads.judge(["a", "b", "c"], [t0, t0, t0 + 2], t0, deliveries, cutoff=t0 + 10)
    assert verdict.undelivered == 2 and verdict.lateness_is_lower_bound
    # Unfinished: throughput over the whole budget.
    assert verdict.records_per_s == pytest.approx(1 / 10)
    assert verdict.lateness_s["max"] == pytest.approx(10.0)  # b: due at T0, not seen by T0 + 10
    assert verdict.lateness_s["p50"] == pytest.approx(8.0)  # c: due at T0 + 2


def test_an_early_delivery_shows_as_negative_lateness() -> None:
    verdict = workloads.judge(["a"], [10.0], 10.0, [Delivery("a", 10.0, 9.5)], cutoff=20.0)
    assert verdict.lateness_s["max"] == pytest.approx(-0.5)


def test_ratio_is_nan_where_a_figure_is_missing() -> None:
    assert workloads.ratio(4.0, 2.0) == 2.0
    assert math.isnan(workloads.ratio(1.0, 0.0))
    assert math.isnan(workloads.ratio(math.nan, 1.0))


def row(system: str, n: int, workload: str, rps: float, p99: float) -> dict[str, Any]:
    return {
        "system": system,
        "processes": n,
        "workload": workload,
        "records_per_s": rps,
        "lateness_s": {"p50": p99 / 2, "p99": p99, "max": p99},
        "store_ops_per_record": 3.0,
        "cpu_s_per_1000": {"processes_total": 1.0, "store": 8.0},
    }


def synthetic(scheduler_three: float) -> dict[str, Any]:
    runs = [
        row("scheduler", 1, "burst", 100, 1.0),
        row("scheduler", 3, "burst", scheduler_three, 1.0),
        row("scheduler", 1, "spread", 30, 0.2),
        row("scheduler", 3, "spread", 30, 0.3),
        row("fetch", 1, "burst", 40, 5.0),
        row("fetch", 1, "spread", 30, 1.0),
    ]
    return {
        "runs": runs,
        "plan": {"nodes": [1, 3], "baseline_nodes": [1], "baselines": ["fetch"]},
        "store_limit": {"as_a_node": {"records_per_s": 200.0}},
        "store_floor": {"records_per_s": 400.0, "store_cpu_s_per_1000": 2.0},
    }


def test_ratios_and_aims_from_a_run() -> None:
    result = synthetic(scheduler_three=190)
    result["ratios"] = delivery_bench.compare(result)
    ratios = result["ratios"]
    assert ratios["scaling_over_one_node"] == {1: 1.0, 3: 1.9}
    assert ratios["burst_over_store_limit"][1] == 0.5
    # One node's burst over the same writes made raw: a quarter of their
    # pace, four times the store's CPU per record.
    assert ratios["burst_over_store_floor"] == {"records_per_s": 0.25, "store_cpu_per_record": 4.0}
    fetch = ratios["ours_over_baseline"]["fetch"]["1"]
    assert fetch["burst"]["records_per_s"] == 2.5
    assert fetch["spread"]["lateness_p99"] == pytest.approx(0.2)
    aims = delivery_bench.aims(result)
    assert aims["3 nodes / 1 node, burst"]["met"]
    assert aims["ours / fetch poller"]["met"]
    assert not aims["1 node / store limit"]["met"]
    # The worst spread p99 over all node counts is what is judged.
    spread = aims["spread lateness p99 (s)"]
    assert spread["measured"] == 0.3 and not spread["met"]
    # A baseline not run is not met, rather than met by default.
    assert not aims["ours / APScheduler 4"]["met"]


def test_scaling_aim_missed_when_three_nodes_do_not_scale() -> None:
    result = synthetic(scheduler_three=120)
    result["ratios"] = delivery_bench.compare(result)
    assert not delivery_bench.aims(result)["3 nodes / 1 node, burst"]["met"]


def test_the_hung_share_is_spread_evenly_through_the_run() -> None:
    assert delivery_bench.hung_marks(6, 0.5) == (False, True) * 3
    marks = delivery_bench.hung_marks(100, 0.1)
    assert sum(marks) == 10 and marks.index(True) == 9
    assert sum(delivery_bench.hung_marks(7, 0.0)) == 0
    assert all(delivery_bench.hung_marks(7, 1.0))
    with pytest.raises(ValueError):
        delivery_bench.hung_marks(3, 1.5)


def test_an_isolation_run_takes_a_share_and_hangs_less_than_its_timeout() -> None:
    with pytest.raises(ValueError, match="share"):
        delivery_bench.Isolation(count=10, seconds=1, hung_share=1.0, hang=30, tail=5)
    with pytest.raises(ValueError, match="timeout"):
        delivery_bench.Isolation(count=10, seconds=1, hung_share=0.5, hang=60, tail=5)


def late(p50: float, p99: float) -> dict[str, Any]:
    return {"lateness_s": {"p50": p50, "p99": p99, "max": p99}}


def test_isolation_figures_set_b_beside_a_hung_host_over_b_alone() -> None:
    figures = delivery_bench.isolation_figures(late(0.02, 0.3), late(0.02, 0.2), [5, 7, 5, 9])
    assert figures["b_p99_ratio"] == pytest.approx(1.5)
    assert figures["b_p99_added_s"] == pytest.approx(0.1)
    assert (figures["hung_a_schedules"], figures["hung_a_largest_bucket"]) == (4, 2)
    assert not figures["view_may_fill"]
    crowded = [3] * delivery_bench.READ_FLOOR + [4]
    assert delivery_bench.isolation_figures(late(0, 1), late(0, 1), crowded)["view_may_fill"]
    assert delivery_bench.largest_bucket([]) == 0


def test_http_rows_are_set_over_the_kafka_rows_of_the_same_node_count() -> None:
    result = synthetic(scheduler_three=190)
    result["runs"] += [
        row("scheduler-http", 1, "burst", 50, 2.0),
        row("scheduler-http", 1, "spread", 30, 0.1),
        row("scheduler-http", 2, "burst", 40, 1.0),  # no Kafka row at N=2: no ratio
    ]
    result["plan"] |= {"http_nodes": [1, 2], "http_workloads": ["burst", "spread"]}
    ratios = delivery_bench.compare(result)["http_over_kafka"]
    assert ratios == {
        "1": {
            "burst": {"records_per_s": 0.5, "lateness_p99": 2.0},
            "spread": {"records_per_s": 1.0, "lateness_p99": pytest.approx(0.5)},
        }
    }
    # The HTTP rows change none of the Kafka ratios.
    assert delivery_bench.compare(result)["scaling_over_one_node"] == {1: 1.0, 3: 1.9}


def test_cpu_figures_per_thousand_records_and_share_of_a_core() -> None:
    used = {"processes": [2.0, 4.0], "store": [3.0], "receiver": [1.0]}
    figures = delivery_bench.cpu_figures(
        used, counted=2000, counted_for=10.0, destination="receiver"
    )
    assert figures["cpu_s_per_1000"] == {
        "per_process": [1.0, 2.0],
        "per_process_mean": 1.5,
        "processes_total": 3.0,
        "store": 1.5,
        "receiver": 0.5,
    }
    assert figures["busy"] == {"processes": [0.2, 0.4], "store": 0.3, "receiver": 0.1}
