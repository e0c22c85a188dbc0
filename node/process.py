"""The node process: builds every part from ``NodeConfig``, wires them
together, and starts and stops them in order.

Start: store (pin B, indexes) -> broker -> HTTP -> gossip -> leases and poller.
Stop (graceful leave): HTTP stops taking calls -> the poller finishes its
batch -> leases are released so the next owner need not wait for expiry ->
the cluster hears we left -> producer and client close.

The lifecycle is a table (``TRANSITIONS``), as h11 keeps its states: an event
that is not in the table for the current phase is a bug and raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import structlog
from aiohttp import web
from pymongo import AsyncMongoClient

from membership.config import preset
from membership.messages import Event as MembershipEvent
from membership.messages import MemberView, State
from membership.service import Membership
from node import logs, telemetry
from node.api.app import build_app
from node.config import SETTINGS, NodeConfig
from node.delivery.clock import StoreClock
from node.delivery.due_outlook import DueOutlook
from node.delivery.hints import WakeHints, WakeRouter
from node.delivery.history_writer import HistoryWriter
from node.delivery.leases import LeaseManager
from node.delivery.ownership import Ownership
from node.delivery.poller import configured_poller
from node.delivery.server_watch import ServerWatch
from node.delivery.sinks.http import HttpSink
from node.delivery.sinks.kafka import KafkaPublisher
from node.delivery.stalls import StallMeter
from node.errors import CannotStart, SchedulerError, StoreUnavailable
from node.metrics import NodeMetrics
from node.schedule.model import DEFAULT_TENANT, Limits
from node.schedule.times import skew_wall_clock, utcnow
from node.schedule.webhook import secret_key
from node.store.boundary import DURABLE
from node.store.contract import AttemptHistory, BucketLeases, Schedules
from node.store.flow import FlowStore
from node.store.history import HistoryStore
from node.store.leases import LeaseStore
from node.store.schedules import ScheduleStore
from node.store.tenants import TenantStore
from node.tenants.admission import Admission
from node.tenants.directory import TenantDirectory
from node.tenants.quotas import PendingQuota
from node.tenants.reads import TenantReads
from node.tracing import OFF, Tracing
from node.version import VERSION
from ring import PLACEMENT_VERSION

log = structlog.get_logger(__name__)

STARTUP_RETRY_MAX = 5.0  # seconds between attempts to reach the store or broker
STOP_GRACE = 10.0
# At a stop, how long calls in progress may take to finish before their
# connections are closed (aiohttp's default, 60 s, is past the 30 to 40 s an
# orchestrator gives a stopping pod before SIGKILL).
HTTP_SHUTDOWN_GRACE = 10.0
LEAVE_GRACE = 2.0  # at most this long to get our Left out before shutting down


class Phase(enum.Enum):
    CREATED = "created"
    STARTING = "starting"  # waiting for the store and the broker
    RUNNING = "running"  # serving, gossiping, holding leases, delivering
    DRAINING = "draining"  # handing every lease over (the API still answers)
    DRAINED = "drained"  # out of the cluster, no leases; the API still answers
    STOPPING = "stopping"
    STOPPED = "stopped"


# phase -> event -> next phase. Anything else is a bug.
TRANSITIONS: dict[Phase, dict[str, Phase]] = {
    Phase.CREATED: {"start": Phase.STARTING, "stop": Phase.STOPPING},
    Phase.STARTING: {"started": Phase.RUNNING, "stop": Phase.STOPPING},
    Phase.RUNNING: {"drain": Phase.DRAINING, "stop": Phase.STOPPING},
    Phase.DRAINING: {"drained": Phase.DRAINED, "stop": Phase.STOPPING},
    Phase.DRAINED: {"stop": Phase.STOPPING},
    Phase.STOPPING: {"stopped": Phase.STOPPED},
    Phase.STOPPED: {},
}


class Node:
    """One scheduler node. Satisfies ``node.api.context.ApiContext``."""

    def __init__(self, config: NodeConfig, tracing: Tracing = OFF) -> None:
        self.config = config
        self.tracing = tracing
        self.phase = Phase.CREATED
        self.metrics = NodeMetrics()
        # Two clients, two connection pools: the owner's work (leases, due
        # reads, claims, marks, the store's clock, which is also the probe of
        # reaching the store) never queues behind the API's reads, however
        # many a flood of listings holds (docs/operations.md, "Bounds").
        self.client: AsyncMongoClient[dict[str, Any]] = self._mongo_client("work")
        self.api_client: AsyncMongoClient[dict[str, Any]] = self._mongo_client(
            "api", maxPoolSize=config.api_pool_size
        )
        database = self.client[config.mongo_database]
        unfenced = config.chaos_mode == "unfenced"
        self.limits = Limits(
            max_payload_bytes=config.max_payload_bytes,
            horizon=timedelta(seconds=config.horizon),
            retry=config.retry,
            egress=config.http_targets_allow,
        )
        api_database = self.api_client[config.mongo_database]
        # The API's schedules (ApiContext.store), and the owner's (the poller's).
        self.store: Schedules = ScheduleStore(
            api_database,
            config.buckets,
            unfenced=unfenced,
            retention=timedelta(seconds=config.retention),
            read_timeout=config.read_timeout,
        )
        self.delivery_store = ScheduleStore(
            database,
            config.buckets,
            unfenced=unfenced,
            retention=timedelta(seconds=config.retention),
        )
        self.metrics.watch_reads(self.delivery_store.documents_read)
        self.stalls = StallMeter()
        self.metrics.watch_stalls(self.stalls)
        # A lease write lost in a database crash could move a token backwards
        # and undo the fence: leases are written as durably as schedules.
        self.lease_store: BucketLeases = LeaseStore(
            database["buckets"].with_options(write_concern=DURABLE), config.node_id
        )
        self.leases = LeaseManager(
            self.lease_store,
            config.lease_ttl,
            # The host's clock, not the estimate of the store's: that one
            # runs on the monotonic clock between readings, and would stand
            # still through the same freeze.
            wall=time.time,
            stalled_since=self.stalls.stalled_since,
            unfenced=unfenced,
        )
        self.metrics.watch_leases(self.leases)
        self.tenants = TenantStore(api_database)
        self.directory = TenantDirectory(self.tenants)
        self.admission = Admission(
            self.directory,
            PendingQuota(self.store.count_pending),
            alive_nodes=self._alive_count,
            topic_known=lambda topic: self.publisher.topic_known(topic),
        )
        self.reads = TenantReads(
            self.directory,
            default_rate=config.read_budget,
            alive_nodes=self._alive_count,
        )
        if config.chaos_mode != "off" and config.chaos_clock_skew:
            skew_wall_clock(config.chaos_clock_skew)
        # The store's clock decides what is due, whatever this host's says.
        self.clock = StoreClock(self.delivery_store.server_time)
        self.metrics.watch_clock(self.clock)
        # Reading it is also the probe of whether this node reaches the store;
        # the broker is asked too: who can work holds the buckets.
        self.servers = ServerWatch(
            self.clock,
            lambda: self.publisher.reachable(),
            lease_ttl=config.lease_ttl,
            unhealthy_after=config.unhealthy_after,
            broker_started=lambda: self.publisher.started,
        )
        self.metrics.store_reachable.set_function(lambda: 1 if self.servers.store.answering else 0)
        self.publisher = KafkaPublisher(
            config.kafka_bootstrap,
            client_id=config.node_id,
            idempotence=config.kafka_idempotence,
            clock=self.clock.now,
            tracing=tracing,
        )
        # HTTP targets: each call resolved, checked against the egress
        # policy and signed with its tenant's secrets (or the cluster's).
        self.http_sink = HttpSink(
            config.http_targets_allow,
            self._signing_keys,
            clock=self.clock.now,
            max_per_host=config.http_max_per_host,
            breaker_failures=config.http_breaker_failures,
            breaker_cooldown=config.http_breaker_cooldown,
            breaker_cooldown_max=config.http_breaker_cooldown_max,
            max_wait=config.http_retry_after_max,
            ca_bundle=config.http_ca_bundle or None,
            metrics=self.metrics,
            tracing=tracing,
        )
        kept = timedelta(seconds=config.history_retention)
        cap = config.history_per_schedule
        self.history: AttemptHistory = HistoryStore(
            api_database["history"], retention=kept, cap=cap
        )  # the API's
        self.history_writer = (
            HistoryWriter(HistoryStore(database["history"], retention=kept, cap=cap), self.metrics)
            if config.history_retention > 0
            else None
        )
        # Flow control's counts (``node/store/flow.py``).
        self.flow = FlowStore(database, f"{config.node_id}/{uuid.uuid4().hex[:8]}")
        self.poller = configured_poller(
            config,
            self.delivery_store,
            self.leases,
            self.publisher,
            self.metrics,
            history=self.history_writer,
            tenant_names=self._tenant_names,
            registered_tenants=self.directory.names,
            wall=self.clock.now,
            http=self.http_sink,
            flow=self.flow,
        )
        # The due backlog and its age, from the poller's views; where they
        # fall short, counted on the API's pool (``due_outlook.py``).
        self.metrics.watch_due(
            DueOutlook(
                self.poller.book,
                self.leases.usable,
                self.clock.now,
                self.store.due_backlog,
                in_flight=self.poller.in_flight,
            )
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
        self.hints = WakeHints(
            config.node_id, self.metrics, config.cluster_keys, wall=self.clock.now
        )
        self.wakes = WakeRouter(
            config.node_id,
            poller=self.poller,
            hints=self.hints,
            usable=self.leases.usable,
            owner_of=self.ownership.owner_of,
            address_of=self._http_address_of,
            poll_interval=config.poll_interval,
            wall=self.clock.now,
        )
        self.http_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stall_task: asyncio.Task[None] | None = None
        self._clock_task: asyncio.Task[None] | None = None

    def _mongo_client(self, role: str, **options: Any) -> AsyncMongoClient[dict[str, Any]]:
        return AsyncMongoClient(
            self.config.mongo_uri,
            tz_aware=True,
            serverSelectionTimeoutMS=5000,
            # Every call has a deadline: a hung store is a 503, not a wait.
            timeoutMS=int(self.config.store_timeout * 1000),
            appname=f"scheduler/{self.config.node_id}/{role}",
            **options,
        )

    @property
    def state(self) -> str:
        return self.phase.value

    def _move(self, event: str) -> None:
        following = TRANSITIONS[self.phase].get(event)
        if following is None:
            raise RuntimeError(f"cannot {event} a node that is {self.phase.value}")
        self.phase = following

    # -- lifecycle ---------------------------------------------------------------

    async def start(self, stopping: asyncio.Event | None = None) -> bool:
        """Start everything; returns False if ``stopping`` was set while waiting
        for the store or broker. Raises CannotStart (fatal)."""
        self._move("start")
        self._stall_task = asyncio.create_task(self.stalls.run(), name="stalls")
        stopping = stopping or asyncio.Event()
        if not await self._retry_until_ready("store", self._prepare_store, stopping):
            return False
        if not await self._retry_until_ready("store's clock", self.clock.read, stopping):
            return False
        self._clock_task = asyncio.create_task(self._watch_servers(), name="server-watch")
        if not await self._retry_until_ready("broker", self.publisher.start, stopping):
            return False
        self.metrics.producer_idempotent.set(1 if self.publisher.idempotent else 0)
        await self.http_sink.start()
        self._runner = web.AppRunner(
            build_app(self, self.tracing),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=HTTP_SHUTDOWN_GRACE,
        )
        await self._runner.setup()
        host, port = self.config.http_bind
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise cannot_listen("http_bind", "HTTP", (host, port), exc) from None
        self.http_port = self._bound_port(site)
        await self._start_membership()
        if self.history_writer is not None:
            self.history_writer.start()
        self._tasks = [
            asyncio.create_task(self.ownership.run(), name="ownership"),
            asyncio.create_task(self.poller.run(), name="poller"),
        ]
        self._move("started")
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
            # Other nodes reach our API here (wake-up hints, the console's links),
            # and learn which bucket placement we run, so all use the oldest one.
            meta=self._meta(),
        )
        self.membership.subscribe(self._on_membership_event)
        self.metrics.watch_membership(self.membership)
        try:
            await self.membership.start()
        except socket.gaierror as exc:
            raise CannotStart(
                f"cannot resolve the advertised host {config.advertise_host!r} ({exc.strerror}): "
                "give this node's address with --advertise-host (ADVERTISE_HOST)"
            ) from None
        except OSError as exc:
            raise cannot_listen(
                "gossip_bind", "gossip (UDP and TCP)", config.gossip_bind, exc
            ) from None
        except ValueError as exc:  # an address others could not reach it at
            raise CannotStart(f"{exc}: set --advertise-host (ADVERTISE_HOST)") from None
        signed = bool(config.cluster_keys)
        self.metrics.gossip_signed.set(1 if signed else 0)
        if signed:
            log.info(
                "gossip started",
                address=self.membership.address,
                seeds=list(config.seeds),
                signed=True,
            )
        else:
            log.warning(
                "gossip started UNSIGNED (GOSSIP_UNSIGNED=on): anyone who reaches the gossip "
                "port can add members or declare nodes dead; set CLUSTER_KEYS outside a "
                "trusted network",
                address=self.membership.address,
                seeds=list(config.seeds),
                signed=False,
            )

    def _meta(self) -> dict[str, str]:
        # Other nodes reach our API here (wake-up hints, the console's links),
        # learn which bucket placement we run, so all use the oldest one,
        # and whether we can work (reach the store).
        return {
            "http": f"{self.config.advertise_host}:{self.http_port}",
            "placement": str(PLACEMENT_VERSION),
            **self.servers.advertised(),
        }

    async def _watch_servers(self) -> None:
        """Read the store's clock and ask the broker for its brokers, every
        few seconds (``server_watch.py``). A change of heart is gossiped (the
        others place without us, or again with us) and applied to our own
        view at once. What the probes last found is also what /readyz says,
        so a readiness probe costs the servers nothing."""
        await self.servers.run(self._placeability_changed, self.ownership.view_changed)

    def _placeability_changed(self) -> None:
        store, broker = self.servers.store.placeable, self.servers.broker.placeable
        self.metrics.placeable.set(1 if store and broker else 0)
        if store and broker:
            log.warning("the store and the broker answer again: back in the placement")
        else:
            log.error(
                "out of the placement: a server has not answered for a lease's term, "
                "the others take our buckets",
                store_reachable=store,
                broker_reachable=broker,
                store_silent_s=round(self.servers.store.unreachable_for, 1),
                broker_silent_s=round(self.servers.broker.unreachable_for, 1),
            )
        if self.membership is not None:
            self.membership.update_meta(self._meta())
        self.ownership.view_changed()

    def healthy(self) -> bool:
        """Liveness: false once the store has been out of reach for
        UNHEALTHY_AFTER (the orchestrator restarts the pod)."""
        return self.servers.store.healthy

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
        return [*{DEFAULT_TENANT, *registered, *self.admission.tenants_seen()}]  # the poller sorts

    async def _signing_keys(self, tenant: str) -> list[bytes]:
        """The keys an HTTP delivery of ``tenant`` is signed with, newest
        first: its own secrets (two during a rotation), else the cluster's
        HTTP_SIGNING_SECRET; none, and the delivery is refused."""
        policy = await self.directory.policy(tenant)
        secrets = policy.signing_secrets or (
            (self.config.http_signing_secret,) if self.config.http_signing_secret else ()
        )
        return [secret_key(secret) for secret in secrets]

    def members(self) -> list[MemberView]:
        return self.membership.members() if self.membership is not None else []

    def now(self) -> datetime:
        return self.clock.now()

    def _answered(self) -> dict[str, dict[str, str]]:
        """The alive members (id -> gossip metadata) that answered this
        node's own probe: one that is merely gossiped about (a forged Alive,
        a ghost) never gets buckets nobody would deliver, nor a share."""
        if self.membership is None:
            return {self.config.node_id: {}}
        return {
            m.id: dict(m.meta)
            for m in self.membership.members()
            if m.state == State.ALIVE and m.answered
        }

    def _alive_count(self) -> int:
        """How many nodes grant a share of a tenant's budgets: every alive
        member, cut from a server or not (a cut node still serves the API)."""
        return len(self._answered())

    def _alive_members(self) -> dict[str, int]:
        """The placement's input: the members that can work
        (reachability.Workers) -> the placement version each advertises.
        Asked by the placement only: Workers counts a cut's grace between
        its answers, and says when to ask again (``pending``)."""
        return self.servers.placed(self._answered())

    def _http_address_of(self, member_id: str) -> str | None:
        """Where a member's HTTP API listens, as it advertises in gossip."""
        return next((dict(m.meta).get("http") for m in self.members() if m.id == member_id), None)

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
        await self.delivery_store.learn_server()
        # The leases learn it from the owner's store: the embedded SecantusDB
        # takes other lease statements (node/store/leases.py, ``chunked``).
        if isinstance(self.lease_store, LeaseStore):
            self.lease_store.chunked = self.delivery_store.sliced
        await self.tenants.prepare()
        self.flow.embedded = self.delivery_store.sliced
        await self.flow.prepare()
        if self.history_writer is not None:
            await self.history.prepare()

    async def _retry_until_ready(
        self, what: str, attempt: Callable[[], Awaitable[None]], stopping: asyncio.Event
    ) -> bool:
        delay = 0.2
        while not stopping.is_set():
            try:
                await attempt()
                return True
            except SchedulerError as exc:
                if not exc.retriable:
                    raise  # CannotStart: the configuration must change
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
        if "drain" not in TRANSITIONS[self.phase]:
            return False
        self._move("drain")
        log.info("node draining")
        await self._hand_over()
        if self.phase is Phase.DRAINING:  # not stopped meanwhile
            self._move("drained")
            log.info("node drained: no buckets, out of the cluster; the API still answers")
        return True

    async def stop(self, *, refused: bool = False) -> None:
        """Graceful leave, then close everything. ``refused``: after a start
        that raised CannotStart, whose refusal stays the last line logged."""
        if "stop" not in TRANSITIONS[self.phase]:
            return  # stopping or stopped already
        drained = self.phase is Phase.DRAINED
        self._move("stop")
        if not refused:
            log.info("node leaving")
        # Graceful leave (DESIGN.md): stop taking calls, finish the batch in
        # flight, release every lease, then tell the cluster we left, so the
        # next owners find the buckets free and need not wait for expiry.
        # The hand-over runs beside the HTTP shutdown, not after it: the
        # shutdown waits up to HTTP_SHUTDOWN_GRACE for calls in progress, and
        # one slow client must not keep the buckets that long. (Calls still
        # answered meanwhile only write to the store, as any node's do.)
        http = (
            asyncio.create_task(self._runner.cleanup(), name="http-shutdown")
            if self._runner is not None
            else None
        )
        if not drained:
            await self._hand_over()
        if http is not None:
            await http
        await self.hints.close()
        if self.history_writer is not None:
            await self.history_writer.close()
        await self.publisher.stop()
        await self.http_sink.stop()
        await self.client.close()
        await self.api_client.close()
        for task in (self._stall_task, self._clock_task):
            if task is not None:
                task.cancel()
        if self.config.chaos_mode != "off" and self.config.chaos_clock_skew:
            skew_wall_clock(0)  # the skew is the process's; tests run several nodes in one
        self._move("stopped")
        if not refused:
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
        except StoreUnavailable as exc:
            log.warning("could not release leases; they will expire", error=str(exc))
        if self.membership is not None:
            await self.membership.leave(grace=LEAVE_GRACE)
            await self.membership.stop()

    # -- views ----------------------------------------------------------------

    def producer(self) -> dict[str, Any]:
        """How the Kafka producer runs (KAFKA_IDEMPOTENCE and what the broker granted)."""
        info: dict[str, Any] = {
            "idempotence": self.config.kafka_idempotence,
            "idempotent": self.publisher.idempotent,
        }
        if self.publisher.refusal:
            info["refused"] = self.publisher.refusal
        return info

    async def readiness(self) -> dict[str, bool]:
        """From what the last probes found (``_watch_servers``): a readiness
        probe, however often the orchestrator sends it, costs no store or
        broker round trip."""
        return {
            "started": self.phase is Phase.RUNNING,
            "gossip": self.membership is not None and self.membership.swim is not None,
            "store": self.servers.store.answering,
            "broker": self.publisher.started and self.servers.broker.answering,
        }


