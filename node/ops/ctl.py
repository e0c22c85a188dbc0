"""``python -m node ctl``: the operator's CLI, over any node's HTTP API.

    python -m node ctl members                       # who is in, and what they hold
    python -m node ctl owners [--bucket N]           # bucket -> lease holder, token
    python -m node ctl schedule TOPIC --in 30 --payload '{"order": 42}' [--key K] [--id ID]
    python -m node ctl get ID | cancel ID
    python -m node ctl drain                         # this node hands over and leaves

``--url`` (or ``SCHEDULER_URL``) names the node; the default is the local dev
cluster's first node. Exit status: 0 done, 1 the API refused (its error is
printed), 2 the node could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT = 10.0


class Unreachable(Exception):
    """The node did not answer."""


class Refused(Exception):
    """The node answered with an error; the message is its error body."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("SCHEDULER_URL", DEFAULT_URL),
        help=f"a node's HTTP address [env SCHEDULER_URL, default {DEFAULT_URL}]",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SCHEDULER_API_KEY", ""),
        help="a tenant's API key when the node has AUTH on; members, owners and drain "
        "take an admin tenant's [env SCHEDULER_API_KEY]",
    )
    commands = parser.add_subparsers(dest="action", required=True)
    commands.add_parser("members", help="members, their state and the buckets they hold")
    owners = commands.add_parser("owners", help="bucket -> lease holder and token")
    owners.add_argument("--bucket", type=int, default=None, help="only this bucket")
    schedule = commands.add_parser("schedule", help="schedule a message")
    schedule.add_argument("topic")
    when = schedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", help="executeAt, RFC 3339 (2030-01-01T00:00:00Z)")
    when.add_argument("--in", dest="delay", type=float, help="seconds from now")
    schedule.add_argument("--payload", default="null", help="JSON payload (default null)")
    schedule.add_argument("--key", default=None, help="Kafka record key")
    schedule.add_argument("--id", default=None, help="idempotency id (default: server-assigned)")
    for name, text in (("get", "show a schedule"), ("cancel", "cancel a pending schedule")):
        commands.add_parser(name, help=text).add_argument("id")
    commands.add_parser("drain", help="the node hands its buckets over and leaves the cluster")


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    client = Client(args.url, args.api_key)
    try:
        if args.action == "members":
            print_members(client.get("/v1/cluster"), out)
        elif args.action == "owners":
            print_owners(client.get("/v1/cluster"), args.bucket, out)
        elif args.action == "schedule":
            print_json(client.send("POST", "/v1/schedules", schedule_body(args)), out)
        elif args.action == "get":
            print_json(client.get(f"/v1/schedules/{quote(args.id)}"), out)
        elif args.action == "cancel":
            print_json(client.send("DELETE", f"/v1/schedules/{quote(args.id)}"), out)
        elif args.action == "drain":
            print_json(client.send("POST", "/v1/admin/drain"), out)
    except Refused as exc:
        print(f"ctl: refused: {exc}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(f"ctl: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # bad input, before anything was sent
        print(f"ctl: {exc}", file=sys.stderr)
        return 2
    return 0


def schedule_body(args: argparse.Namespace) -> dict[str, Any]:
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--payload is not JSON: {exc}") from None
    if args.at is not None:
        execute_at = args.at
    else:
        when = datetime.now(UTC) + timedelta(seconds=args.delay)
        execute_at = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    body: dict[str, Any] = {"topic": args.topic, "executeAt": execute_at, "payload": payload}
    if args.key is not None:
        body["key"] = args.key
    if args.id is not None:
        body["id"] = args.id
    return body


def quote(schedule_id: str) -> str:
    return urllib.parse.quote(schedule_id, safe="")


class Client:
    def __init__(self, url: str, api_key: str = "") -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def get(self, path: str) -> Any:
        return self.send("GET", path)

    def send(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                **self.headers,
                **({"Content-Type": "application/json"} if data is not None else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            raise Refused(f"HTTP {exc.code} {exc.read().decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"no answer from {self.url}: {reason}") from None


def print_json(body: Any, out: TextIO) -> None:
    print(json.dumps(body, indent=2), file=out)


def print_members(view: dict[str, Any], out: TextIO) -> None:
    held: dict[str, int] = defaultdict(int)
    for owner in view["buckets"]["owners"]:
        if owner["owner"]:
            held[owner["owner"]] += 1
    print(f"{'member':<20} {'state':<8} {'gossip address':<22} {'http':<22} buckets", file=out)
    for m in sorted(view["members"], key=lambda m: m["id"]):
        marker = " (this node)" if m["id"] == view["self"] else ""
        print(
            f"{m['id']:<20} {m['state']:<8} {m['address']:<22} {m['http'] or '-':<22} "
            f"{held.get(m['id'], 0)}{marker}",
            file=out,
        )
    buckets = view["buckets"]
    moving = sum(1 for o in buckets["owners"] if o["owner"] != o["placed"])
    state = "settled" if buckets["settled"] and not moving else f"{moving} bucket(s) moving"
    print(
        f"{buckets['count']} buckets, placement v{buckets['placementVersion']}, {state}", file=out
    )


def print_owners(view: dict[str, Any], bucket: int | None, out: TextIO) -> None:
    print(f"{'bucket':>6}  {'owner':<20} {'token':>6}  placed on", file=out)
    for o in view["buckets"]["owners"]:
        if bucket is None or o["bucket"] == bucket:
            print(
                f"{o['bucket']:>6}  {o['owner'] or '-':<20} {o['token']:>6}  {o['placed'] or '-'}",
                file=out,
            )
