"""The cluster's routes: this node's view (``/v1/cluster``, the backlog, the
counts), the operator's drain, node-to-node wake-up hints, the probes, the
metrics, the OpenAPI document and the operator console (``/`` and its
script and stylesheet).
"""

from __future__ import annotations

import re
import time
from importlib import resources
from typing import Any

from aiohttp import web

from node.api.context import CONTEXT, ApiContext, json_response
from node.api.inputs import no_body, read_body, read_json
from node.api.openapi import document as openapi_document
from node.errors import ScheduleConflict, ValidationFailed
from node.schedule.parse import parse_json
from node.schedule.times import parse_time
from ring import parse_version

OPENAPI = openapi_document()

# The console: a fixed list of files, each at a route of its own (no
# directory is served, so no path can reach another file), read once.
CONSOLE_FILES = {
    "/": ("console.html", "text/html"),
    "/console.js": ("console.js", "text/javascript"),
    "/console.css": ("console.css", "text/css"),
}
_CONSOLE = {
    path: ((resources.files("node.api") / "static" / name).read_bytes(), content_type)
    for path, (name, content_type) in CONSOLE_FILES.items()
}
# No inline script or style, nothing fetched from elsewhere, no framing: the
# console shows what tenants stored (labels, payloads), and even text that
# slipped into the page as HTML could neither run nor load anything
# (https://www.w3.org/TR/CSP3/).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
CONSOLE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A node upgraded in place serves its new console at the next load.
    "Cache-Control": "no-cache",
}
# Several open consoles cost one backlog query a second, not one each.
BACKLOG_CACHE_SECONDS = 1.0
BACKLOG: web.AppKey[Backlog] = web.AppKey("backlog")
# Counting every status reads as many index entries as there are schedules:
# at most once in this many seconds, however many pages are open.
COUNTS_CACHE_SECONDS = 10.0
COUNTS: web.AppKey[StatusCounts] = web.AppKey("status_counts")
# A wake-up hint is some 150 bytes; the route takes no more than this.
WAKE_BODY_LIMIT = 4096
# The header a hint's signature travels in (node/delivery/hints.py signs it).
SIGNATURE_HEADER = "X-Scheduler-Signature"
CHAOS_BODY_LIMIT = 64 * 1024
_PEER_ADDRESS = re.compile(r"[\x21-\x7e]{1,300}")  # host:port, printable ASCII


routes = web.RouteTableDef()
# Only with CHAOS_MODE on or unfenced: never in production.
chaos_routes = web.RouteTableDef()


async def view_of(context: ApiContext) -> dict[str, Any]:
    """This node's view: members as gossip sees them, each bucket's lease as
    stored, and where this node's placement puts it."""
    leases = await context.lease_store.all()
    placement = context.ownership
    return {
        "self": context.config.node_id,
        "members": [
            {
                "id": m.id,
                "address": m.address,
                "state": m.state.label,
                "incarnation": m.incarnation,
                "http": dict(m.meta).get("http"),
                "placementVersion": parse_version(dict(m.meta).get("placement")),
            }
            for m in context.members()
        ],
        "buckets": {
            "count": context.config.buckets,
            "held": len(context.leases.usable()),
            "wanted": len(placement.wanted),
            "settled": placement.settled,
            "placementVersion": placement.placement_version,
            "owners": [
                {
                    "bucket": d["_id"],
                    "owner": d.get("owner"),
                    "token": d.get("token", 0),
                    # where this node's view places it; differs from
                    # owner only while a hand-over is under way
                    "placed": placement.owner_of(d["_id"]),
                }
                for d in leases
            ],
        },
    }


class Backlog:
    """Due-now schedules per bucket, for the console's cluster view, cached for a second."""

    def __init__(self) -> None:
        self._cached: tuple[float, dict[str, Any]] | None = None

    async def get(self, context: ApiContext) -> dict[str, Any]:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] >= BACKLOG_CACHE_SECONDS:
            # This node's buckets: the page asks each node for its own.
            due = await context.store.due_backlog(list(context.leases.usable()), context.now())
            self._cached = (
                now,
                {
                    "at": context.now().isoformat(),
                    "total": sum(due.values()),
                    "dueNow": {str(b): n for b, n in sorted(due.items())},
                },
            )
        return self._cached[1]


class StatusCounts:
    """Schedules of this node's buckets by status, for the console's cluster
    view, cached for COUNTS_CACHE_SECONDS."""

    def __init__(self) -> None:
        self._cached: tuple[float, dict[str, Any]] | None = None

    async def get(self, context: ApiContext) -> dict[str, Any]:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] >= COUNTS_CACHE_SECONDS:
            buckets = list(context.leases.usable())
            counts = await context.store.status_counts(buckets)
            body = {"at": context.now().isoformat(), "buckets": len(buckets), "counts": counts}
            self._cached = (now, body)
        return self._cached[1]