def cannot_listen(attr: str, what: str, address: tuple[str, int], exc: OSError) -> CannotStart:
    """A bind that failed, as one line for the operator: what, where, and
    what to change (the setting that chose the address)."""
    setting = next(s for s in SETTINGS if s.attr == attr)
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    where = f"{address[0]}:{address[1]}"
    if exc.errno == errno.EADDRINUSE:
        todo = "another process holds it: stop that one, or give this node another port with"
    else:
        todo = "give this node another address with"
    return CannotStart(
        f"cannot listen for {what} on {where} ({reason}): {todo} {setting.flag} ({setting.env})"
    )


async def serve(config: NodeConfig) -> int:
    """Run one node until SIGTERM or SIGINT; returns the process exit code."""
    logs.configure(config.log_format, config.log_level, config.node_id)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        tracing = telemetry.start(config.node_id, VERSION)
    except CannotStart as exc:
        log.error("refusing to start", error=str(exc))
        return 2
    node = Node(config, tracing)
    try:
        try:
            started = await node.start(stopping)
        except CannotStart as exc:
            log.error("refusing to start", error=str(exc))
            await node.stop(refused=True)  # what had started (producer, sessions, sockets) closes
            return 2
        if started:
            await stopping.wait()
        await node.stop()
        return 0
    finally:
        tracing.close()
