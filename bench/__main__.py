"""``python -m bench SUITE [--quick] [--out FILE]``; ``all`` runs every suite in turn."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from bench import delivery_bench, fairness_bench, membership_bench, node_bench, ring_bench

Suite = Callable[[bool, Path | None], int]

SUITES: dict[str, Suite] = {
    "delivery": delivery_bench.main,
    "node": node_bench.main,
    "fairness": fairness_bench.main,
    "membership": membership_bench.main,
    "ring": ring_bench.main,
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("suite", choices=[*sorted(SUITES), "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI smoke runs")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    return SUITES[args.suite](args.quick, args.out)


raise SystemExit(main())
