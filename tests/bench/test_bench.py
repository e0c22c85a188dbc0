"""The benchmarks run and compute their ratios (what CI checks of bench/:
figures are the benchmarks' business, not the tests')."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import bulk_bench, delivery_bench, flow_bench, idle_bench, priority_bench
from bench.failover_bench import resumption
from bench.stack import OPERATION_KINDS, Delivery, Servers
from tests.conftest import EmbeddedServers


def test_the_command_line_writes_a_suites_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "ring", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "== ring ==" in run.stdout and "balance" in run.stdout
    figures = json.loads(out.read_text())
    assert figures["quick"] is True
    runs = figures["suites"]["ring"]["runs"]
    assert [run["buckets"] for run in runs] == [256, 4096]
    for run in runs:
        assert [r["members"] for r in run["rows"]] == list(range(2, 51))


def test_an_unknown_suite_is_refused() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "nosuch"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "invalid choice" in run.stderr


def doc(schedule_id: str, bucket: int) -> dict[str, object]:
    return {"_id": schedule_id, "bucket": bucket}


def test_resumption_is_the_first_delivery_after_the_kill_per_busy_bucket() -> None:
    kill = 100.0
    docs = [
        doc("a", 1),  # the dead node's bucket 1: due at the kill, delivered 4 s later
        doc("b", 1),
        doc("c", 2),  # its bucket 2: due 0.5 s after, delivered 6 s after the kill
        doc("d", 3),  # its bucket 3: nothing due in the first second: not judged
        doc("e", 9),  # a survivor's bucket
    ]
    due = [kill, kill + 0.2, kill + 0.5, kill + 5.0, kill + 1.0]
    deliveries = [
        Delivery("a", kill, kill + 4.0),
        Delivery("b", kill + 0.2, kill + 4.1),
        Delivery("c", kill + 0.5, kill + 6.0),
        Delivery("d", kill + 5.0, kill + 9.0),
        Delivery("e", kill + 1.0, kill + 1.1),
    ]
    judged = resumption(docs, due, deliveries, {1, 2, 3}, kill)
    assert judged["buckets_judged"] == 2
    assert judged["resumed_s"]["max"] == pytest.approx(6.0)
    assert judged["victim_lateness_s"]["max"] == pytest.approx(5.5)  # c
    assert judged["survivor_lateness_during_gap_s"]["max"] == pytest.approx(0.1)


@pytest.mark.slow
@pytest.mark.servers  # a whole stack: store, broker, nodes, receivers
def test_the_delivery_suite_runs_every_system_and_computes_every_ratio() -> None:
    plan = delivery_bench.Plan(
        nodes=(1,),
        baseline_nodes=(1,),
        baselines=("fetch", "fua", "apscheduler"),
        burst=60,
        spread=30,
        spread_seconds=2,
        steady_seconds=2,
        steady_shares=(0.5,),
        tail=60,
        baseline_tail=5,
        baseline_steady_tail=2,
        history_cost=False,
        # Steady loads are the same code for every system: the scheduler's suffice.
        baseline_workloads=("burst", "spread"),
    )
    result = asyncio.run(delivery_bench.run(plan))
    systems = {(r["system"], r["workload"]) for r in result["runs"]}
    assert ("scheduler", "steady-50") in systems
    for system in ("scheduler", "fetch", "fua", "apscheduler"):
        assert {(system, w) for w in ("burst", "spread")} <= systems
    for row in result["runs"]:
        assert row["unexpected"] == 0, row
        assert row["ready_s_before_t0"] > 0, row  # stored before due: delivery is measured
        if row["system"] == "scheduler":
            assert row["undelivered"] == 0 and row["duplicates"] == 0, row
    for baseline, by_n in result["ratios"]["ours_over_baseline"].items():
        for workload, figures in by_n["1"].items():
            assert not any(math.isnan(v) for v in figures.values()), (baseline, workload)
    assert len(result["aims"]) == 6
    memory = result["memory_store"]
    assert (memory["system"], memory["processes"], memory["workload"]) == (
        "scheduler-memory", 1, "burst",
    )  # fmt: skip
    assert memory["undelivered"] == 0 and memory["duplicates"] == 0, memory
    assert not any(math.isnan(v) for v in result["ratios"]["memory_over_embedded_store"].values())
    text = delivery_bench.render(result)
    assert "vs apscheduler" in text and "aim " in text and "memory store over embedded" in text


@pytest.mark.slow
@pytest.mark.servers  # a whole stack: store, broker, nodes, receivers
def test_the_delivery_suite_delivers_by_http_and_measures_a_hung_hosts_neighbour() -> None:
    plan = dataclasses.replace(
        delivery_bench.HTTP_QUICK,
        burst=60,
        spread=30,
        spread_seconds=2,
        isolation=delivery_bench.Isolation(count=60, seconds=2, hung_share=0.5, hang=30, tail=30),
    )
    result = asyncio.run(delivery_bench.run(plan))
    rows = {(r["system"], r["destination"], r["workload"]): r for r in result["runs"]}
    assert set(rows) == {
        ("scheduler", "kafka", "burst"), ("scheduler", "kafka", "spread"),
        ("scheduler-http", "http", "burst"), ("scheduler-http", "http", "spread"),
    }  # fmt: skip
    for row in result["runs"]:
        assert row["undelivered"] == 0 and row["duplicates"] == 0 and row["unexpected"] == 0, row
    http = result["ratios"]["http_over_kafka"]["1"]
    assert not any(math.isnan(v) for f in http.values() for v in f.values())
    isolation = result["isolation"]
    for key in ("b_beside_hung_a", "b_alone"):
        # Only B's schedules are judged, and all of them arrived.
        assert (isolation[key]["expected"], isolation[key]["undelivered"]) == (30, 0)
    assert isolation["hung_a_schedules"] == 30 and not math.isnan(isolation["b_p99_ratio"])
    assert result["aims"] == {}  # no baseline run: nothing to judge against
    text = delivery_bench.render(result)
    assert "HTTP over Kafka, 1 node burst: rec/s" in text and "B beside hung A" in text


def test_the_scale_suite_judges_each_aim_from_its_rows() -> None:
    from bench.scale_bench import aims, ratios

    def row(n: int, due: int, per_s: float, store_cpu: float, read: float, first: float) -> Any:
        return {
            "processes": n,
            "expected": due,
            "records_per_s": per_s,
            "cpu_s_per_1000": {"store": store_cpu},
            "documents_read_per_record": read,
            "first_lateness_s": first,
        }

    result: dict[str, Any] = {
        "bursts": [row(1, 20000, 100, 8.0, 1.0, 0.5), row(2, 20000, 90, 8.8, 1.1, 0.6),
                   row(3, 20000, 120, 9.5, 1.3, 0.4)],
        "wide": [row(1, 20000, 96, 8.0, 1.0, 0.5), row(3, 20000, 110, 9.5, 1.3, 0.4)],
        "firsts": [row(1, 2000, 100, 8, 1.0, 0.7), row(3, 2000, 100, 8, 1.0, 1.4)],
        "empty": {"idle_ops_per_s": 100.0, "records_per_s": 100.0},
        "backlog": {"idle_ops_per_s": 130.0, "records_per_s": 90.0},
    }  # fmt: skip
    result["ratios"] = ratios(result)
    assert result["ratios"]["throughput_over_one_node"] == {1: 1.0, 2: 0.9, 3: 1.2}
    verdicts = {a["aim"]: a["met"] for a in aims(result)}
    assert [v for k, v in verdicts.items() if k.startswith("documents read")] == [True, True, False]
    # N = 2 is slower, but the store was the limit and its CPU per record held.
    assert [v for k, v in verdicts.items() if k.startswith("burst throughput")] == [True, True]
    assert [v for k, v in verdicts.items() if "first record" in k] == [True, False]
    assert [v for k, v in verdicts.items() if k.startswith("future backlog")] == [True, False]
    # B = 4,096 against B = 256 at the same N: 0.96x holds, 0.92x does not.
    assert result["ratios"]["wide_throughput_over_256"] == pytest.approx({1: 0.96, 3: 110 / 120})
    assert [v for k, v in verdicts.items() if "B = 4096" in k] == [True, False]


def test_the_store_floor_claims_and_marks_every_record_in_one_statement_each(
    servers: EmbeddedServers,
) -> None:
    stack = Servers(
        servers.mongo_uri, servers.kafka_bootstrap, servers.data_dir.parent, servers.mongo.pid, 0
    )
    floor = asyncio.run(delivery_bench.store_floor(stack, 120))
    # A filter or an update off the node's fields would write fewer (or none).
    assert (floor["claimed"], floor["records"]) == (120, 120)
    assert floor["records_per_s"] > 0 and floor["store_cpu_s_per_1000"] >= 0
    assert set(floor["seconds_by_write"]) == {"claim", "mark_delivered"}


def test_the_idle_suite_sets_each_bucket_count_over_the_first_at_the_same_n() -> None:
    def row(
        n: int, b: int, ops: float, store: float, nodes: float, held: int, polling: bool = False
    ) -> Any:
        return {
            "processes": n,
            "buckets": b,
            "polling": polling,
            "leases": {
                "held": held,
                "held_s": 2.0 if held == b else None,
                "settled_s": 2.5 if held == b else None,
                "held_at_end": held,
            },
            "nodes_alive_at_end": n,
            "store_ops_per_s_total": ops,
            "store_ops_per_s": {k: ops / 6 for k in (*OPERATION_KINDS, "requests")},
            "store_cpu_per_s": store,
            "node_cpu_per_s": nodes,
        }

    plan = dataclasses.asdict(idle_bench.QUICK)
    result: dict[str, Any] = {
        "plan": plan,
        "runs": [row(1, 256, 10, 0.1, 0.2, 256), row(1, 4096, 40, 0.5, 0.4, 4096),
                 row(3, 256, 30, 0.3, 0.6, 256), row(3, 4096, 60, 0.6, 1.8, 1000),
                 row(1, 256, 200, 0.4, 0.8, 256, polling=True)],
    }  # fmt: skip
    result["ratios"] = idle_bench.ratios(result)
    assert result["ratios"]["1"]["4096"] == pytest.approx(
        {"store_ops_per_s_total": 4.0, "store_cpu_per_s": 5.0, "node_cpu_per_s": 2.0}
    )
    assert result["ratios"]["3"]["4096"]["node_cpu_per_s"] == pytest.approx(3.0)
    # The quiet cluster over the same polling, at the first B; N = 3 did not poll here.
    assert result["ratios"]["1"]["polling"] == pytest.approx(
        {"store_ops_per_s_total": 0.05, "store_cpu_per_s": 0.25, "node_cpu_per_s": 0.25}
    )
    assert all(math.isnan(v) for v in result["ratios"]["3"]["polling"].values())
    text = idle_bench.render(result)
    assert "leases held: 4096/4096 after 2.0 s, settled after 2.5 s" in text
    # A run whose leases did not all come says so, with its deadline.
    assert f"leases held: 1000/4096: NOT all held after {plan['lease_deadline']:g} s" in text
    assert "N=3, B=4096 over B=256: store ops/s 2.00x" in text
    assert "N=1, B=256 quiet over polling: store ops/s 0.05x" in text
    assert " 1   256 polling       200.0" in text


def test_the_bulk_suite_judges_each_promise_from_what_the_receiver_and_store_saw() -> None:
    plan = bulk_bench.Plan(count=10, nodes=2)
    redriven = {
        "failed_after_s": 2.0, "refused_calls": 10, "calls_s": 0.5, "all_delivered_s": 1.0,
        "dry_run": {"matched": 10, "changed": 0, "more": False, "dryRun": True},
        "answers": [{"status": 200, "matched": 10, "changed": 10, "more": False, "s": 0.5}],
        "changed": 10, "delivered_twice": 0,
    }  # fmt: skip
    raced = {
        "answers": [{"status": 200, "matched": 6, "changed": 4, "more": True, "s": 0.2},
                    {"status": 200, "matched": 0, "changed": 0, "more": False, "s": 0.1}],
        "paused": 4, "calls_after_last_answer": 0, "store_paused": 4, "store_delivered": 6,
        "resumed": {"matched": 4, "changed": 4, "more": False}, "delivered_twice": 0,
    }  # fmt: skip
    assert all(bulk_bench.aims(plan, redriven, raced).values())
    assert not bulk_bench.aims(plan, {**redriven, "delivered_twice": 1}, raced)[
        "every failed one redriven and delivered once"
    ]
    assert not bulk_bench.aims(plan, redriven, {**raced, "calls_after_last_answer": 1})[
        "none of the paused group called after the last answer"
    ]
    assert not bulk_bench.aims(plan, redriven, {**raced, "store_delivered": 5})[
        "the store holds each one paused or delivered"
    ]
    text = bulk_bench.render(
        {"plan": plan.__dict__, "redrive": redriven, "pause": raced,
         "aims": bulk_bench.aims(plan, redriven, raced)}
    )  # fmt: skip
    assert "6/4 more, 0/0" in text and "MISSED" not in text


def test_the_flow_suite_counts_any_window_and_judges_each_bound() -> None:
    assert flow_bench.most_in_a_window([0.0, 0.5, 1.0, 1.5, 2.0], 1.0) == 2  # half-open
    assert flow_bench.most_in_a_window([0.0, 0.5, 0.99, 1.0, 1.5, 1.98], 1.0) == 4
    assert flow_bench.most_in_a_window([], 1.0) == 0
    plan = flow_bench.Plan(count=600, rate=20, parallelism=3, free=600, nodes=3)
    baseline = {"free_lateness": {"p50": 0.2, "p99": 1.0}}
    mixed = {"most_at_once": 3, "most_in_a_second": 22, "delivered_in_s": 31.0,
             "first_after_s": 0.1, "failed": 0, "twice": 0,
             "free_lateness": {"p50": 0.2, "p99": 1.1}}  # fmt: skip
    crashed = {"most_at_once": 3, "most_in_a_second": 21, "delivered_in_s": 40.0,
               "first_after_s": 0.1, "twice": 0, "victim_share": 0.4,
               "killed_after_s": 15.0}  # fmt: skip
    assert all(flow_bench.aims(plan, baseline, mixed, crashed).values())
    judged = [
        flow_bench.aims(plan, baseline, {**mixed, "most_at_once": 4}, crashed),
        flow_bench.aims(plan, baseline, mixed, {**crashed, "most_in_a_second": 23}),
        flow_bench.aims(plan, baseline, {**mixed, "delivered_in_s": 37.0}, crashed),
        flow_bench.aims(plan, baseline, {**mixed, "free_lateness": {"p99": 1.3}}, crashed),
    ]
    assert [sum(not ok for ok in aims.values()) for aims in judged] == [1, 1, 1, 1]
    text = flow_bench.render({"plan": plan.__dict__, "alone": baseline, "beside": mixed,
                              "crash": crashed, "aims": judged[0]})  # fmt: skip
    assert "at most 3 at once" in text and "MISSED" in text


def test_the_priority_suite_places_each_high_one_among_the_low_ones() -> None:
    arrivals = ["low1", "low2", "high1", "low3", "high2", "low4"]
    placed = priority_bench.placing(arrivals)
    assert placed == {"lows_before_first_high": 2, "lows_before_last_high": 3,
                      "highs": 2, "lows": 4}  # fmt: skip
    plan = {"lows": 4, "highs": 2, "before": 4, "nodes": 1}
    assert all(priority_bench.aims({"plan": plan, **placed}).values())
    assert not any(priority_bench.aims({"plan": {**plan, "before": 3}, **placed}).values())
    missing = priority_bench.placing(["low1", "high1"])
    assert not any(priority_bench.aims({"plan": plan, **missing}).values())


def test_the_idle_suite_takes_each_bucket_count_in_turn_and_sets_least_over_least() -> None:
    """Some idle windows carry a burst of the store's own work (0.06-0.07
    CPU s/s in 5 of 12, 0.003-0.021 in the others, whatever B), so each N
    runs the bucket counts forwards, backwards, forwards, and a ratio is of
    the least of each."""
    plan = dataclasses.replace(idle_bench.FULL, nodes=(1, 3), buckets=(256, 4096), rounds=3)
    assert idle_bench.turns(plan) == [
        (1, 256), (1, 4096), (1, 4096), (1, 256), (1, 256), (1, 4096),
        (3, 256), (3, 4096), (3, 4096), (3, 256), (3, 256), (3, 4096),
    ]  # fmt: skip
    assert idle_bench.turns(dataclasses.replace(plan, rounds=1)) == [
        (1, 256), (1, 4096), (3, 256), (3, 4096)
    ]  # fmt: skip

    def row(b: int, cpu: float) -> dict[str, Any]:
        return {"processes": 3, "buckets": b, "polling": False, "store_ops_per_s_total": 10.0,
                "store_cpu_per_s": cpu, "node_cpu_per_s": 0.1}  # fmt: skip

    # The store's burst in two windows of 256, one of 4,096; nothing else between them.
    runs = [row(256, 0.07), row(4096, 0.011), row(4096, 0.065), row(256, 0.068),
            row(256, 0.01), row(4096, 0.012)]  # fmt: skip
    result = {"plan": dataclasses.asdict(plan), "runs": runs}
    assert idle_bench.ratios(result)["3"]["4096"]["store_cpu_per_s"] == pytest.approx(1.1)
    assert idle_bench.ratios({**result, "runs": runs[:2]})["3"]["4096"][
        "store_cpu_per_s"
    ] == pytest.approx(0.011 / 0.07)
