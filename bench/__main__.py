"""``python -m bench SUITE|all [--quick] [--out FILE.json]``

Each suite starts what it needs (embedded store and broker, node processes,
baselines), prints a table with its ratios, and with ``--out`` writes its
figures as JSON; ``all`` runs every suite in turn into one file.
``--quick`` runs small sizes to show that everything works and the ratios
are computed (CI's use); its figures are not for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    bounds_bench,
    bulk_bench,
    delivery_bench,
    failover_bench,
    fairness_bench,
    flow_bench,
    idle_bench,
    index_bench,
    ingest_bench,
    logs_bench,
    membership_bench,
    priority_bench,
    retention_bench,
    ring_bench,
    scale_bench,
)
from bench.report import write
from node.version import add_version_flag


@dataclass(frozen=True)
class Suite:
    measure: Callable[[bool], dict[str, Any]]
    render: Callable[[dict[str, Any]], str]
    in_all: bool = True  # False: a part of another suite, run by name only


def planned(
    run: Callable[[Any], Coroutine[Any, Any, dict[str, Any]]], full: Any, quick: Any
) -> Callable[[bool], dict[str, Any]]:
    """A suite that runs one plan: the full one, or with ``--quick`` the quick one."""
    return lambda is_quick: asyncio.run(run(quick if is_quick else full))


def _suite(module: Any) -> Suite:
    return Suite(planned(module.run, module.FULL, module.QUICK), module.render)


# In the order ``all`` runs them: the pure ones first, so a broken setup
# shows before the long runs.
SUITES = {
    "ring": Suite(ring_bench.measure, ring_bench.render),
    "membership": Suite(membership_bench.measure, membership_bench.render),
    "ingest": _suite(ingest_bench),
    "delivery": _suite(delivery_bench),
    # The HTTP rows and the isolation run alone (delivery runs them too).
    "delivery-http": Suite(
        planned(delivery_bench.run, delivery_bench.HTTP, delivery_bench.HTTP_QUICK),
        delivery_bench.render,
        in_all=False,
    ),
    "scale": _suite(scale_bench),
    "idle": _suite(idle_bench),
    "retention": _suite(retention_bench),
    "indexes": _suite(index_bench),
    "failover": _suite(failover_bench),
    "fairness": _suite(fairness_bench),
    "bulk": _suite(bulk_bench),
    "flow": _suite(flow_bench),
    "priority": _suite(priority_bench),
    "bounds": _suite(bounds_bench),
    "logs": _suite(logs_bench),
}


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_version_flag(parser)
    parser.add_argument("suite", choices=[*SUITES, "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    names = [n for n, s in SUITES.items() if s.in_all] if args.suite == "all" else [args.suite]
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "suites": {},
    }
    for name in names:
        print(f"== {name} ==", flush=True)
        started = time.monotonic()
        result = SUITES[name].measure(args.quick)
        result["wall_s"] = time.monotonic() - started
        print(SUITES[name].render(result), flush=True)
        results["suites"][name] = result
        if args.out is not None:
            write(results, args.out)
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


raise SystemExit(main())
