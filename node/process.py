"""The node process: wires the store, the leases, the poller, the publisher
and the HTTP API together, and starts and stops them in order.

Start: store (pin B, indexes) -> broker -> HTTP -> leases and poller.
Stop (graceful leave): HTTP stops taking calls -> the poller finishes its
batch -> leases are released so the next owner need not wait for expiry ->
producer and client close.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from datetime import datetime, timedelta
from typing import Any

import structlog
from aiohttp import web
from aiokafka.errors import KafkaError
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from membership.config import preset
from membership.messages import Event as MembershipEvent
from membership.messages import State
from membership.service import Membership
from node import logs
from node.api.app import build_app
from node.config import NodeConfig
from node.delivery.hints import WakeHints
from node.delivery.leases import LeaseManager
from node.delivery.ownership import Ownership
from node.delivery.poller import BucketPoller
from node.delivery.publisher import KafkaPublisher
from node.delivery.stalls import StallMeter
from node.errors import BucketCountMismatch
from node.metrics import NodeMetrics
from node.schedule.retry import RetryPolicy
from node.store.history import HistoryStore, HistoryWriter
from node.store.schedules import DURABLE, ScheduleStore, utcnow
from node.tenants.admission import Admission
from node.tenants.model import DEFAULT_TENANT, TenantDirectory, TenantStore
from node.tenants.quotas import PendingQuota
from ring import PLACEMENT_VERSION, parse_version

log = structlog.get_logger("node.service")

STARTUP_RETRY_MAX = 5.0  # seconds between attempts to reach the store or broker
READINESS_TIMEOUT = 1.0
STOP_GRACE = 10.0
LEAVE_GRACE = 2.0
BACKLOG_CACHE_SECONDS = 1.0  # at most this long to get our Left out before shutting down


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.metrics = NodeMetrics()
        self._backlog: tuple[float, dict[str, Any]] | None = None
        self.client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            config.mongo_uri,
            tz_aware=True,
            serverSelectionTimeoutMS=5000,
            appname=f"scheduler/{config.node_id}",
        )
        database = self.client[config.mongo_database]
        unfenced = config.chaos_mode == "unfenced"
        self.store = ScheduleStore(
            database,
            config.buckets,
            unfenced=unfenced,
            misfire_threshold=timedelta(seconds=config.misfire_threshold),
        )
        self.stalls = StallMeter()
        self.metrics.watch_stalls(self.stalls)
        # A lease write lost in a database crash could move a token backwards
        # and undo the fence: leases are written as durably as schedules.
        self.leases = LeaseManager(
            database["buckets"].with_options(write_concern=DURABLE),
            config.node_id,
            config.lease_ttl,
            stalled_since=self.stalls.stalled_since,
            unfenced=unfenced,
        )
        self.metrics.watch_leases(self.leases)
        self.tenants = TenantStore(database)
        self.directory = TenantDirectory(self.tenants)
        self.admission = Admission(
            self.directory,
            PendingQuota(self.store.count_pending),
            alive_nodes=lambda: len(self._alive_members()),
        )
        self.publisher = KafkaPublisher(config.kafka_bootstrap, client_id=config.node_id)
        self.history = HistoryStore(
            database["history"],
            retention=timedelta(seconds=config.history_retention),
            cap=config.history_per_schedule,
        )
        self.history_writer = (
            HistoryWriter(self.history, self.metrics) if config.history_retention > 0 else None
        )
        self.poller = BucketPoller(
            self.store,
            self.leases,
            self.publisher,
            self.metrics,
            node_id=config.node_id,
            batch_size=config.batch_size,
            poll_interval=config.poll_interval,
            batch_linger=config.batch_linger,
            retry_policy=RetryPolicy(
                max_attempts=config.max_attempts,
                backoff=timedelta(seconds=config.retry_backoff),
                backoff_max=timedelta(seconds=config.retry_backoff_max),
            ),
            dead_letter_topic=config.dead_letter_topic,
            history=self.history_writer,
            tenant_names=self._tenant_names if config.fair_tenants else None,
        )
        self.membership: Membership | None = None
        self.ownership = Ownership(
            config.node_id,
            config.buckets,
            self.leases,
            self.poller,
            self.metrics,
            alive_members=self._alive_members,
            joined=lambda: self.membership is not None and self.membership.joined,
        )
        self.hints = WakeHints(config.node_id, self.metrics)
        self.state = "created"
        self.http_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stall_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self, stopping: asyncio.Event | None = None) -> bool:
        """Start everything; returns False if ``stopping`` was set while waiting
        for the store or broker. Raises BucketCountMismatch (fatal)."""
        self.state = "starting"
        self._stall_task = asyncio.create_task(self.stalls.run(), name="stalls")
        stopping = stopping or asyncio.Event()
        if not await self._retry_until_ready("store", self._prepare_store, stopping):
            return False
        if not await self._retry_until_ready("broker", self.publisher.start, stopping):
            return False
        self._runner = web.AppRunner(build_app(self), access_log=None, handle_signals=False)
        await self._runner.setup()
        host, port = self.config.http_bind
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        self.http_port = self._bound_port(site)
        await self._start_membership()
        if self.history_writer is not None:
            self.history_writer.start()
        self._tasks = [
            asyncio.create_task(self.ownership.run(), name="ownership"),
            asyncio.create_task(self.poller.run(), name="poller"),
        ]
        self.state = "running"
        log.info(
            "node started",
            http=f"{host}:{self.http_port}",
            buckets=self.config.buckets,
            mongo_database=self.config.mongo_database,
        )
        return True

    async def _start_membership(self) -> None:
        config = self.config
        self.membership = Membership(
            config.node_id,
            bind=config.gossip_bind,
            advertise_host=config.advertise_host,
            config=preset(config.membership_preset),
            seeds=config.seeds,
            keys=config.cluster_keys,
            # Other nodes reach our API here (wake-up hints, the cluster page),
            # and learn which bucket placement we run, so all use the oldest one.
            meta={
                "http": f"{config.advertise_host}:{self.http_port}",
                "placement": str(PLACEMENT_VERSION),
            },
        )
        self.membership.subscribe(self._on_membership_event)
        self.metrics.watch_membership(self.membership)
        await self.membership.start()
        log.info("gossip started", address=self.membership.address, seeds=list(config.seeds))

    def block_gossip(self, addresses: list[str]) -> list[str]:
        """Chaos mode: send no gossip to these peers; returns the set in force."""
        if self.membership is not None:
            self.membership.transport.blocked = frozenset(addresses)
            log.warning("chaos: gossip blocked", peers=sorted(addresses))
            return sorted(self.membership.transport.blocked)
        return []

    async def _tenant_names(self) -> list[str]:
        """Tenants the poller serves fairly: every registered one, and any
        this node accepted work for lately."""
        registered = await self.directory.names()
        return sorted({DEFAULT_TENANT, *registered, *self.admission.tenants_seen()})

    def _alive_members(self) -> dict[str, int]:
        """Alive member -> the placement version it advertises."""
        if self.membership is None:
            return {self.config.node_id: PLACEMENT_VERSION}
        return {
            m.id: parse_version(dict(m.meta).get("placement"))
            for m in self.membership.members()
            if m.state == State.ALIVE
        }

    def _on_membership_event(self, event: MembershipEvent) -> None:
        self.ownership.view_changed()
        log.info(
            "member " + event.kind.value,
            member=event.member.id,
            address=event.member.address,
            incarnation=event.member.incarnation,
        )

    async def _prepare_store(self) -> None:
        await self.store.prepare(utcnow())
        await self.tenants.prepare()
        if self.history_writer is not None:
            await self.history.prepare()

    async def _retry_until_ready(self, what: str, attempt: Any, stopping: asyncio.Event) -> bool:
        delay = 0.2
        while not stopping.is_set():
            try:
                await attempt()
                return True
            except BucketCountMismatch:
                raise
            except (PyMongoError, KafkaError, OSError) as exc:
                log.warning(f"waiting for the {what}", error=str(exc), retry_in=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=delay)
            delay = min(delay * 2, STARTUP_RETRY_MAX)
        return False

    @staticmethod
    def _bound_port(site: web.TCPSite) -> int:
        server = site._server  # aiohttp exposes no public accessor for the bound port
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else int(site._port or 0)

    async def drain(self) -> bool:
        """Graceful leave without exiting: finish the batch in flight, hand
        every lease over, leave the cluster, and stop gossiping. The API
        keeps answering (any node accepts schedules); readiness turns false.
        False when the node is not running (starting, draining or stopping)."""
        if self.state != "running":
            return False
        self.state = "draining"
        log.info("node draining")
        await self._hand_over()
        self.state = "drained"
        log.info("node drained: no buckets, out of the cluster; the API still answers")
        return True

    async def stop(self) -> None:
        if self.state in {"stopping", "stopped"}:
            return
        drained = self.state == "drained"
        self.state = "stopping"
        log.info("node leaving")
        # Graceful leave (DESIGN.md): stop taking calls, finish the batch in
        # flight, release every lease, then tell the cluster we left, so the
        # next owners find the buckets free and need not wait for expiry.
        if self._runner is not None:
            await self._runner.cleanup()
        if not drained:
            await self._hand_over()
        await self.hints.close()
        if self.history_writer is not None:
            await self.history_writer.close()
        await self.publisher.stop()
        await self.client.close()
        if self._stall_task is not None:
            self._stall_task.cancel()
        self.state = "stopped"
        log.info("node stopped")

    async def _hand_over(self) -> None:
        """Stop the work loops, release every lease, leave the cluster."""
        self.ownership.stop()
        self.poller.stop()
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=STOP_GRACE)
            for task in pending:
                task.cancel()
        try:
            await self.ownership.release_all()
        except PyMongoError as exc:
            log.warning("could not release leases; they will expire", error=str(exc))
        if self.membership is not None:
            await self.membership.leave(grace=LEAVE_GRACE)
            await self.membership.stop()

    # -- wake-up hints --------------------------------------------------------------

    def schedule_accepted(self, doc: dict[str, Any]) -> None:
        """Make sure the owner of a new schedule wakes in time for it.

        Ours: wake our poller if the schedule is due before its next round.
        Another node's: tell it over HTTP when it is due within a poll
        interval, so lateness does not depend on that node's poll interval.
        """
        bucket, due_at = doc["bucket"], doc["dueAt"]
        if bucket in self.leases.usable():
            self.poller.hint(due_at)
            return
        owner = self.ownership.owner_of(bucket)
        if owner is None or owner == self.config.node_id or self.membership is None:
            return
        if (due_at - utcnow()).total_seconds() > self.config.poll_interval:
            return  # the owner's own look-ahead will see it in time
        address = next(
            (dict(m.meta).get("http") for m in self.membership.members() if m.id == owner), None
        )
        if address:
            self.hints.send(address, bucket, due_at)

    def wake(self, bucket: int, due_at: datetime) -> bool:
        """A peer's hint: True when we hold the bucket and woke the poller."""
        if bucket in self.leases.usable():
            self.poller.hint(due_at)
            return True
        return False

    # -- views ----------------------------------------------------------------

    async def readiness(self) -> dict[str, bool]:
        store_ok = True
        try:
            await asyncio.wait_for(self.store.ping(), timeout=READINESS_TIMEOUT)
        except (PyMongoError, TimeoutError):
            store_ok = False
        return {
            "started": self.state == "running",
            "gossip": self.membership is not None and self.membership.swim is not None,
            "store": store_ok,
            "broker": await self.publisher.reachable(),
        }

    async def backlog(self) -> dict[str, Any]:
        """Due-now schedules per bucket, for the cluster page. Cached for a
        second: several open pages cost one query a second, not one each."""
        now = time.monotonic()
        if self._backlog is None or now - self._backlog[0] >= BACKLOG_CACHE_SECONDS:
            due = await self.store.due_backlog(utcnow())
            self._backlog = (
                now,
                {
                    "at": utcnow().isoformat(),
                    "total": sum(due.values()),
                    "dueNow": {str(b): n for b, n in sorted(due.items())},
                },
            )
        return self._backlog[1]

    async def cluster_view(self) -> dict[str, Any]:
        leases = (
            await self.store.database["buckets"]
            .find({}, {"owner": 1, "token": 1})
            .sort("_id", 1)
            .to_list()
        )
        return {
            "self": self.config.node_id,
            "members": [
                {
                    "id": m.id,
                    "address": m.address,
                    "state": m.state.label,
                    "incarnation": m.incarnation,
                    "http": dict(m.meta).get("http"),
                    "placementVersion": parse_version(dict(m.meta).get("placement")),
                }
                for m in (self.membership.members() if self.membership else [])
            ],
            "buckets": {
                "count": self.config.buckets,
                "held": len(self.leases.usable()),
                "wanted": len(self.ownership.wanted),
                "settled": self.ownership.settled,
                "placementVersion": self.ownership.placement_version,
                "owners": [
                    {
                        "bucket": d["_id"],
                        "owner": d.get("owner"),
                        "token": d.get("token", 0),
                        # where this node's view places it; differs from
                        # owner only while a hand-over is under way
                        "placed": self.ownership.owner_of(d["_id"]),
                    }
                    for d in leases
                ],
            },
        }


async def serve(config: NodeConfig) -> int:
    """Run one node until SIGTERM or SIGINT; returns the process exit code."""
    logs.configure(config.log_format, config.log_level, config.node_id)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    node = Node(config)
    try:
        started = await node.start(stopping)
    except BucketCountMismatch as exc:
        log.error("refusing to start", error=str(exc))
        await node.client.close()
        return 2
    if started:
        await stopping.wait()
    await node.stop()
    return 0
