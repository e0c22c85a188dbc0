"""``python -m bench.leases_bench``: the store round trips of the bucket
leases, at B buckets and N nodes, on the embedded SecantusDB.

For each B and N, in a fresh database: N lease books (``LeaseManager``, one
client each, as N nodes have), each wanting the buckets the placement gives
it among N members, all at once:

* acquire, the first ever (no lease document yet): takeable, take, ours;
* renew (the session: one write, however many leases are held);
* release, then acquire again (the documents exist, free);

and for each, the round trips of the node that made the most, by command
(a client's command listener), the store's requests for all N together
(serverStatus ``network.numRequests``, new clients' handshakes included) and
its update commands (``opcounters.update``), and the seconds.
``--shape one-statement`` names every bucket of a call in one statement, as
on a real MongoDB (node/store/leases.py): on the embedded store that costs
the square of the buckets named, minutes at 4,096. A small run: a store and
N clients in this process, no broker, no node.

``--dev B`` instead starts ``python -m node dev`` (3 nodes, scratch data and
free ports) with BUCKETS=B and gives the seconds from its "ready" until every
node's ``/v1/cluster`` shows every bucket held by the member its placement
names, settled; then stops the stack as Ctrl-C does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.monitoring import (
    CommandFailedEvent,
    CommandListener,
    CommandStartedEvent,
    CommandSucceededEvent,
)

from bench.stack import HOST, operations_between, store_operations
from node.delivery.leases import LeaseManager
from node.ops import embedded
from node.store.boundary import DURABLE
from node.store.leases import LeaseStore
from node.version import add_version_flag
from ring import PLACEMENT_VERSION, owned_by, place

# Long enough that no call of a slow shape runs out of term (its ``within``).
TTL = 600.0
# Commands of the lease calls: takeable reads by aggregate, ours and tokens
# by find, take, the session renew and release write by update (the session
# opened by an update and a delete); the first take of a
# bucket on the embedded store inserts its free lease first.
COMMANDS = ("aggregate", "delete", "find", "getMore", "insert", "update")


class Commands(CommandListener):
    """The commands one client sends: its round trips, by name."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()

    def started(self, event: CommandStartedEvent) -> None:
        self.sent[event.command_name] += 1

    def succeeded(self, event: CommandSucceededEvent) -> None:
        pass

    def failed(self, event: CommandFailedEvent) -> None:
        pass


class Cluster:
    """N lease books over one database, each through a client of its own."""

    def __init__(self, uri: str, database: str, buckets: int, nodes: int, chunked: bool) -> None:
        ids = [f"n{i}" for i in range(nodes)]
        owners = place(dict.fromkeys(ids, PLACEMENT_VERSION), buckets)
        self.wanted = [owned_by(owners, node_id) for node_id in ids]
        self.listeners = [Commands() for _ in ids]
        self.clients: list[AsyncMongoClient[dict[str, Any]]] = [
            AsyncMongoClient(uri, tz_aware=True, event_listeners=[listener])
            for listener in self.listeners
        ]
        self.books = [
            LeaseManager(
                LeaseStore(
                    client[database]["buckets"].with_options(write_concern=DURABLE),
                    node_id,
                    chunked=chunked,
                ),
                TTL,
            )
            for client, node_id in zip(self.clients, ids, strict=True)
        ]

    async def phase(
        self, store: AsyncMongoClient[dict[str, Any]], call: Callable[[int], Awaitable[Any]]
    ) -> dict[str, Any]:
        """``call(i)`` for every book at once: round trips, statements, seconds."""
        for listener in self.listeners:
            listener.sent.clear()
        before = await store_operations(store)
        began = time.perf_counter()
        await asyncio.gather(*(call(i) for i in range(len(self.books))))
        seconds = time.perf_counter() - began
        counted = operations_between(before, await store_operations(store))
        most = max(self.listeners, key=lambda listener: listener.sent.total())
        return {
            "node": {name: most.sent[name] for name in COMMANDS if most.sent[name]},
            "node_round_trips": most.sent.total(),
            "store_requests": counted["requests"],
            "store_updates": counted["update"],
            "seconds": round(seconds, 3),
            "held": sum(len(book.held) for book in self.books),
        }

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


async def measure(uri: str, buckets: int, nodes: int, chunked: bool) -> dict[str, Any]:
    database = f"leases_{buckets}_{nodes}_{int(chunked)}"
    store: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    cluster = Cluster(uri, database, buckets, nodes, chunked)
    books, wanted = cluster.books, cluster.wanted
    try:
        return {
            "buckets": buckets,
            "nodes": nodes,
            "first acquire": await cluster.phase(store, lambda i: books[i].acquire(wanted[i])),
            "renew": await cluster.phase(store, lambda i: books[i].renew()),
            "release": await cluster.phase(store, lambda i: books[i].release()),
            "acquire again": await cluster.phase(store, lambda i: books[i].acquire(wanted[i])),
        }
    finally:
        await cluster.close()
        await store.drop_database(database)
        await store.close()


