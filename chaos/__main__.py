"""``python -m chaos list | run SCENARIO | simulate | rebalance | broker-check``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chaos import brokercheck, rebalance, scenario
from chaos.run import main as play_scenario
from chaos.sim import cli as simulation
from chaos.sim.mutants import MUTANTS
from node.version import add_version_flag


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos")
    add_version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the shipped scenarios")
    play = commands.add_parser("run", help="play a scenario under load and check it")
    play.add_argument("scenario", help="a name from `list`, or a path to a JSON file")
    play.add_argument("--seed", type=int, default=1, help="picks targets and load (default 1)")
    play.add_argument("--nodes", type=int, default=None, help="override the starting nodes")
    play.add_argument("--duration", type=float, default=None, help="seconds; faults scale along")
    play.add_argument("--rate", type=float, default=None, help="schedules per second")
    play.add_argument("--out", type=Path, default=None, help="write summary.json in this directory")
    play.add_argument("--keep", type=Path, default=None, help="keep node logs and data here")
    play.add_argument("--mongo-uri", default=None, help="use this MongoDB instead of SecantusDB")
    play.add_argument(
        "--kafka-bootstrap", default=None, help="use this Kafka (host:port) instead of Tansu"
    )
    play.add_argument(
        "--no-namespaces",
        action="store_true",
        help="partition with the nodes' gossip filter even where network namespaces work",
    )
    play.add_argument(
        "--unfenced",
        action="store_true",
        help="run the nodes without the fence (CHAOS_MODE=unfenced): the run should fail",
    )
    sim = commands.add_parser(
        "simulate", help="seeds of the whole cluster in one process, in virtual time"
    )
    which = sim.add_mutually_exclusive_group()
    which.add_argument("--seeds", default=None, help="a range, 1-200 (the default), or one seed")
    which.add_argument("--seed", type=int, default=None, help="replay one seed: its digest")
    which.add_argument(
        "--list-mutants", action="store_true", help="the protections --mutant can take out"
    )
    sim.add_argument("--minutes", type=float, default=10.0, help="of load, per seed (default 10)")
    mutation = sim.add_mutually_exclusive_group()
    mutation.add_argument("--mutant", default="", help="take one protection out (test-only)")
    mutation.add_argument(
        "--all-mutants",
        action="store_true",
        help="each mutant over the seeds until caught: the first seed that catches each",
    )
    sim.add_argument("-v", "--verbose", action="store_true", help="a line for every seed")
    sim.add_argument(
        "--jobs", type=int, default=1, help="seeds run at once, each in its own process"
    )
    run = commands.add_parser("rebalance", help="join, kill -9 and leave under load")
    run.add_argument("--full", action="store_true", help="10,000 schedules over 60 s")
    run.add_argument("--schedules", type=int, default=None, help="override the count")
    run.add_argument("--seconds", type=float, default=None, help="override the duration")
    run.add_argument("--out", type=Path, default=None, help="write the report as JSON")
    run.add_argument(
        "--keep", type=Path, default=None, help="keep node logs and data in this directory"
    )
    add_broker_check(
        commands.add_parser(
            "broker-check", help="do concurrent producers lose acknowledged records?"
        )
    )
    args = parser.parse_args()
    if args.command == "broker-check":
        return broker_check(args)
    if args.command == "simulate":
        if args.mutant and args.mutant not in MUTANTS:
            print(f"chaos: no mutant {args.mutant!r} (--list-mutants)", file=sys.stderr)
            return 2
        return simulation.main(
            args.seeds,
            args.seed,
            args.minutes,
            args.mutant,
            args.list_mutants,
            args.verbose,
            max(1, args.jobs),
            args.all_mutants,
        )
    if args.command == "list":
        for name, path in scenario.available().items():
            print(f"{name:<18} {scenario.load(str(path)).description}")
        return 0
    if args.command == "run":
        if (args.mongo_uri is None) != (args.kafka_bootstrap is None):
            print("chaos: --mongo-uri and --kafka-bootstrap go together", file=sys.stderr)
            return 2
        try:
            chosen = scenario.load(args.scenario).scaled(
                nodes=args.nodes, duration=args.duration, rate=args.rate
            )
        except scenario.ScenarioError as exc:
            print(f"chaos: {exc}", file=sys.stderr)
            return 2
        return play_scenario(
            chosen,
            args.seed,
            args.out,
            args.keep,
            unfenced=args.unfenced,
            namespaces=not args.no_namespaces,
            external=(args.mongo_uri, args.kafka_bootstrap) if args.mongo_uri else None,
        )
    return rebalance.main(args.full, args.out, args.schedules, args.seconds, args.keep)


def add_broker_check(probe: argparse.ArgumentParser) -> None:
    """The options of ``broker-check`` (chaos.brokercheck)."""
    probe.add_argument("--producers", type=int, default=4)
    probe.add_argument("--records", type=int, default=300, help="per producer and round")
    probe.add_argument("--rounds", type=int, default=5)
    probe.add_argument("--memory", action="store_true", help="Tansu in memory, not over S3")
    probe.add_argument("--kafka-bootstrap", default=None, help="check this Kafka instead")
    probe.add_argument(
        "--pause",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="SIGSTOP the broker this long, then SIGCONT: after the --crashes, alone once "
        "a third of the records are settled (default 0: no pause)",
    )
    probe.add_argument(
        "--in-flight",
        type=int,
        default=1,
        help="records each producer sends at once, waiting for all their acks (default 1)",
    )
    probe.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the producers' request timeout (default aiokafka's, 40 s; a node's is 10 s)",
    )
    probe.add_argument(
        "--crashes",
        type=int,
        default=0,
        help="SIGKILL the durable broker this many times a round, each time down "
        f"{brokercheck.DOWN:g} s and restarted on the same port and storage (default 0)",
    )
    probe.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="partitions of the topic, the records' keys picking one (default 1)",
    )
    probe.add_argument(
        "--batch-gap",
        type=float,
        default=None,
        metavar="SECONDS",
        help="each producer waits this long between its batches (default with --crashes: "
        f"--in-flight/{brokercheck.CRASH_PACE:g}, {brokercheck.CRASH_PACE:g} records a second; "
        "else 0)",
    )


def broker_check(args: argparse.Namespace) -> int:
    """``broker-check`` with its options made sane: at least one record in
    flight and one partition, no negative gap or crash count."""
    in_flight = max(1, args.in_flight)
    batch_gap = args.batch_gap
    if batch_gap is None:
        batch_gap = brokercheck.default_batch_gap(args.crashes, in_flight)
    options = brokercheck.Options(
        args.producers,
        args.records,
        in_flight=in_flight,
        request_timeout=args.request_timeout,
        partitions=max(1, args.partitions),
        batch_gap=max(0.0, batch_gap),
        crashes=max(0, args.crashes),
        pause=args.pause,
    )
    return brokercheck.main(options, args.rounds, args.memory, args.kafka_bootstrap)


raise SystemExit(main())
