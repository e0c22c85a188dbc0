"""``python -m node ctl``: the operator's CLI, over any node's HTTP API.

    python -m node ctl members                       # who is in, and what they hold
    python -m node ctl owners [--bucket N]           # bucket -> lease holder, token
    python -m node ctl schedule TOPIC --in 30 --payload '{"order": 42}' [--key K] [--id ID]
                                      [--label NAME=VALUE ...]
    python -m node ctl schedule --http https://hooks.example.com/x --in 30 [--method PUT] ...
    python -m node ctl get ID
    python -m node ctl list [--status S] [--label NAME=VALUE ...] [--topic T] [--host H]
                            [--destination kafka|http] [--key K]
                            [--counts] [--limit N] [--after CURSOR] [--json]
    python -m node ctl reschedule ID (--at T | --in SECONDS) [--if-match VERSION]
    python -m node ctl pause ID | resume ID | trigger ID | retry ID  [--if-match VERSION]
    python -m node ctl cancel ID                     # one schedule
    python -m node ctl cancel|pause|resume|retry --label NAME=VALUE [--label ...] [--key K]
                              [--id-prefix P] [--topic T] [--host H] [--destination kafka|http]
                              [--status S ...] [--due-before T] [--dry-run]
                                                     # every match in the verb's statuses
    python -m node ctl drain                         # this node hands over and leaves

``--url`` (or ``SCHEDULER_URL``) names the node; the default is the local dev
cluster's first node. ``--if-match`` takes a schedule's ``version`` (as get
shows it) or ``*``: the change is made only if the schedule is still at that
version. A verb by selector (no ID) calls ``POST /v1/schedules:<verb>`` again
while the node answers ``more`` (more match, or one is still in flight: then a
second later), and prints the totals; ``--dry-run`` prints the count only.
``list`` follows the node's ``next`` cursors until it has printed ``--limit``
schedules (default 100), and says how to go on from there.

Exit status: 0 done, 1 the API refused (its error is printed: a 404, a 409
for a schedule in flight or in the wrong status, a 412 when ``--if-match``
names a version the schedule is no longer at), 2 the node could not be
reached, or the command line asks for something impossible.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from bucket_scheduler_client import (
    NO_RETRY,
    ApiError,
    Client,
    ListFilters,
    NewSchedule,
    Selector,
    TransportError,
)

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT = 10.0
# The node's largest page (GET /v1/schedules?limit=).
MAX_PAGE = 1000
DEFAULT_LIST = 100
# A verb by selector whose node says more but changed nothing (what is left
# is in flight) is asked again this many seconds later, at most SETTLE_CALLS
# times in a row.
SETTLE_WAIT = 1.0
SETTLE_CALLS = 30
# The verbs that change one schedule and take no body: POST /v1/schedules/{id}:verb.
VERBS = {
    "pause": "pause a PENDING schedule: never due until resumed",
    "resume": "resume a PAUSED schedule (one past its deadline becomes EXPIRED)",
    "trigger": "make a PENDING schedule due now (recurring: one extra occurrence now)",
    "retry": "redrive a DELIVERY_FAILED schedule: PENDING, due now, attempts 0",
}
# The verbs that also take a selector instead of an ID, and what each changes.
BULK = {
    "cancel": "PENDING or PAUSED",
    "pause": "PENDING",
    "resume": "PAUSED",
    "retry": "DELIVERY_FAILED",
}


class Refused(Exception):
    """A command the node's answers cannot carry out (a bulk verb that
    stays in flight); the node's own refusals are the client's ApiError."""


def label_argument(text: str) -> tuple[str, str]:
    """NAME=VALUE (the value may be empty, and may hold '='; the node judges both)."""
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def version_argument(text: str) -> str:
    """An If-Match value: a version (3, or "3" as an ETag shows it) or *."""
    if text == "*":
        return text
    digits = text.removeprefix('"').removesuffix('"') if len(text) > 2 else text
    if not digits.isascii() or not digits.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a version (an integer) or *")
    return f'"{int(digits)}"'


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

    schedule = commands.add_parser(
        "schedule", help="schedule a message to a Kafka topic, or an HTTP call with --http"
    )
    schedule.add_argument("topic", nargs="?", default=None, help="Kafka topic (or --http)")
    schedule.add_argument(
        "--http", default=None, metavar="URL", help="deliver by an HTTP call to this URL"
    )
    schedule.add_argument(
        "--method", default=None, choices=("POST", "PUT", "PATCH"), help="with --http"
    )
    _add_when(schedule)
    schedule.add_argument("--payload", default="null", help="JSON payload (default null)")
    schedule.add_argument("--key", default=None, help="Kafka record key")
    schedule.add_argument(
        "--id", default=None, help="idempotency id (default: one made for this call)"
    )
    _add_label_option(schedule, "a label (repeatable)")

    commands.add_parser("get", help="show a schedule").add_argument("id")

    listing = commands.add_parser(
        "list",
        help="list schedules",
        description="List the tenant's schedules matching every filter given, in id "
        "order (by --status alone: in due order). Follows the node's next cursors (pages "
        "of up to 1000) until --limit schedules are printed; if more match, the last line "
        "says which --after goes on.",
    )
    listing.add_argument("--status", default=None, help="PENDING, PAUSED, IN_FLIGHT, ...")
    _add_label_option(listing, "only schedules with this label (repeatable: all of them)")
    listing.add_argument("--topic", default=None, help="only schedules to this topic")
    listing.add_argument("--host", default=None, help="only HTTP targets on this host")
    listing.add_argument(
        "--destination", default=None, choices=("kafka", "http"), help="only this kind"
    )
    listing.add_argument("--key", default=None, help="only schedules with this record key")
    listing.add_argument(
        "--counts", action="store_true", help="also count them per status (ignoring --status)"
    )
    listing.add_argument(
        "--limit",
        type=_positive,
        default=DEFAULT_LIST,
        help=f"print at most this many (default {DEFAULT_LIST})",
    )
    listing.add_argument("--after", default=None, help="go on after this cursor")
    listing.add_argument(
        "--json", action="store_true", help='print {"schedules", "next", "counts"} as JSON'
    )

    reschedule = commands.add_parser(
        "reschedule", help="move a PENDING or PAUSED schedule to another time (PATCH executeAt)"
    )
    reschedule.add_argument("id")
    _add_when(reschedule)
    _add_if_match(reschedule)
    for verb, text in VERBS.items():
        if verb in BULK:
            _add_bulk(commands, verb, text)
        else:
            command = commands.add_parser(verb, help=text)
            command.add_argument("id")
            _add_if_match(command)
    _add_bulk(commands, "cancel", "cancel a PENDING or PAUSED schedule")

    commands.add_parser("drain", help="the node hands its buckets over and leaves the cluster")


def _add_bulk(commands: Any, verb: str, text: str) -> None:
    """A verb on one schedule (ID) or on every match of a selector."""
    command = commands.add_parser(
        verb,
        help=f"{text}; without an ID, every match of the filters",
        description=f"{verb} ID: one schedule. Without an ID: every schedule in the "
        f"statuses a {verb} changes ({BULK[verb]}) matching all the filters (at least one "
        "of --label, --key, --id-prefix, --topic and --host), calling the node again while "
        'it says more; prints {"matched", "changed", "calls"} in total. --dry-run: the '
        "count only, nothing changed.",
    )
    command.add_argument("id", nargs="?", default=None)
    if verb != "cancel":
        _add_if_match(command)
    _add_label_option(command, "schedules with this label (repeatable: all of them)")
    command.add_argument("--key", default=None, help="schedules with this record key")
    command.add_argument("--id-prefix", default=None, help="schedules whose id starts so")
    command.add_argument("--topic", default=None, help="schedules to this Kafka topic")
    command.add_argument("--host", default=None, help="HTTP targets on this host")
    command.add_argument(
        "--destination", default=None, choices=("kafka", "http"), help="only this kind"
    )
    command.add_argument(
        "--status",
        dest="statuses",
        action="append",
        default=[],
        help=f"only this of {BULK[verb]} (repeatable)",
    )
    command.add_argument("--due-before", default=None, help="due before this time (RFC 3339)")
    command.add_argument("--dry-run", action="store_true", help="count the matches, change nothing")


def _add_label_option(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument(
        "--label",
        dest="labels",
        action="append",
        type=label_argument,
        default=[],
        metavar="NAME=VALUE",
        help=text,
    )


def _add_when(parser: argparse.ArgumentParser) -> None:
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", help="executeAt, RFC 3339 with an offset (YYYY-MM-DDTHH:MM:SSZ)")
    when.add_argument("--in", dest="delay", type=float, help="seconds from now")


def _add_if_match(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--if-match",
        type=version_argument,
        default=None,
        metavar="VERSION",
        help="only if the schedule is still at this version (or *); else refused (412)",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    # No retries: the operator sees each refusal as the node gave it (a 503
    # is exit 1 at once) and decides whether to run the command again.
    with Client(args.url, args.api_key or None, timeout=TIMEOUT, retry=NO_RETRY) as client:
        try:
            perform(client, args, out)
        except (ApiError, Refused) as exc:
            print(f"ctl: refused: {exc}", file=err)
            return 1
        except TransportError as exc:
            print(f"ctl: {exc}", file=err)
            return 2
        except ValueError as exc:  # bad input, before anything was sent
            print(f"ctl: {exc}", file=err)
            return 2
    return 0


def perform(client: Client, args: argparse.Namespace, out: TextIO) -> None:
    """Carry out the command ``args.action`` names and print what the node answered."""
    if args.action == "members":
        print_members(client.cluster(), out)
    elif args.action == "owners":
        print_owners(client.cluster(), args.bucket, out)
    elif args.action == "schedule":
        print_json(client.create(**schedule_fields(args)).raw, out)
    elif args.action == "get":
        print_json(client.get(args.id).raw, out)
    elif args.action == "list":
        list_schedules(client, args, out)
    elif args.action == "reschedule":
        moved = client.patch(args.id, execute_at=execute_at(args), if_match=args.if_match)
        print_json(moved.raw, out)
    elif args.action in BULK and args.id is None:
        print_json(bulk(client, args.action, selector(args), dry_run=args.dry_run), out)
    elif args.action in BULK and selector(args, required=False):
        raise ValueError(f"{args.action} takes an ID or filters, not both")
    elif args.action == "cancel":
        print_json(client.cancel(args.id).raw, out)
    elif args.action in VERBS:
        print_json(getattr(client, args.action)(args.id, if_match=args.if_match).raw, out)
    elif args.action == "drain":
        print_json(client.drain(), out)


def execute_at(args: argparse.Namespace) -> str:
    """--at as given, or --in seconds from now, as RFC 3339 UTC."""
    if args.at is not None:
        return str(args.at)
    when = datetime.now(UTC) + timedelta(seconds=args.delay)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def label_map(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for name, value in pairs:
        if name in labels:
            raise ValueError(f"--label {name} given twice")
        labels[name] = value
    return labels


def schedule_fields(args: argparse.Namespace) -> NewSchedule:
    """The create the command line asks for (the client makes an id if none is given)."""
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--payload is not JSON: {exc}") from None
    if (args.topic is None) == (args.http is None):
        raise ValueError("name a topic or --http URL (one of them)")
    fields: NewSchedule = {"execute_at": execute_at(args), "payload": payload}
    if args.http is not None:
        fields["http"] = {"url": args.http, **({"method": args.method} if args.method else {})}
    else:
        fields["topic"] = args.topic
    if args.key is not None:
        fields["key"] = args.key
    if args.id is not None:
        fields["id"] = args.id
    if args.labels:
        fields["labels"] = label_map(args.labels)
    return fields


def selector(args: argparse.Namespace, *, required: bool = True) -> Selector:
    """The selector the filter options make ({} if none)."""
    body: Selector = {}
    if args.labels:
        body["labels"] = label_map(args.labels)
    if args.key is not None:
        body["key"] = args.key
    if args.id_prefix is not None:
        body["id_prefix"] = args.id_prefix
    if args.topic is not None:
        body["topic"] = args.topic
    if args.host is not None:
        body["host"] = args.host
    if required and not body:
        raise ValueError(
            f"{args.action} needs an ID, or at least one of --label, --key, --id-prefix, "
            "--topic, --host"
        )
    if args.destination is not None:
        body["destination"] = args.destination
    if args.statuses:
        body["status"] = args.statuses
    if args.due_before is not None:
        body["due_before"] = args.due_before
    return body


def bulk(client: Client, verb: str, body: Selector, *, dry_run: bool = False) -> dict[str, Any]:
    """Call the verb by selector until the node says no more: the totals. A
    call that changed nothing but says more (what is left is in flight) is
    made again SETTLE_WAIT later, SETTLE_CALLS times in a row at most."""
    if dry_run:
        return client.bulk(verb, dry_run=True, **body).raw
    matched = changed = calls = idle = 0
    while True:
        answer = client.bulk(verb, **body)
        calls += 1
        matched += answer.matched
        changed += answer.changed
        if not answer.more:
            totals = {"matched": matched, "changed": changed, "calls": calls}
            return {**totals, "cancelled": changed} if verb == "cancel" else totals
        idle = 0 if answer.changed else idle + 1
        if idle >= SETTLE_CALLS:
            raise Refused(
                f"the node says more but changed none in {idle} calls (left in flight?); "
                f"stopped after changing {changed}"
            )
        if idle:
            time.sleep(SETTLE_WAIT)  # what is left is in flight: asked again a moment later


def list_schedules(client: Client, args: argparse.Namespace, out: TextIO) -> None:
    filters: ListFilters = {}
    if args.labels:
        filters["label"] = [f"{name}={value}" for name, value in args.labels]
    for name in ("status", "topic", "host", "destination", "key"):
        if getattr(args, name) is not None:
            filters[name] = getattr(args, name)
    schedules: list[dict[str, Any]] = []
    counts: dict[str, int] | None = None
    cursor: str | None = args.after
    while True:
        ask_counts = args.counts and counts is None  # the same for every page: ask once
        page = client.list_page(
            limit=min(args.limit - len(schedules), MAX_PAGE),
            after=cursor,
            counts=ask_counts,
            **filters,
        )
        schedules.extend(s.raw for s in page.schedules)
        if ask_counts:
            counts = page.counts or {}
        cursor = page.next
        if cursor is None or len(schedules) >= args.limit:
            break
    answer: dict[str, Any] = {"schedules": schedules, "next": cursor}
    if counts is not None:
        answer["counts"] = counts
    if args.json:
        print_json(answer, out)
    else:
        print_listing(answer, out)


def print_json(body: Any, out: TextIO) -> None:
    print(json.dumps(body, indent=2), file=out)


def print_listing(answer: dict[str, Any], out: TextIO) -> None:
    """One schedule a line, then how many, whether more match, and the counts."""
    header = ("id", "status", "due", "version", "destination", "labels")
    rows = [
        (
            s["id"],
            s["status"],
            s.get("nextExecuteAt") or s["executeAt"],
            str(s.get("version", "-")),
            s["http"]["url"] if "http" in s else s["topic"],
            ",".join(f"{k}={v}" for k, v in sorted((s.get("labels") or {}).items())) or "-",
        )
        for s in answer["schedules"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]), file=out)
    more = f"; more: --after {answer['next']}" if answer["next"] else ""
    print(f"{len(rows)} schedule(s){more}", file=out)
    if "counts" in answer:
        counts = ", ".join(f"{status} {n}" for status, n in answer["counts"].items())
        print(f"counts: {counts or 'none'}", file=out)


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