def render(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        f"{'B':>5} {'N':>2}  {'phase':<14} {'trips/node':>10}  {'by command (node)':<38}"
        f" {'store req':>9} {'updates':>7} {'seconds':>8} {'held':>5}"
    ]
    for row in rows:
        for phase in ("first acquire", "renew", "release", "acquire again"):
            p = row[phase]
            by = ", ".join(f"{name} {n}" for name, n in p["node"].items())
            lines.append(
                f"{row['buckets']:>5} {row['nodes']:>2}  {phase:<14} {p['node_round_trips']:>10}"
                f"  {by:<38} {p['store_requests']:>9} {p['store_updates']:>7}"
                f" {p['seconds']:>8.3f} {p['held']:>5}"
            )
    return "\n".join(lines)


async def run(buckets: Sequence[int], nodes: Sequence[int], chunked: bool) -> str:
    with tempfile.TemporaryDirectory(prefix="leases-bench") as tmp:
        port = embedded.free_port(HOST)
        mongo = embedded.spawn(embedded.mongo_argv(HOST, port, Path(tmp) / "mongo"))
        try:
            embedded.wait_for_port(HOST, port, 60, mongo)
            uri = embedded.mongo_uri(HOST, port)
            rows = [await measure(uri, b, n, chunked) for b in buckets for n in nodes]
        finally:
            embedded.discard(mongo)
    return render(rows)


def dev_stack(buckets: int, within: float) -> str:
    """Seconds from the dev stack's "ready" until every lease is held as placed."""
    base = embedded.consecutive_free_ports(8, (socket.SOCK_STREAM, socket.SOCK_DGRAM))
    with tempfile.TemporaryDirectory(prefix="leases-dev") as tmp:
        argv = [
            sys.executable, "-m", "node", "dev", "--data-dir", tmp,
            "--http-port", str(base), "--gossip-port", str(base + 3),
            "--mongo-port", str(base + 6), "--kafka-port", str(base + 7),
        ]  # fmt: skip
        env = {**os.environ, "BUCKETS": str(buckets)}
        stack = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        ready = threading.Event()
        threading.Thread(target=_until_ready, args=(stack, ready), daemon=True).start()
        try:
            if not ready.wait(120):
                return "the dev stack was not ready within 120 s"
            began = time.monotonic()
            nodes = [f"http://{HOST}:{base + i}" for i in range(3)]
            while time.monotonic() - began < within:
                if _held_as_placed(nodes, buckets):
                    took = time.monotonic() - began
                    return f"B = {buckets}: every lease held as placed {took:.1f} s after ready"
                time.sleep(1.0)
            return f"B = {buckets}: not every lease held as placed {within:g} s after ready"
        finally:
            stack.send_signal(signal.SIGINT)
            try:
                stack.wait(90)
            except subprocess.TimeoutExpired:
                stack.kill()  # its children die with it (node/ops/embedded.py)
                stack.wait()


def _until_ready(stack: subprocess.Popen[str], ready: threading.Event) -> None:
    assert stack.stdout is not None
    for line in stack.stdout:  # read to the end: a full pipe would stop the stack
        if line.startswith("dev: ready"):
            ready.set()


def _held_as_placed(nodes: Sequence[str], buckets: int) -> bool:
    views = []
    for node in nodes:
        try:
            with urllib.request.urlopen(f"{node}/v1/cluster", timeout=10) as answer:
                views.append(json.load(answer)["buckets"])
        except OSError:  # a node too busy to answer in time: not there yet
            return False
    return sum(view["held"] for view in views) == buckets and all(
        view["settled"]
        and len(view["owners"]) == buckets
        and all(lease["owner"] == lease["placed"] for lease in view["owners"])
        for view in views
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.leases_bench", description=__doc__)
    add_version_flag(parser)
    parser.add_argument("--buckets", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument(
        "--shape",
        choices=["bounded", "one-statement"],
        default="bounded",
        help="bounded: the embedded store's statements (a node's on it); one-statement: MongoDB's",
    )
    parser.add_argument("--dev", type=int, metavar="B", help="time the dev stack at B buckets")
    args = parser.parse_args()
    if args.dev:
        print(dev_stack(args.dev, within=120.0))
        return
    print(f"shape: {args.shape}")
    print(asyncio.run(run(args.buckets, args.nodes, args.shape == "bounded")))


if __name__ == "__main__":
    main()
