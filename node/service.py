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
from typing import Any

import structlog
from aiohttp import web
from aiokafka.errors import KafkaError
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from membership.config import preset
from membership.messages import Event as MembershipEvent
from membership.service import Membership
from node import logs
from node.api import build_app
from node.config import NodeConfig
from node.errors import BucketCountMismatch
from node.leases import LeaseManager
from node.metrics import NodeMetrics
from node.poller import BucketPoller
from node.publisher import KafkaPublisher
from node.store import RetryPolicy, ScheduleStore, utcnow

log = structlog.get_logger("node.service")

STARTUP_RETRY_MAX = 5.0  # seconds between attempts to reach the store or broker
READINESS_TIMEOUT = 1.0
STOP_GRACE = 10.0
LEAVE_GRACE = 2.0  # at most this long to get our Left out before shutting down


class Node:
    def __init__(self, config: NodeConfig) -> None:
        from datetime import timedelta

        self.config = config
        self.metrics = NodeMetrics()
        self.client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            config.mongo_uri,
            tz_aware=True,
            serverSelectionTimeoutMS=5000,
            appname=f"scheduler/{config.node_id}",
        )
        database = self.client[config.mongo_database]
        self.store = ScheduleStore(database, config.buckets)
        self.leases = LeaseManager(database["buckets"], config.node_id, config.lease_ttl)
        self.publisher = KafkaPublisher(config.kafka_bootstrap, client_id=config.node_id)
        self.poller = BucketPoller(
            self.store,
            self.leases,
            self.publisher,
            self.metrics,
            node_id=config.node_id,
            batch_size=config.batch_size,
            poll_interval=config.poll_interval,
            retry_policy=RetryPolicy(
                max_attempts=config.max_attempts,
                backoff=timedelta(seconds=config.retry_backoff),
                backoff_max=timedelta(seconds=config.retry_backoff_max),
            ),
            dead_letter_topic=config.dead_letter_topic,
        )
        self.membership: Membership | None = None
        self.state = "created"
        self.http_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop_leases = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------

    async def start(self, stopping: asyncio.Event | None = None) -> bool:
        """Start everything; returns False if ``stopping`` was set while waiting
        for the store or broker. Raises BucketCountMismatch (fatal)."""
        self.state = "starting"
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
        self._tasks = [
            asyncio.create_task(self._lease_loop(), name="leases"),
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
            # Other nodes reach our API here (wake-up hints, the cluster page).
            meta={"http": f"{config.advertise_host}:{self.http_port}"},
        )
        self.membership.subscribe(self._on_membership_event)
        self.metrics.watch_membership(self.membership)
        await self.membership.start()
        log.info("gossip started", address=self.membership.address, seeds=list(config.seeds))

    def _on_membership_event(self, event: MembershipEvent) -> None:
        log.info(
            "member " + event.kind.value,
            member=event.member.id,
            address=event.member.address,
            incarnation=event.member.incarnation,
        )

    async def _prepare_store(self) -> None:
        await self.store.prepare(utcnow())

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

    async def stop(self) -> None:
        if self.state in {"stopping", "stopped"}:
            return
        self.state = "stopping"
        log.info("node leaving")
        if self.membership is not None:
            # Tell the cluster first, so peers stop routing work here.
            await self.membership.leave(grace=LEAVE_GRACE)
        if self._runner is not None:
            await self._runner.cleanup()
        self._stop_leases.set()
        self.poller.stop()
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=STOP_GRACE)
            for task in pending:
                task.cancel()
        try:
            released = await self.leases.release()
            log.info("leases released on leave", buckets=len(released))
        except PyMongoError as exc:
            log.warning("could not release leases; they will expire", error=str(exc))
        await self.publisher.stop()
        await self.client.close()
        if self.membership is not None:
            await self.membership.stop()
        self.state = "stopped"
        log.info("node stopped")

    # -- ownership ---------------------------------------------------------------

    def wanted_buckets(self) -> range:
        # Single-node mode: every bucket that no other live node holds. The
        # ring of the membership issue narrows this to the buckets it assigns.
        return range(self.config.buckets)

    async def _lease_loop(self) -> None:
        while not self._stop_leases.is_set():
            try:
                lost = await self.leases.renew()
                gained = await self.leases.acquire(self.wanted_buckets())
                self.metrics.lease_losses.inc(len(lost))
                self.metrics.lease_acquisitions.inc(len(gained))
                if lost or gained:
                    self.poller.leases_changed()
            except PyMongoError as exc:
                self.metrics.lease_errors.inc()
                log.warning("lease round failed", error=str(exc))
            except Exception:
                self.metrics.lease_errors.inc()
                log.exception("unexpected error in lease round")
            self.metrics.buckets_owned.set(len(self.leases.usable()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_leases.wait(), timeout=self.leases.renew_interval)

    def schedule_accepted(self, doc: dict[str, Any]) -> None:
        """Wake the poller when it owns the new schedule and it is due soon."""
        if doc["bucket"] in self.leases.usable():
            self.poller.hint(doc["dueAt"])

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
                }
                for m in (self.membership.members() if self.membership else [])
            ],
            "buckets": {
                "count": self.config.buckets,
                "held": len(self.leases.usable()),
                "owners": [
                    {"bucket": d["_id"], "owner": d.get("owner"), "token": d.get("token", 0)}
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
