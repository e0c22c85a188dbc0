"""``python -m node tenants {add,list,set,add-key,revoke-key,rotate-secret,
retire-secret,remove}``: manage tenants, API keys and signing secrets
directly in the database (MONGO_URI and MONGO_DATABASE, as the nodes use
them). A new key is printed once, to stdout and nowhere else; only its
digest is stored. A signing secret (``whsec_...``, for HTTP deliveries) is
printed when made; the receiver needs it, so it is stored as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from pymongo import AsyncMongoClient

from node import config as node_config
from node.errors import StoreUnavailable, TenantError
from node.schedule.flow import MAX_RATE
from node.schedule.webhook import new_secret
from node.store.tenants import TenantStore
from node.tenants.model import Tenant, validate_name
from node.tenants.model import unlimited as tenant_defaults

MONGO_SETTINGS = [s for s in node_config.SETTINGS if s.attr in {"mongo_uri", "mongo_database"}]


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def _limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="may call the operator routes (/v1/cluster, /v1/admin/)",
    )
    parser.add_argument(
        "--max-pending",
        type=_nonnegative_int,
        default=None,
        help="most PENDING schedules at once (0 clears the limit)",
    )
    parser.add_argument(
        "--rate",
        type=_positive_float,
        default=None,
        help="new schedules per second, cluster-wide (429 above)",
    )
    parser.add_argument(
        "--burst",
        type=_nonnegative_int,
        default=None,
        help="new schedules at once above the rate (default: one second's worth)",
    )
    parser.add_argument(
        "--topic-prefix",
        action="append",
        default=None,
        dest="topic_prefixes",
        help="allowed topic prefix, repeatable (default: any topic)",
    )
    parser.add_argument(
        "--url-prefix",
        action="append",
        default=None,
        dest="url_prefixes",
        help="allowed http target URL prefix, repeatable, like https://hooks.example.com/ "
        "(default: any URL the egress policy allows)",
    )
    parser.add_argument("--no-rate", action="store_true", help="remove the rate limit")  # fmt: skip
    parser.add_argument(
        "--delivery-rate",
        type=_nonnegative_int,
        default=None,
        help="deliveries a second of its schedules that name no flowControl key, "
        "cluster-wide, for schedules created from now on (0 clears it)",
    )
    parser.add_argument(
        "--read-budget",
        type=_nonnegative_float,
        default=None,
        help="seconds of store time a second its API calls may take, cluster-wide (429 "
        "above; 0: back to the node's READ_BUDGET)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for setting in MONGO_SETTINGS:
        parser.add_argument(setting.flag, dest=setting.attr, default=None, metavar=setting.env,
                            help=f"{setting.help} [env {setting.env}]")  # fmt: skip
    commands = parser.add_subparsers(dest="tenant_command", required=True)
    add = commands.add_parser("add", help="create a tenant; prints its first API key once")
    add.add_argument("name")
    _limits(add)
    change = commands.add_parser("set", help="change a tenant's limits")
    change.add_argument("name")
    _limits(change)
    commands.add_parser("list", help="tenants, their limits and key hints (JSON lines)")
    add_key = commands.add_parser("add-key", help="another key for a tenant (rotation)")
    add_key.add_argument("name")
    revoke = commands.add_parser("revoke-key", help="revoke a key by its hint or whole")
    revoke.add_argument("key")
    rotate = commands.add_parser(
        "rotate-secret",
        help="a new signing secret for HTTP deliveries (printed); the newest old one stays "
        "valid (both signatures are sent) until retire-secret",
    )
    rotate.add_argument("name")
    retire = commands.add_parser(
        "retire-secret", help="stop signing with the older secret of a rotation"
    )
    retire.add_argument("name")
    remove = commands.add_parser("remove", help="delete a tenant and its keys")
    remove.add_argument("name")


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if args.admin is not None:
        changes["admin"] = args.admin
    if args.max_pending is not None:
        changes["max_pending"] = args.max_pending or None
    if args.rate is not None:
        changes["rate"] = args.rate
    if args.no_rate:
        changes["rate"] = changes["burst"] = None
    if args.burst is not None:
        changes["burst"] = args.burst
    if args.topic_prefixes is not None:
        changes["topic_prefixes"] = tuple(p for p in args.topic_prefixes if p)
    if args.url_prefixes is not None:
        changes["url_prefixes"] = tuple(p for p in args.url_prefixes if p)
    return {**changes, **_budgets(args)}


def _budgets(args: argparse.Namespace) -> dict[str, Any]:
    """What the tenant's calls and deliveries may cost (0 clears each)."""
    changes: dict[str, Any] = {}
    if args.read_budget is not None:
        changes["read_budget"] = args.read_budget or None
    if args.delivery_rate is not None:
        if args.delivery_rate > MAX_RATE:
            raise SystemExit(f"--delivery-rate must be at most {MAX_RATE:,}")
        changes["delivery_rate"] = args.delivery_rate or None
    return changes


async def _secrets(args: argparse.Namespace, store: TenantStore) -> None:
    """Rotate (a new secret first, the newest old one kept) or retire (the
    older one dropped) a tenant's signing secrets."""
    tenant = await store.get(args.name)
    if tenant is None:
        raise TenantError(f"no tenant {args.name!r}")
    if args.tenant_command == "rotate-secret":
        secret = new_secret()
        await store.update(args.name, signing_secrets=(secret, *tenant.signing_secrets[:1]))
        print(secret)
        print(
            f"tenant {args.name!r} signs with this secret now"
            + (", and with the previous one until retire-secret" if tenant.signing_secrets else ""),
            file=sys.stderr,
        )
        return
    if len(tenant.signing_secrets) < 2:
        raise TenantError(f"tenant {args.name!r} has no older secret to retire")
    await store.update(args.name, signing_secrets=tenant.signing_secrets[:1])
    print(f"tenant {args.name!r} signs with its newest secret only", file=sys.stderr)


async def _run(args: argparse.Namespace, store: TenantStore) -> int:
    now = datetime.now(UTC)
    command = args.tenant_command
    if command == "add":
        fields = {**vars(tenant_defaults(validate_name(args.name))), **_changes(args)}
        key = await store.add(Tenant(**fields), now)
        print(key)
        print(f"tenant {args.name!r} created; this key is shown only once", file=sys.stderr)
    elif command == "set":
        print(json.dumps((await store.update(args.name, **_changes(args))).to_view()))
    elif command == "list":
        for tenant, hints in await store.all():
            print(json.dumps({**tenant.to_view(), "keys": hints}))
    elif command == "add-key":
        print(await store.add_key(args.name, now))
    elif command == "revoke-key":
        if not await store.revoke_key(args.key):
            raise TenantError("no such key")
        print("revoked", file=sys.stderr)
    elif command in ("rotate-secret", "retire-secret"):
        await _secrets(args, store)
    elif command == "remove":
        if not await store.remove(args.name):
            raise TenantError(f"no tenant {args.name!r}")
        print(f"tenant {args.name!r} removed", file=sys.stderr)
    return 0


async def _main(args: argparse.Namespace) -> int:
    values = {}
    for setting in MONGO_SETTINGS:
        raw = getattr(args, setting.attr) or os.environ.get(setting.env) or setting.default
        values[setting.attr] = setting.parse(raw)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        values["mongo_uri"], tz_aware=True, serverSelectionTimeoutMS=5000
    )
    try:
        store = TenantStore(client[values["mongo_database"]])
        await store.prepare()
        return await _run(args, store)
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (TenantError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"error: the database did not answer: {exc.__cause__}", file=sys.stderr)
        return 2
