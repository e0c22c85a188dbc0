"""Prometheus metrics of one node (units in names, counters end in _total).

Each node owns its registry, so several nodes in one process (tests) never
share counters. The collectors read the parts they report on at scrape time
through small Protocols, so this module depends on none of those parts.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from membership.messages import MemberView, State
from node.schedule.model import DEFAULT_TENANT
from node.version import VERSION


class HasToken(Protocol):
    @property
    def token(self) -> int: ...


class LeaseBook(Protocol):
    """The leases this node holds (node/delivery/leases.py)."""

    @property
    def held(self) -> Mapping[int, HasToken]: ...

    @property
    def term(self) -> float: ...


@dataclass(frozen=True)
class DueFigures:
    """What is due in this node's buckets (node/delivery/due_outlook.py)."""

    backlog: int  # schedules due and not delivered yet
    oldest_age: float  # seconds the earliest of them is past its due time; 0: none
    # window (seconds) -> schedules falling due within it from now
    within: Mapping[int, int] = field(default_factory=dict)


class DueWork(Protocol):
    """The due work of this node's buckets (node/delivery/due_outlook.py)."""

    def figures(self) -> DueFigures: ...

    async def refresh(self) -> None:
        """What ``figures`` needs beyond this process, before a scrape."""


class StallCounts(Protocol):
    """How long the process stood still (node/delivery/stalls.py)."""

    @property
    def count(self) -> int: ...

    @property
    def seconds(self) -> float: ...


class GossipView(Protocol):
    """The gossip layer (membership.service.Membership)."""

    def members(self) -> Sequence[MemberView]: ...

    @property
    def swim(self) -> Any: ...

    @property
    def transport(self) -> Any: ...

    handler_errors: int


# Drop reasons always exported (at 0 until one happens), so an alert can
# rate() them from the start; any other reason the transport counts is too.
DROP_REASONS = (
    "too_large", "truncated", "version", "mac", "address", "malformed",
    "channel", "busy", "stream_error", "partitioned",
)  # fmt: skip

# Hosts an HTTP target's series name, at most: a tenant chooses its URLs, so
# without a bound every new host would be a new series. The rest are "other".
MAX_HOST_LABELS = 100
HTTP_TARGET_RESULTS = (
    "delivered", "retry", "refused", "waited", "circuit_open", "egress_refused",
)  # fmt: skip

