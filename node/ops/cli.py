"""``python -m node {run,dev,tail,tenants,ctl}``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

from node import config as node_config
from node.version import add_version_flag


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError("must be from 1 to 64")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m node", description="Delayed-message scheduler node."
    )
    add_version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="run one node (production)",
        description="Run one node. Every setting comes from its flag, else its "
        "environment variable, else the default.",
    )
    node_config.add_arguments(run)

    dev = commands.add_parser("dev", help="embedded MongoDB + Kafka + N nodes on this machine")
    dev.add_argument("--nodes", type=_positive, default=3, help="node processes (default 3)")
    dev.add_argument("--http-port", type=_port, default=8080, help="first node's HTTP port")
    dev.add_argument("--gossip-port", type=_port, default=7946, help="first node's gossip port")
    dev.add_argument("--mongo-port", type=_port, default=27017, help="embedded MongoDB port")
    dev.add_argument("--kafka-port", type=_port, default=9092, help="embedded Kafka port")
    dev.add_argument("--data-dir", type=Path, default=Path("dev-data"), help="database and logs")

    tail = commands.add_parser("tail", help="print the records delivered to a topic")
    tail.add_argument("topic")
    tail.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap server")
    tail.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest record, not the next"
    )
    tail.add_argument("--count", type=int, default=None, help="exit after this many records")
    tail.add_argument("--idle-timeout", type=float, default=None, help="exit after idle seconds")

    from node.ops import ctl, tenants_cli

    tenants_cli.add_arguments(
        commands.add_parser(
            "tenants",
            help="manage tenants and API keys (in the database)",
            description="Tenants, their API keys and quotas. New keys are printed once.",
        )
    )
    ctl.add_arguments(
        commands.add_parser(
            "ctl",
            help="operate a cluster over the HTTP API",
            description="members, bucket owners, schedule, get, list, reschedule, pause, resume, "
            "trigger, retry, cancel (one, or by label/key/id prefix), drain",
        )
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        try:
            config = node_config.load(args)
        except node_config.ConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            return 2
        from node.process import serve

        return asyncio.run(serve(config))
    if args.command == "dev":
        from node.ops.devstack import DevOptions, run_dev

        return run_dev(
            DevOptions(
                nodes=args.nodes,
                http_port=args.http_port,
                gossip_port=args.gossip_port,
                mongo_port=args.mongo_port,
                kafka_port=args.kafka_port,
                data_dir=args.data_dir,
            )
        )
    if args.command == "tail":
        from node.ops.tail import tail

        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(
                tail(
                    args.topic,
                    args.bootstrap,
                    from_beginning=args.from_beginning,
                    count=args.count,
                    idle_timeout=args.idle_timeout,
                )
            )
        return 130
    if args.command == "tenants":
        from node.ops import tenants_cli

        return tenants_cli.run(args)
    if args.command == "ctl":
        from node.ops import ctl

        return ctl.run(args)
    raise AssertionError(args.command)
