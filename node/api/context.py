"""What the routes need of the node, declared by the routes (memberlist's
delegates: the layer that calls defines the interface). ``node.process.Node``
satisfies it; the API never imports the process, and a test can hand the app
anything that fits.

Every member may be used from any request handler, concurrently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from aiohttp import web

from membership.messages import MemberView
from node.config import NodeConfig
from node.metrics import NodeMetrics
from node.schedule.model import Limits
from node.store.contract import AttemptHistory, BucketLeases, Schedules
from node.tenants.admission import Admission
from node.tenants.directory import TenantDirectory
from node.tenants.reads import TenantReads


class Wakes(Protocol):
    def accepted(self, doc: dict[str, Any]) -> None:
        """A schedule was stored: wake its owner in time for it (never waits)."""

    def due(self, bucket: int, due_at: datetime) -> None:
        """Work of ``bucket`` falls due at ``due_at``: wake its owner in time."""

    def verify(self, body: bytes, signature: str | None) -> None:
        """A peer's hint (its raw body, and its signature header) is the
        cluster's: raises Unauthorized when the node has cluster keys and
        none of them signed it, or it is stale. Without keys, any hint is."""

    def wake(self, bucket: int, due_at: datetime) -> bool:
        """A peer's hint: True when this node holds ``bucket`` and woke its poller."""


class Leases(Protocol):
    def usable(self) -> Mapping[int, int]:
        """bucket -> token of every lease this node may start work under."""


class Placement(Protocol):
    """Where this node's view places the buckets (node/delivery/ownership.py)."""

    @property
    def wanted(self) -> frozenset[int]: ...

    @property
    def settled(self) -> bool: ...

    @property
    def placement_version(self) -> int: ...

    def owner_of(self, bucket: int) -> str | None: ...


class ApiContext(Protocol):
    config: NodeConfig  # the node's settings (read only)
    limits: Limits  # what a new schedule is held to: payload size, horizon, retry defaults
    metrics: NodeMetrics
    store: Schedules  # the schedules; raises StoreUnavailable when MongoDB does not answer
    history: AttemptHistory  # every delivery attempt still kept
    lease_store: BucketLeases  # every bucket's lease as stored (the cluster view reads it)
    admission: Admission  # tenants' topics, rates and pending caps
    directory: TenantDirectory  # API keys and tenants' policies (cached)
    reads: TenantReads  # what each tenant's calls may read of the store

    @property
    def wakes(self) -> Wakes: ...

    @property
    def leases(self) -> Leases: ...

    @property
    def ownership(self) -> Placement: ...

    @property
    def state(self) -> str:
        """The node's lifecycle phase: created, starting, running, draining, drained, ..."""

    def members(self) -> Sequence[MemberView]:
        """This node's membership view (empty before gossip started)."""

    def now(self) -> datetime:
        """The store's time as this node estimates it: what the API judges
        times by (the horizon, a trigger, a deadline), as delivery does, so a
        node with a wrong wall clock neither refuses nor mistimes anything."""

    async def readiness(self) -> dict[str, bool]:
        """Each readiness check by name; ready when all are true."""

    def healthy(self) -> bool:
        """Liveness: false once the store has been out of reach for UNHEALTHY_AFTER."""

    def producer(self) -> dict[str, Any]:
        """How the Kafka producer runs: idempotent or not, and why not."""

    async def drain(self) -> bool:
        """Hand every lease over and leave the cluster, the API still answering;
        False when the node is not running."""

    def block_gossip(self, addresses: list[str]) -> list[str]:
        """Chaos mode only: send no gossip to these peers; returns the set in force."""


CONTEXT: web.AppKey[ApiContext] = web.AppKey("context")


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.json_response(
        body, status=status, dumps=lambda o: json.dumps(o, separators=(",", ":"))
    )