# The *_created series double every counter's output and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Lateness matters from milliseconds (the SLA is under a second) to minutes
# (an outage); the buckets cover both ends.
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class NodeMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # Which release a node runs, as a label (the usual *_build_info, 1):
        # a dashboard joins it to any series, and a rolling upgrade shows
        # which nodes run what.
        Gauge(
            "scheduler_build_info",
            "Always 1; the version of the scheduler this node runs as a label",
            ["version"],
            registry=r,
        ).labels(VERSION).set(1)
        self.http_requests = Counter(
            "scheduler_http_requests_total",
            "HTTP requests by route and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "scheduler_http_request_duration_seconds",
            "Time to answer an API call, by route template and method (an answer's time "
            "in this node: the network and a queue before it are not in it)",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.schedules_created = Counter(
            "scheduler_schedules_created_total", "Schedules accepted with 201", registry=r
        )
        self.schedules_cancelled = Counter(
            "scheduler_schedules_cancelled_total", "Schedules cancelled", registry=r
        )
        self.bulk_changed = Counter(
            "scheduler_bulk_changed_total",
            "Schedules changed by a bulk verb (POST /v1/schedules:cancel, :pause, :resume, :retry)",
            ["verb"],
            registry=r,
        )
        self.delivered_priority = Counter(
            "scheduler_delivered_by_priority_total",
            "Deliveries by the schedule's priority (0-9, 9 first; 5 unless it says)",
            ["priority"],
            registry=r,
        )
        # The tenant label of every series that has one (``TenantLabels``).
        self.tenant_labels = TenantLabels()
        self.flow_held_back = Counter(
            "scheduler_flow_held_back_total",
            "Due schedules a round chose and flow control held back (their key's rate or "
            "parallelism spent): not attempts, they stay due. By tenant: registered tenants "
            "and default by name, any other as other",
            ["tenant"],
            registry=r,
        )
        self.flow_keys_limited = Gauge(
            "scheduler_flow_keys_limited",
            "Flow-control keys this node holds back now (their slice spent, or their slots "
            "held by other nodes)",
            registry=r,
        )
        self.deliveries = Counter(
            "scheduler_deliveries_total",
            "Publish outcomes: delivered, retried, failed, deferred (the broker could not take "
            "it: back to PENDING, no attempt spent), abandoned (lease lost mid-batch), "
            "fenced (published, but a newer owner had taken over), skipped (a missed "
            "occurrence of a recurring schedule under the skip policy), expired (a one-shot "
            "past its deadline, expireAfter, ended EXPIRED unpublished)",
            ["outcome"],
            registry=r,
        )
        self.tenant_deliveries = Counter(
            "scheduler_tenant_deliveries_total",
            "scheduler_deliveries_total by tenant: registered tenants and default by name, "
            "any other as other (a tenant registered while its work is delivered may count "
            "as other for a few seconds)",
            ["tenant", "outcome"],
            registry=r,
        )
        self.recovered = Counter(
            "scheduler_recovered_in_flight_total",
            "Schedules found IN_FLIGHT under an older token and delivered again "
            "(possible duplicates)",
            registry=r,
        )
        self.lateness = Histogram(
            "scheduler_delivery_lateness_seconds",
            "deliveredAt - executeAt",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.publish_seconds = Histogram(
            "scheduler_publish_duration_seconds",
            "Time to publish a batch and get every ack",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.store_seconds = Histogram(
            "scheduler_store_operation_duration_seconds",
            "Store round trips by operation",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "scheduler_batch_size",
            "Schedules per claimed batch",
            buckets=(1, 5, 10, 50, 100, 250, 500, 1000, 5000),
            registry=r,
        )
        self.buckets_owned = Gauge(
            "scheduler_buckets_owned", "Bucket leases this node holds", registry=r
        )
        self.lease_acquisitions = Counter(
            "scheduler_lease_acquisitions_total", "Bucket leases acquired", registry=r
        )
        self.lease_losses = Counter(
            "scheduler_lease_losses_total", "Bucket leases lost (not released)", registry=r
        )
        self.rebalance_seconds = Histogram(
            "scheduler_rebalance_duration_seconds",
            "From a placement change until every wanted bucket is held",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.hints = Counter(
            "scheduler_wake_hints_total",
            "Wake-up hints to other owners: sent, refused, failed, dropped",
            ["outcome"],
            registry=r,
        )
        self.change_feed_open = Gauge(
            "scheduler_change_feed_open",
            "1 while this node follows the store's change feed (its idle buckets are not "
            "read before their next due time), 0 while it polls every bucket",
            registry=r,
        )
        self.change_feed_events = Counter(
            "scheduler_change_feed_events_total",
            "Writes the change feed told of that may make work due sooner",
            registry=r,
        )
        self.lease_errors = Counter(
            "scheduler_lease_errors_total",
            "Lease rounds that failed to reach the store",
            registry=r,
        )
        self.history_written = Counter(
            "scheduler_history_written_total", "Execution history records written", registry=r
        )
        self.broker_available = Gauge(
            "scheduler_broker_available",
            "0 while this node finds the broker down (claiming paused, no attempt spent), else 1",
            registry=r,
        )
        self.broker_available.set(1)
        self.store_reachable = Gauge(
            "scheduler_store_reachable",
            "0 while this node's probe of the store (a clock reading every few seconds) fails",
            registry=r,
        )
        self.store_reachable.set(1)
        self.placeable = Gauge(
            "scheduler_placeable",
            "1 while this node advertises it can work; 0 after a lease's term without the "
            "store (its buckets move to the others), until it has reached the store as long",
            registry=r,
        )
        self.placeable.set(1)
        self.producer_idempotent = Gauge(
            "scheduler_producer_idempotent",
            "1 when the Kafka producer is idempotent (a producer retry cannot publish a "
            "record twice), 0 when the broker refused it or KAFKA_IDEMPOTENCE is off",
            registry=r,
        )
        self.gossip_signed = Gauge(
            "scheduler_gossip_signed",
            "1 when gossip and wake hints are signed with CLUSTER_KEYS; 0 when the node runs "
            "unsigned (GOSSIP_UNSIGNED=on: anyone reaching the gossip port can forge members)",
            registry=r,
        )
        self.history_dropped = Counter(
            "scheduler_history_dropped_total",
            "Execution history records not written (queue full or store error)",
            registry=r,
        )

        self.http_target_requests = Counter(
            "scheduler_http_target_requests_total",
            "HTTP target deliveries by host and result: delivered (2xx), retry (failed, an "
            "attempt spent: 5xx, 408, 425, 429 without Retry-After, no connection, timed out), "
            "refused (ended: another 4xx, a 3xx, no signing secret), waited (429 or 503 with "
            "Retry-After, or a failed probe of an open circuit: no attempt spent), "
            "circuit_open (not sent: the host's circuit is open), egress_refused (not sent: an "
            "address the egress policy refuses). At most 100 hosts by name, the rest as other",
            ["host", "result"],
            registry=r,
        )
        self.http_hosts = HostLabels(MAX_HOST_LABELS)
        self._due: DueWork | None = None

    def delivery_outcome(self, outcome: str, tenants: Iterable[str]) -> None:
        """Count one delivery outcome per tenant named (the tenant of each
        schedule it befell): in ``scheduler_deliveries_total`` (at 0 as well:
        the series exists from the first time) and by tenant."""
        by_label = Tally(self.tenant_labels(tenant) for tenant in tenants)
        self.deliveries.labels(outcome).inc(sum(by_label.values()))
        for label, count in sorted(by_label.items()):
            self.tenant_deliveries.labels(label, outcome).inc(count)

    def held_back(self, tenant: str, count: int) -> None:
        """Count due schedules of ``tenant`` that flow control held back."""
        self.flow_held_back.labels(self.tenant_labels(tenant)).inc(count)

    def http_target(self, host: str, result: str) -> None:
        """Count one HTTP target delivery (``result`` one of HTTP_TARGET_RESULTS)."""
        self.http_target_requests.labels(self.http_hosts(host), result).inc()

    def watch_circuits(self, circuits: Circuits) -> None:
        self.registry.register(CircuitCollector(circuits, self.http_hosts))

    def watch_membership(self, membership: GossipView) -> None:
        self.registry.register(MembershipCollector(membership))

    def watch_leases(self, leases: LeaseBook) -> None:
        self.registry.register(LeaseCollector(leases))

    def watch_stalls(self, stalls: StallCounts) -> None:
        self.registry.register(StallCollector(stalls))

    def watch_reads(self, documents_read: Mapping[str, int]) -> None:
        self.registry.register(ReadsCollector(documents_read))

    def watch_clock(self, clock: ClockView) -> None:
        self.registry.register(ClockCollector(clock))

    def watch_due(self, due: DueWork) -> None:
        self._due = due
        self.registry.register(DueCollector(due))

    async def prepare(self) -> None:
        """Before a scrape: what a collector needs of the store (bounded and
        cached by its owner: ``DueWork.refresh``)."""
        if self._due is not None:
            await self._due.refresh()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HostLabels:
    """The ``host`` label of a series: the host itself for the first
    ``limit`` hosts seen, "other" for the rest (for the process's life, so
    a host's series never changes label)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.named: set[str] = set()

    def __call__(self, host: str) -> str:
        if host in self.named:
            return host
        if len(self.named) < self.limit:
            self.named.add(host)
            return host
        return "other"


class TenantLabels:
    """The ``tenant`` label of a series: the tenant's name for the registered
    tenants (an operator's list, ``known``) and the default tenant, "other"
    for any other. With AUTH off a call may name any tenant it likes, and
    each name would otherwise be new series for the process's life."""

    OTHER = "other"

    def __init__(self) -> None:
        self.named: frozenset[str] = frozenset({DEFAULT_TENANT})

    def known(self, registered: Iterable[str]) -> None:
        """The registered tenants now (the tenant directory's list)."""
        self.named = frozenset({DEFAULT_TENANT, *registered})

    def names(self, tenant: str) -> bool:
        return tenant in self.named

    def __call__(self, tenant: str) -> str:
        return tenant if tenant in self.named else self.OTHER


class Circuits(Protocol):
    """The HTTP sink's circuit breakers (node/delivery/sinks/breaker.py)."""

    def open_hosts(self) -> Iterable[str]: ...


class CircuitCollector(Collector):
    """Open circuits by host: 1 while a host's calls are not sent (its
    circuit open, or its probe out), 0 for the other named hosts; "other"
    counts the open circuits of the hosts past the label limit."""

    def __init__(self, circuits: Circuits, labels: HostLabels) -> None:
        self.circuits = circuits
        self.labels = labels

    def collect(self):  # type: ignore[no-untyped-def]
        family = GaugeMetricFamily(
            "scheduler_http_target_circuit_open",
            "Open circuits of HTTP target hosts: 1 while calls to the host are not sent, "
            "else 0 (other: how many of the hosts past the first 100 are open)",
            labels=["host"],
        )
        counts = dict.fromkeys(self.labels.named, 0)
        for host in self.circuits.open_hosts():
            label = self.labels(host)
            counts[label] = counts.get(label, 0) + 1
        for label, count in sorted(counts.items()):
            family.add_metric([label], count)
        yield family


class LeaseCollector(Collector):
    """One series per bucket this node holds: its lease token. Summed over
    the cluster by bucket, it shows each bucket's owner count (1, or 2 for a
    moment during a hand-over); by instance, what each node holds."""

    def __init__(self, leases: LeaseBook) -> None:
        self.leases = leases

    def collect(self):  # type: ignore[no-untyped-def]
        tokens = GaugeMetricFamily(
            "scheduler_bucket_lease_token",
            "Fencing token of each bucket lease this node holds, by bucket",
            labels=["bucket"],
        )
        for bucket, lease in sorted(self.leases.held.items()):
            tokens.add_metric([str(bucket)], lease.token)
        yield tokens
        yield GaugeMetricFamily(
            "scheduler_lease_term_seconds",
            "How long this node's next lease write lasts: LEASE_TTL, stretched while "
            "lease round trips are slow",
            value=self.leases.term,
        )


class ClockView(Protocol):
    """The store's clock as this node estimates it (node/delivery/clock.py)."""

    @property
    def offset(self) -> float: ...

    @property
    def uncertainty(self) -> float | None: ...


class ClockCollector(Collector):
    """How far this host's clock is from the store's, which decides what is due."""

    def __init__(self, clock: ClockView) -> None:
        self.clock = clock

    def collect(self):  # type: ignore[no-untyped-def]
        yield GaugeMetricFamily(
            "scheduler_clock_offset_seconds",
            "Seconds the store's clock is ahead of this host's (what is due follows the store's)",
            value=self.clock.offset,
        )
        uncertainty = self.clock.uncertainty
        if uncertainty is not None:
            yield GaugeMetricFamily(
                "scheduler_clock_uncertainty_seconds",
                "Half the round trip of the store-clock reading in use: the most the estimate "
                "of the store's time can be off",
                value=uncertainty,
            )


class DueCollector(Collector):
    """What is due in this node's buckets, from the poller's views of them."""

    def __init__(self, due: DueWork) -> None:
        self.due = due

    def collect(self):  # type: ignore[no-untyped-def]
        figures = self.due.figures()
        yield GaugeMetricFamily(
            "scheduler_due_backlog",
            "Schedules due and not delivered yet in the buckets this node holds: the claims "
            "being delivered, and the PENDING ones the poller's views of the buckets hold (no "
            "store read); where a view holds fewer than are due (a backlog past its read), the "
            "store's count of its bucket, at most every 10 s, up to 10,000 a bucket, carried "
            "forward by what was taken since. A lower bound past that, and for a bucket just "
            "gained until it is read",
            value=figures.backlog,
        )
        yield GaugeMetricFamily(
            "scheduler_oldest_due_age_seconds",
            "The store's time now minus the due time of the earliest schedule due and not "
            "delivered yet in the buckets this node holds (0: none): how late the oldest "
            "waiting work is",
            value=figures.oldest_age,
        )
        within = GaugeMetricFamily(
            "scheduler_due_within",
            "Schedules falling due within the window from now (those due already are in "
            "scheduler_due_backlog), as the poller's views of this node's buckets hold them: a "
            "forecast, and a lower bound. A view holds its bucket's earliest PENDING schedules "
            "up to its last read's bound (a poll interval ahead; with the change feed a "
            "minute, and an idle bucket's is read only just before its next due time) and "
            "within a share of the read budget (a truncated view, full, knows nothing past "
            "its last). What lies past either is not counted, so a window longer than the "
            "reads look ahead says little more than the minute",
            labels=["window"],
        )
        for window, count in sorted(figures.within.items()):
            within.add_metric([f"{window}s"], count)
        yield within


class ReadsCollector(Collector):
    """Documents the owner's store reads returned, by query: due (a bucket's
    due work), fair (tenants absent from a full view), recover (what an older
    owner left in flight). Over deliveries, what each record costs in reads."""

    QUERIES = ("due", "fair", "recover")

    def __init__(self, documents_read: Mapping[str, int]) -> None:
        self.documents_read = documents_read

    def collect(self):  # type: ignore[no-untyped-def]
        family = CounterMetricFamily(
            "scheduler_store_documents_read",
            "Documents returned by the bucket owner's reads, by query (due, fair, recover)",
            labels=["query"],
        )
        for query in self.QUERIES:
            family.add_metric([query], self.documents_read.get(query, 0))
        yield family


class StallCollector(Collector):
    """Times the node's process stood still: a pause longer than the lease
    TTL costs the node its leases, and a gossip pause can get it declared dead."""

    def __init__(self, stalls: StallCounts) -> None:
        self.stalls = stalls

    def collect(self):  # type: ignore[no-untyped-def]
        yield CounterMetricFamily(
            "scheduler_process_stalls",
            "Times the process stood still for a second or more (paused, frozen, "
            "or a blocked event loop)",
            value=self.stalls.count,
        )
        yield CounterMetricFamily(
            "scheduler_process_stalled_seconds",
            "Seconds the process stood still, summed over its stalls",
            value=self.stalls.seconds,
        )


class MembershipCollector(Collector):
    """Reads the gossip layer's counters at scrape time (no bookkeeping twice)."""

    def __init__(self, membership: GossipView) -> None:
        self.membership = membership

    def collect(self):  # type: ignore[no-untyped-def]
        membership = self.membership
        members = GaugeMetricFamily(
            "scheduler_members", "Members in this node's view by state", labels=["state"]
        )
        view = membership.members()
        for state in State:
            members.add_metric([state.label], sum(1 for m in view if m.state == state))
        yield members
        swim = membership.swim
        if swim is not None:
            stats = swim.stats
            for name, value, help_text in (
                ("probes", stats.probes, "Direct probes sent"),
                ("probe_failures", stats.probe_failures, "Probes with no ack, direct or indirect"),
                ("ping_reqs", stats.ping_reqs, "Indirect probe requests sent"),
                ("suspicions", stats.suspicions, "Members this node began to suspect"),
                ("deaths", stats.deaths, "Members declared dead"),
                ("refutations", stats.refutations, "Times this node refuted a suspicion of itself"),
                (
                    "refused_members",
                    stats.refused_members,
                    "Members heard of and not taken: the table full, or too many new in one "
                    "datagram (a flood of made-up members)",
                ),
                (
                    "refused_updates",
                    stats.refused_updates,
                    "Suspect or Dead updates refused at the top of the incarnation range "
                    "(their subject could never refute them)",
                ),
            ):
                family = CounterMetricFamily(f"scheduler_gossip_{name}", help_text)
                family.add_metric([], value)
                yield family
            health = GaugeMetricFamily(
                "scheduler_gossip_local_health",
                "Lifeguard local health score (0 healthy; timeouts stretch by score + 1)",
            )
            health.add_metric([], swim.awareness.score)
            yield health
        transport = membership.transport
        for direction in ("in", "out"):
            family = CounterMetricFamily(
                f"scheduler_gossip_bytes_{direction}", f"Gossip bytes {direction}"
            )
            family.add_metric([], transport.counters[f"bytes_{direction}"])
            yield family
        dropped = CounterMetricFamily(
            "scheduler_gossip_dropped_packets",
            "Gossip packets dropped by reason (too_large, truncated, version, mac, address, "
            "malformed, channel: a push-pull off the stream or a stream frame of another "
            "kind, busy: a stream connection past the cap, stream_error; partitioned: chaos "
            "mode's filter)",
            labels=["reason"],
        )
        for reason in sorted({*DROP_REASONS, *transport.dropped}):
            dropped.add_metric([reason], transport.dropped[reason])
        yield dropped
        for name, help_text in (
            ("send_errors", "Gossip sends that failed or were refused (a bad destination)"),
            ("receiver_errors", "Gossip packets whose handling raised (logged; the loop goes on)"),
            ("udp_reopens", "Times the gossip UDP socket closed and was bound again"),
            (
                "streams_out_busy",
                "Push-pull sends not made: as many stream connections out as allowed at once",
            ),
        ):
            family = CounterMetricFamily(f"scheduler_gossip_{name}", help_text)
            family.add_metric([], transport.counters[name])
            yield family
        errors = CounterMetricFamily(
            "scheduler_gossip_handler_errors",
            "Gossip rounds or packets whose handling raised (logged; the driver goes on)",
        )
        errors.add_metric([], membership.handler_errors)
        yield errors
