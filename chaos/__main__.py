"""``python -m chaos rebalance [--full] [--out FILE]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from chaos import rebalance


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("rebalance", help="join, kill -9 and leave under load")
    run.add_argument("--full", action="store_true", help="10,000 schedules over 60 s")
    run.add_argument("--schedules", type=int, default=None, help="override the count")
    run.add_argument("--seconds", type=float, default=None, help="override the duration")
    run.add_argument("--out", type=Path, default=None, help="write the report as JSON")
    run.add_argument(
        "--keep", type=Path, default=None, help="keep node logs and data in this directory"
    )
    args = parser.parse_args()
    return rebalance.main(args.full, args.out, args.schedules, args.seconds, args.keep)


raise SystemExit(main())
