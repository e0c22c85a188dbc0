"""``python -m membership agent``: the membership layer alone, for
measurements on real processes. Prints one JSON line per change of a
member's state or data (with the wall-clock time it was seen), whose
``kind`` is the event's (readers take it as the member's state, so ANSWERED,
which changes neither, is not printed), and a ``ready`` line once bound."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import sys
import time

from membership.config import preset
from membership.messages import Event, EventKind
from membership.service import Membership
from node.version import add_version_flag


def _print(kind: str, **fields: object) -> None:
    print(json.dumps({"t": time.time(), "kind": kind, **fields}), flush=True)


async def agent(args: argparse.Namespace) -> int:
    membership = Membership(
        args.id,
        bind=(args.host, args.port),
        advertise_host=args.host,
        config=preset(args.preset),
        seeds=[s for s in args.seeds.split(",") if s],
        keys=[base64.b64decode(k) for k in args.keys.split(",") if k],
    )

    def on_event(event: Event) -> None:
        if event.kind != EventKind.ANSWERED:
            _print(event.kind.value, member=event.member.id, incarnation=event.member.incarnation)

    membership.subscribe(on_event)
    await membership.start()
    _print("ready", address=membership.address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await membership.leave(grace=2.0)
    await membership.stop()
    _print("stopped")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m membership")
    add_version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("agent", help="run the membership layer alone")
    run.add_argument("--id", required=True)
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=7946)
    run.add_argument("--seeds", default="", help="comma-separated HOST:PORT")
    run.add_argument("--preset", default="lan", choices=["lan", "fast"])
    run.add_argument("--keys", default="", help="comma-separated base64 cluster keys")
    args = parser.parse_args()
    return asyncio.run(agent(args))


if __name__ == "__main__":
    sys.exit(main())