@routes.post("/v1/internal/wake")
async def wake(request: web.Request) -> web.Response:
    """A peer accepted a schedule in one of our buckets, due soon.

    No tenant's key (node/api/auth.py lets it through): with CLUSTER_KEYS
    set, a hint must be signed by the cluster and recent (401 otherwise,
    node/delivery/hints.py). With no cluster keys (the dev stack) the route
    is open to whoever reaches the port: a forged hint can only wake a
    poller early. Either way the body is small (413 past WAKE_BODY_LIMIT),
    and the signature is checked before the body is parsed."""
    context = request.app[CONTEXT]
    body = await read_body(request, WAKE_BODY_LIMIT)
    context.wakes.verify(body, request.headers.get(SIGNATURE_HEADER))
    data = parse_json(body)
    if not isinstance(data, dict) or "bucket" not in data or "dueAt" not in data:
        raise ValidationFailed('body must be {"bucket": int, "dueAt": time}')
    bucket = data["bucket"]
    if not isinstance(bucket, int) or isinstance(bucket, bool):
        raise ValidationFailed("bucket must be an integer", "bucket")
    due_at = parse_time(data["dueAt"], "dueAt")
    if "sentAt" in data:  # hints.py verified it when signed; well-formed either way
        parse_time(data["sentAt"], "sentAt")
    if not isinstance(data.get("from", ""), str):
        raise ValidationFailed("from must be a node id", "from")
    return json_response({"woken": context.wakes.wake(bucket, due_at)}, status=202)


@chaos_routes.put("/v1/chaos/partition")
async def chaos_partition(request: web.Request) -> web.Response:
    """Chaos mode only: drop gossip to these peer addresses (a partition
    simulated in process, where network namespaces are unavailable)."""
    data = await read_json(request, CHAOS_BODY_LIMIT)
    if not isinstance(data, dict) or "blocked" not in data:
        raise ValidationFailed('body must be {"blocked": ["host:port", ...]}')
    blocked = data["blocked"]
    if not isinstance(blocked, list) or not all(
        isinstance(a, str) and _PEER_ADDRESS.fullmatch(a) for a in blocked
    ):
        raise ValidationFailed("blocked must be a list of host:port strings", "blocked")
    return json_response({"blocked": request.app[CONTEXT].block_gossip(blocked)})


@routes.get("/v1/cluster")
async def cluster_view(request: web.Request) -> web.Response:
    return json_response(await view_of(request.app[CONTEXT]))


@routes.post("/v1/admin/drain")
async def drain(request: web.Request) -> web.Response:
    """Graceful leave without exiting (operators: before maintenance)."""
    context = request.app[CONTEXT]
    await no_body(request)
    if not await context.drain():
        raise ScheduleConflict(f"node is {context.state}, not running: nothing to drain")
    return json_response({"node": context.config.node_id, "state": context.state})


@routes.get("/v1/cluster/backlog")
async def cluster_backlog(request: web.Request) -> web.Response:
    return json_response(await request.app[BACKLOG].get(request.app[CONTEXT]))


@routes.get("/v1/cluster/counts")
async def cluster_counts(request: web.Request) -> web.Response:
    """This node's buckets' schedules by status (the console says they are
    this node's: the cluster's would be every node's added up)."""
    return json_response(await request.app[COUNTS].get(request.app[CONTEXT]))


async def console_file(request: web.Request) -> web.Response:
    """The operator console (schedules, one schedule's page and its verbs,
    bulk verbs, the cluster view): plain HTML, one script and one
    stylesheet over the JSON API, no library."""
    body, content_type = _CONSOLE[request.path]
    return web.Response(
        body=body, content_type=content_type, charset="utf-8", headers=CONSOLE_HEADERS
    )


for _path in CONSOLE_FILES:
    routes.get(_path)(console_file)


@routes.get("/v1/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return json_response(OPENAPI)


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """Liveness. A node cut off from the store left the placement long ago
    (after a lease's term); past UNHEALTHY_AFTER the pod is better restarted,
    perhaps on a host that reaches the store: 503."""
    context = request.app[CONTEXT]
    if not context.healthy():
        body = {"status": "store_unreachable", "node": context.config.node_id}
        return json_response(body, status=503)
    return json_response({"status": "ok", "node": context.config.node_id})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    checks = await context.readiness()
    ready = all(checks.values())
    body = {"ready": ready, "checks": checks, "producer": context.producer()}
    return json_response(body, status=200 if ready else 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    node_metrics = request.app[CONTEXT].metrics
    await node_metrics.prepare()
    return web.Response(
        body=node_metrics.render(), headers={"Content-Type": node_metrics.content_type}
    )
