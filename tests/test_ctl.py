"""``python -m node ctl`` against real nodes: members, owners, schedule, get,
cancel, and drain (graceful leave without exiting)."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

from node.api.cluster import view_of
from node.ops.cli import build_parser
from node.ops.ctl import run
from tests.conftest import NodeFactory, NodeHandle, wait_until
from tests.test_ownership import cluster


async def ctl(handle: NodeHandle, *argv: str) -> tuple[int, str]:
    args = build_parser().parse_args(["ctl", "--url", handle.url, *argv])
    out = io.StringIO()
    code = await asyncio.to_thread(run, args, out)
    return code, out.getvalue()


def settled(*handles: NodeHandle) -> Any:
    async def condition() -> bool:
        views = [await view_of(h.node) for h in handles]
        return all(v["buckets"]["settled"] for v in views) and all(
            o["owner"] == o["placed"] for v in views for o in v["buckets"]["owners"]
        )

    return condition


async def test_members_owners_and_a_schedule_round_trip(start_node: NodeFactory) -> None:
    a, b = await cluster(start_node, ["ctl-a", "ctl-b"])
    await wait_until(settled(a, b), 60, "the two nodes to settle")

    code, out = await ctl(a, "members")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert set(rows) == {"ctl-a", "ctl-b"} and all(" alive " in r for r in rows.values())
    held = [int(r.split()[4]) for r in rows.values()]
    assert sum(held) == 32 and min(held) > 0
    assert "(this node)" in rows["ctl-a"] and out.splitlines()[-1].endswith("settled")

    code, out = await ctl(b, "owners", "--bucket", "7")
    assert code == 0
    [line] = out.splitlines()[1:]
    assert line.split()[0] == "7" and line.split()[1] in {"ctl-a", "ctl-b"}

    code, out = await ctl(b, "schedule", "ctl-topic", "--in", "3600", "--id", "order:1",
                          "--payload", '{"n": 1}', "--key", "k")  # fmt: skip
    assert code == 0 and json.loads(out)["status"] == "PENDING"
    code, out = await ctl(a, "get", "order:1")  # from the other node
    assert code == 0 and json.loads(out)["key"] == "k"
    code, out = await ctl(a, "cancel", "order:1")
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"
    code, out = await ctl(a, "cancel", "order:1")
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"  # cancel is idempotent
    code, _ = await ctl(a, "get", "missing")
    assert code == 1


async def test_drain_hands_every_bucket_over_and_keeps_the_api(start_node: NodeFactory) -> None:
    a, b = await cluster(start_node, ["drain-a", "drain-b"])
    await wait_until(settled(a, b), 60, "the two nodes to settle")
    assert b.node.leases.held

    code, out = await ctl(b, "drain")
    assert code == 0 and json.loads(out) == {"node": "drain-b", "state": "drained"}
    assert not b.node.leases.held

    async def a_holds_everything() -> bool:
        return len(a.node.leases.usable()) == 32

    await wait_until(a_holds_everything, 60, "drain-a to take every bucket")
    assert (await b.request("GET", "/readyz"))[0] == 503
    # Still an API node: what it accepts is delivered by the rest.
    code, out = await ctl(b, "schedule", "drained-topic", "--in", "0.5", "--id", "after-drain")
    assert code == 0

    async def delivered() -> bool:
        return (await a.request("GET", "/v1/schedules/after-drain"))[1]["status"] == "DELIVERED"

    await wait_until(delivered, 60, "the schedule to be delivered by drain-a")
    code, _ = await ctl(b, "drain")
    assert code == 1  # 409: already drained
