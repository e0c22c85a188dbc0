"""Node configuration: one immutable, validated object built from flags and
environment (flags win), before anything is started.

Every setting is declared once in ``SETTINGS`` with its environment name, its
flag, its default and why that default; the CLI, the validation and the manual's
table (docs/configuration.md) all come from that list.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from node.schedule.egress import EgressPolicy
from node.schedule.model import NO_RANGES_ALLOWED, is_topic
from node.schedule.retry import RetryPolicy
from node.schedule.webhook import secret_key
from ring import MAX_BUCKETS


class ConfigError(ValueError):
    """A setting has a value the node cannot run with. The message names it."""


def _parse_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be an integer, got {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def _parse_seconds(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be a number of seconds, got {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g} seconds, got {value:g}")
        return value

    return parse


def _parse_float(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be a number, got {text!r}") from None
        if not low <= value <= high:  # NaN too
            raise ValueError(f"must be between {low:g} and {high:g}, got {value:g}")
        return value

    return parse


def _parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"must be HOST:PORT, got {text!r}")
    port = _parse_int(0, 65535)(port_text)
    return host.strip("[]"), port


def _parse_seeds(text: str) -> tuple[str, ...]:
    seeds = tuple(s.strip() for s in text.split(",") if s.strip())
    for seed in seeds:
        # A seed is HOST:PORT, or a DNS name (resolved to several members later).
        if ":" in seed:
            _parse_host_port(seed)
    return seeds


_NODE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _parse_node_id(text: str) -> str:
    if not _NODE_ID.fullmatch(text):
        raise ValueError(f"must be 1-64 of [A-Za-z0-9._-], got {text!r}")
    return text


def _parse_optional_node_id(text: str) -> str:
    """A node id, or empty for the host name (decided in ``load``)."""
    return text and _parse_node_id(text)


def _parse_mongo_uri(text: str) -> str:
    if not text.startswith(("mongodb://", "mongodb+srv://")):
        raise ValueError("must start with mongodb:// or mongodb+srv://")
    return text


def _parse_bootstrap(text: str) -> tuple[str, ...]:
    servers = tuple(s.strip() for s in text.split(",") if s.strip())
    if not servers:
        raise ValueError("must list at least one HOST:PORT")
    for server in servers:
        _parse_host_port(server)
    return servers


def _parse_optional_topic(text: str) -> str:
    if text and not is_topic(text):
        raise ValueError(f"must be a Kafka topic name or empty, got {text!r}")
    return text


def _parse_optional_url(text: str) -> str:
    if text and not text.startswith(("http://", "https://")):
        raise ValueError(f"must be an http or https URL or empty, got {text!r}")
    return text


def _parse_egress(text: str) -> EgressPolicy:
    return EgressPolicy.parse(text)


def _parse_optional_secret(text: str) -> str:
    if text:
        secret_key(text)  # raises ValueError naming what is wrong
    return text


def _parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _parse_switch(text: str) -> bool:
    if text not in {"on", "off"}:
        raise ValueError(f"must be on or off, got {text!r}")
    return text == "on"


def _parse_keys(text: str) -> tuple[bytes, ...]:
    keys = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            key = base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be base64 keys separated by commas") from None
        if len(key) not in (16, 24, 32):
            raise ValueError(f"each key must be 16, 24 or 32 bytes, got {len(key)}")
        keys.append(key)
    return tuple(keys)


def _parse_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,63}", text):
        raise ValueError(f"must be a database name of [A-Za-z0-9_-], got {text!r}")
    return text


@dataclass(frozen=True, kw_only=True)
class Setting:
    attr: str
    env: str
    flag: str
    default: str
    parse: Callable[[str], Any]
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        attr="node_id",
        env="NODE_ID",
        flag="--node-id",
        default="",
        parse=_parse_optional_node_id,
        help="unique name of this node in the cluster (default: the host name)",
    ),
    Setting(
        attr="http_bind",
        env="HTTP_BIND",
        flag="--http-bind",
        default="0.0.0.0:8080",
        parse=_parse_host_port,
        help="HOST:PORT the HTTP API listens on",
    ),
    Setting(
        attr="gossip_bind",
        env="GOSSIP_BIND",
        flag="--gossip-bind",
        default="0.0.0.0:7946",
        parse=_parse_host_port,
        help="HOST:PORT for gossip: UDP for probes, TCP on the same port for state exchange",
    ),
    Setting(
        attr="advertise_host",
        env="ADVERTISE_HOST",
        flag="--advertise-host",
        default="",
        parse=str,
        help="address other nodes reach this one at (default: the bind host, "
        "or the host name when binding 0.0.0.0)",
    ),
    Setting(
        attr="seeds",
        env="SEEDS",
        flag="--seeds",
        default="",
        parse=_parse_seeds,
        help="comma-separated HOST:PORT gossip seeds, or a DNS name resolving to several",
    ),
    Setting(
        attr="membership_preset",
        env="MEMBERSHIP_PRESET",
        flag="--membership-preset",
        default="lan",
        parse=_parse_choice("lan", "fast"),
        help="gossip timing: lan (memberlist's LAN values) or fast (small, quiet networks)",
    ),
    Setting(
        attr="cluster_keys",
        env="CLUSTER_KEYS",
        flag="--cluster-keys",
        default="",
        parse=_parse_keys,
        help="comma-separated base64 keys (16, 24 or 32 bytes) that sign gossip and wake hints "
        "with HMAC-SHA256; the first signs, any verifies (rotation). Required unless "
        "GOSSIP_UNSIGNED=on",
    ),
    Setting(
        attr="gossip_unsigned",
        env="GOSSIP_UNSIGNED",
        flag="--gossip-unsigned",
        default="off",
        parse=_parse_switch,
        # Unsigned, anyone who can send a UDP datagram to the gossip port can
        # make up members (the placement would hand them buckets nobody
        # delivers), declare live ones dead and open the wake route: a node
        # refuses to start without keys unless told, in so many words, that
        # its network is trusted (a laptop, a test).
        help="on: run without CLUSTER_KEYS, gossip and wake hints unsigned (a trusted network "
        "only: anyone reaching the gossip port could then join, or bury, members); off: "
        "refuse to start without CLUSTER_KEYS",
    ),
    Setting(
        attr="auth",
        env="AUTH",
        flag="--auth",
        default="on",
        parse=_parse_switch,
        # On unless asked: a node reachable by several teams must not let one
        # read or cancel another's schedules. `python -m node dev` turns it off.
        help="on: every API call needs `Authorization: Bearer KEY` of a tenant "
        "(`python -m node tenants add NAME`); off: calls name their tenant, no keys",
    ),
    Setting(
        attr="mongo_uri",
        env="MONGO_URI",
        flag="--mongo-uri",
        default="mongodb://127.0.0.1:27017/",
        parse=_parse_mongo_uri,
        help="MongoDB connection string (production: a replica set with w=majority)",
    ),
    Setting(
        attr="mongo_database",
        env="MONGO_DATABASE",
        flag="--mongo-database",
        default="scheduler",
        parse=_parse_name,
        help="database holding schedules, buckets, cluster",
    ),
    Setting(
        attr="store_timeout",
        env="STORE_TIMEOUT",
        flag="--store-timeout",
        default="5",
        parse=_parse_seconds(0.5, 120),
        # Every store call has a deadline (pymongo's timeoutMS): a hung store
        # turns into 503s and retries, never into requests and loops waiting
        # forever. Lease writes get the lease's term instead, when shorter.
        help="longest a store call may take (client-side operation timeout); an API call "
        "past it answers 503 with Retry-After",
    ),
    Setting(
        attr="api_pool_size",
        env="API_POOL_SIZE",
        flag="--api-pool-size",
        default="16",
        parse=_parse_int(1, 1000),
        # The API's calls to the store go through a pool of their own: the
        # owner's work (lease renewals, the store probe, due reads, claims
        # and marks) has the other, and never waits behind a flood of reads.
        help="connections the API's store calls may hold at once (the owner's work has a "
        "pool of its own)",
    ),
    Setting(
        attr="read_timeout",
        env="READ_TIMEOUT",
        flag="--read-timeout",
        default="2",
        parse=_parse_seconds(0.05, 120),
        # A listing that finds its page in an index range takes milliseconds
        # on MongoDB; one that would scan for long (a rare status in a large
        # tenant, counts of a large range) is stopped by the server instead
        # of holding it while the owners wait (node/store/schedules.py). Not
        # shorter: the embedded store reads a tenant of 20,000 in 0.6 s.
        help="longest a read of many schedules (a listing page, its counts, a bulk verb's "
        "selection) may run in the store before the server stops it (503 read_timeout: "
        "narrow it, or retry)",
    ),
    Setting(
        attr="read_budget",
        env="READ_BUDGET",
        flag="--read-budget",
        default="0.2",
        parse=_parse_float(0.001, 1000),
        # The store's time is what a read flood takes from delivery: one
        # tenant's API calls may keep it busy this share of the time (a
        # listing that finds its page at once costs little, one that scans
        # a large tenant what the scan took). node/tenants/reads.py.
        help="seconds of store time a second one tenant's API calls may take (every call but "
        "a create is charged its store calls' time), cluster-wide, each node granting its "
        "share; 429 above. A tenant's own (tenants set --read-budget) wins",
    ),
    Setting(
        attr="unhealthy_after",
        env="UNHEALTHY_AFTER",
        flag="--unhealthy-after",
        default="300",
        parse=_parse_seconds(0, 86400),
        # Long before this the node has left the placement (after LEASE_TTL
        # without the store) and its buckets have moved: this is for the pod
        # itself, which a restart may put on a host or address that reaches
        # the store. Not shorter: a store failover or a short outage must not
        # restart every pod at once.
        help="seconds without reaching the store after which /healthz fails (liveness: the "
        "orchestrator restarts the pod); 0 never",
    ),
    Setting(
        attr="kafka_bootstrap",
        env="KAFKA_BOOTSTRAP",
        flag="--kafka-bootstrap",
        default="127.0.0.1:9092",
        parse=_parse_bootstrap,
        help="comma-separated Kafka bootstrap servers",
    ),
    Setting(
        attr="kafka_idempotence",
        env="KAFKA_IDEMPOTENCE",
        flag="--kafka-idempotence",
        default="auto",
        parse=_parse_choice("auto", "on", "off"),
        # Without idempotence a producer retry (a stalled broker appends a
        # request the producer then sends again) publishes a record twice
        # under one claim; with it, the broker drops the copy. auto: on where
        # the broker grants it (any Kafka since 0.11), off where it refuses
        # (the embedded broker), said loudly in the log, /readyz and
        # scheduler_producer_idempotent.
        help="auto: an idempotent producer where the broker grants one, else without "
        "(logged, shown in /readyz); on: refuse to start without one; off: never",
    ),
    Setting(
        attr="buckets",
        env="BUCKETS",
        flag="--buckets",
        default="256",
        parse=_parse_int(1, MAX_BUCKETS),
        help="bucket count B; pinned in the database on first use, every node must agree; "
        '256 places evenly up to about 32 nodes, 4,096 up to 128 (Operations, "Sizing")',
    ),
    Setting(
        attr="lease_ttl",
        env="LEASE_TTL",
        flag="--lease-ttl",
        default="6",
        parse=_parse_seconds(1, 600),
        # A killed owner's buckets come back once its lease expires and the
        # failure detector has declared it dead, whichever is later. 6 s is
        # about the lan preset's detection time, so detection sets the pace:
        # at 10 s the lease did (python -m bench failover: delivery resumed
        # within 7.4-9.5 s at 10, 4.6-5.4 s at 6). Shorter means more renew
        # writes and less room for a slow renew (TTL - TTL/3 - margin) before
        # a node stops work, though a slow store stretches the term (node/leases.py);
        # exclusivity never depends on it (fencing tokens).
        help="seconds a node's session, and with it every bucket lease it holds, lasts "
        "without renewal (longer while lease writes are slow, see Ownership); renewed "
        "every TTL/3, one write",
    ),
    Setting(
        attr="poll_interval",
        env="POLL_INTERVAL",
        flag="--poll-interval",
        default="1",
        parse=_parse_seconds(0.05, 60),
        # The loop sleeps until the next known due time; this bounds how long
        # a schedule written by another node waits before the owner sees it.
        help="longest sleep of the delivery loop when nothing is known to be due",
    ),
    Setting(
        attr="batch_linger",
        env="BATCH_LINGER",
        flag="--batch-linger",
        default="0.1",
        parse=_parse_seconds(0, 1),
        # Kafka's linger.ms for the store: every round costs a claim and a
        # mark however few schedules it carries, so schedules falling due
        # close together share them. Under load rounds batch by themselves
        # (a round lasts as long as the store takes); at 50 a second spread
        # (1,000 over 20 s, one node) 0.1 s took the store from 2.8 to 1.25
        # round trips and from 7.7 to 4.0 CPU seconds per 1,000 records,
        # median lateness from 7 to 63 ms and p99 from 136 to 165 ms
        # (three nodes: 3.05 to 2.16 round trips, 7.8 to 5.9 s; 2026-11-27).
        # A schedule due after a quiet spell goes at once: the linger only
        # spaces rounds that follow each other.
        help="shortest time between two delivery rounds of a node, in seconds: "
        "schedules falling due close together share a claim and a mark; 0 for "
        "the lowest latency at the most store round trips per record",
    ),
    Setting(
        attr="batch_size",
        env="BATCH_SIZE",
        flag="--batch-size",
        default="500",
        parse=_parse_int(1, 10_000),
        # The ceiling of the claim window (node/delivery/claim_window.py):
        # after an idle round a claim takes 32, and each full one doubles it.
        help="most schedules claimed and published per store round trip "
        "(after an idle round a claim takes 32, doubling each full round up to this)",
    ),
    Setting(
        attr="max_payload_bytes",
        env="MAX_PAYLOAD_BYTES",
        flag="--max-payload-bytes",
        default=str(256 * 1024),
        parse=_parse_int(1, 16 * 1024 * 1024 - 64 * 1024),
        help="largest payload accepted (413 above it); below Kafka's message.max.bytes",
    ),
    Setting(
        attr="horizon",
        env="HORIZON",
        flag="--horizon",
        default=str(366 * 86400),
        parse=_parse_seconds(1, 100 * 366 * 86400),
        help="furthest into the future executeAt may be, in seconds",
    ),
    Setting(
        attr="max_attempts",
        env="MAX_ATTEMPTS",
        flag="--max-attempts",
        default="5",
        parse=_parse_int(1, 100),
        help="publish attempts before a schedule becomes DELIVERY_FAILED",
    ),
    Setting(
        attr="retry_backoff",
        env="RETRY_BACKOFF",
        flag="--retry-backoff",
        default="1",
        parse=_parse_seconds(0.01, 3600),
        help="first retry delay; doubles per attempt with jitter, capped by --retry-backoff-max",
    ),
    Setting(
        attr="retry_backoff_max",
        env="RETRY_BACKOFF_MAX",
        flag="--retry-backoff-max",
        default="60",
        parse=_parse_seconds(0.01, 86400),
        help="longest retry delay",
    ),
    Setting(
        attr="misfire_threshold",
        env="MISFIRE_THRESHOLD",
        flag="--misfire-threshold",
        default="60",
        parse=_parse_seconds(1, 86400),
        # Quartz's misfireThreshold: a lateness any failover causes (lease
        # TTL plus detection, about 15 s) stays below it, so an ordinary
        # hand-over delivers every occurrence whatever the policy.
        help="seconds an occurrence of a recurring schedule may be late before it counts "
        "as missed and its misfire policy (fire_once, fire_all, skip) applies",
    ),
    Setting(
        attr="watch_changes",
        env="WATCH_CHANGES",
        flag="--watch-changes",
        default="on",
        parse=_parse_switch,
        help="on: follow the store's change stream, so a bucket with nothing due is not read "
        "before its next due time (falls back to polling where the store has none); off: "
        "read every idle bucket once a POLL_INTERVAL",
    ),
    Setting(
        attr="fair_tenants",
        env="FAIR_TENANTS",
        flag="--fair-tenants",
        default="on",
        parse=_parse_switch,
        help="on: when a backlog fills a bucket's view, each tenant's earliest due schedules "
        "share every batch; off: plain oldest first (only to measure what fairness buys)",
    ),
    Setting(
        attr="retention",
        env="RETENTION",
        flag="--retention",
        default=str(7 * 86400),
        parse=_parse_seconds(1, 10 * 366 * 86400),
        # At the seeds' 50M schedules a day, keeping every finished schedule
        # grows the collection by 18 billion documents a year. The write that
        # ends a schedule sets expireAt, and a TTL index removes it: a client
        # id stays idempotent for this long after its schedule ended.
        help="seconds a schedule is kept once it has ended (delivered, cancelled, failed, "
        "expired, a chain's end), then removed by a TTL index; a client id is idempotent "
        "for this long",
    ),
    Setting(
        attr="history_retention",
        env="HISTORY_RETENTION",
        flag="--history-retention",
        default=str(7 * 86400),
        parse=_parse_seconds(0, 10 * 366 * 86400),
        help="seconds each delivery attempt is kept for GET /v1/schedules/{id}/history "
        "(a TTL index); 0 keeps no history",
    ),
    Setting(
        attr="history_per_schedule",
        env="HISTORY_PER_SCHEDULE",
        flag="--history-per-schedule",
        default="100",
        parse=_parse_int(1, 10_000),
        help="most attempts kept per schedule; a long-lived recurring schedule "
        "overwrites its oldest",
    ),
    Setting(
        attr="dead_letter_topic",
        env="DEAD_LETTER_TOPIC",
        flag="--dead-letter-topic",
        default="",
        parse=_parse_optional_topic,
        help="topic that receives schedules past the retry limit (off when empty)",
    ),
    Setting(
        attr="dead_letter_url",
        env="DEAD_LETTER_URL",
        flag="--dead-letter-url",
        default="",
        parse=_parse_optional_url,
        help="http(s) URL that receives (POST, signed) schedules past the retry limit instead "
        "of a dead-letter topic (off when empty); the operator's own, so the egress policy "
        "does not apply to it",
    ),
    Setting(
        attr="http_targets_allow",
        env="HTTP_TARGETS_ALLOW",
        flag="--http-targets-allow",
        default="",
        parse=_parse_egress,
        help="CIDRs an http target may reach besides public addresses, comma separated "
        "(loopback, private, link-local and the like are refused unless named here; "
        "the dev stack: 127.0.0.0/8)",
    ),
    Setting(
        attr="http_signing_secret",
        env="HTTP_SIGNING_SECRET",
        flag="--http-signing-secret",
        default="",
        parse=_parse_optional_secret,
        help="whsec_ secret that signs the HTTP deliveries of tenants without their own "
        "(python -m node tenants rotate-secret); without either an HTTP delivery fails",
    ),
    Setting(
        attr="http_ca_bundle",
        env="HTTP_CA_BUNDLE",
        flag="--http-ca-bundle",
        default="",
        parse=str,
        help="PEM file of the CAs https targets are verified against (default: the system's)",
    ),
    Setting(
        attr="http_max_per_host",
        env="HTTP_MAX_PER_HOST",
        flag="--http-max-per-host",
        default="16",
        parse=_parse_int(1, 1024),
        help="HTTP deliveries in flight at once to one host, per node",
    ),
    Setting(
        attr="http_breaker_failures",
        env="HTTP_BREAKER_FAILURES",
        flag="--http-breaker-failures",
        default="5",
        parse=_parse_int(1, 1000),
        help="consecutive failures of one host that open its circuit: its deliveries then "
        "wait, spending no attempt, while one probe a cooldown finds out whether it is back",
    ),
    Setting(
        attr="http_breaker_cooldown",
        env="HTTP_BREAKER_COOLDOWN",
        flag="--http-breaker-cooldown",
        default="2",
        parse=_parse_seconds(0.1, 3600),
        help="seconds an open circuit waits before its probe; doubled after each failed "
        "probe, up to HTTP_BREAKER_COOLDOWN_MAX",
    ),
    Setting(
        attr="http_breaker_cooldown_max",
        env="HTTP_BREAKER_COOLDOWN_MAX",
        flag="--http-breaker-cooldown-max",
        default="10",
        parse=_parse_seconds(0.1, 3600),
        help="the longest an open circuit waits between probes: how late deliveries resume "
        "after an endpoint comes back (its schedules wait unclaimed meanwhile, costing "
        "nothing)",
    ),
    Setting(
        attr="http_retry_after_max",
        env="HTTP_RETRY_AFTER_MAX",
        flag="--http-retry-after-max",
        default="300",
        parse=_parse_seconds(1, 86400),
        help="longest Retry-After (of a 429 or 503) a delivery waits; longer ones are cut to this",
    ),
    Setting(
        attr="http_outage_bound",
        env="HTTP_OUTAGE_BOUND",
        flag="--http-outage-bound",
        default="86400",
        parse=_parse_seconds(0, 30 * 86400),
        help="how late an HTTP delivery may get waiting out its destination (Retry-After, an "
        "open circuit) without spending attempts; past it each wait spends one, so an "
        "endpoint down for days ends its schedules (expireAfter ends them sooner)",
    ),
    Setting(
        attr="log_format",
        env="LOG_FORMAT",
        flag="--log-format",
        default="json",
        parse=_parse_choice("json", "console"),
        help="json for production, console for humans",
    ),
    Setting(
        attr="log_level",
        env="LOG_LEVEL",
        flag="--log-level",
        default="info",
        parse=_parse_choice("debug", "info", "warning", "error"),
        help="least severe level logged",
    ),
    Setting(
        attr="access_log",
        env="ACCESS_LOG",
        flag="--access-log",
        default="on",
        parse=_parse_choice("on", "all", "off"),
        help="one log line per API call (method, route, status, duration, bytes, tenant, "
        "request id, remote): `on` for every call but probes, /metrics and the nodes' own "
        "wake-ups; `all` for those too; `off` for none",
    ),
    Setting(
        attr="chaos_mode",
        env="CHAOS_MODE",
        flag="--chaos-mode",
        default="off",
        parse=_parse_choice("off", "on", "unfenced"),
        help="testing only, never in production: `on` adds the `/v1/chaos/` packet filter "
        "(partitions where network namespaces are unavailable); `unfenced` also removes the "
        "lease-token conditions and the local lease checks, to prove the chaos checker "
        "catches double claims",
    ),
    Setting(
        attr="chaos_clock_skew",
        env="CHAOS_CLOCK_SKEW",
        flag="--chaos-clock-skew",
        default="0",
        parse=_parse_seconds(-86400, 86400),
        help="testing only, with CHAOS_MODE: this node's wall clock runs this many seconds off "
        "(the store's clock still decides what is due)",
    ),
)


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    node_id: str
    http_bind: tuple[str, int]
    gossip_bind: tuple[str, int]
    advertise_host: str
    seeds: tuple[str, ...] = ()
    membership_preset: str = "lan"
    cluster_keys: tuple[bytes, ...] = field(default=(), repr=False)  # secret: never logged
    gossip_unsigned: bool = False
    auth: bool = True
    mongo_uri: str
    mongo_database: str
    store_timeout: float = 5.0
    api_pool_size: int = 16
    read_timeout: float = 2.0
    read_budget: float = 0.2
    unhealthy_after: float = 300.0
    kafka_bootstrap: tuple[str, ...]
    kafka_idempotence: str = "auto"
    buckets: int
    lease_ttl: float
    poll_interval: float
    batch_linger: float
    batch_size: int
    max_payload_bytes: int
    horizon: float
    max_attempts: int
    retry_backoff: float
    retry_backoff_max: float
    misfire_threshold: float = 60.0
    fair_tenants: bool = True
    watch_changes: bool = True
    retention: float = 7 * 86400.0
    history_retention: float = 7 * 86400.0
    history_per_schedule: int = 100
    dead_letter_topic: str
    dead_letter_url: str = ""
    http_targets_allow: EgressPolicy = NO_RANGES_ALLOWED
    http_signing_secret: str = field(default="", repr=False)  # secret: never logged
    http_ca_bundle: str = ""
    http_max_per_host: int = 16
    http_breaker_failures: int = 5
    http_breaker_cooldown: float = 2.0
    http_breaker_cooldown_max: float = 10.0
    http_retry_after_max: float = 300.0
    http_outage_bound: float = 86400.0
    log_format: str
    log_level: str
    access_log: str = "on"
    chaos_mode: str = "off"
    chaos_clock_skew: float = 0.0

    @property
    def http_address(self) -> str:
        return f"{self.advertise_host}:{self.http_bind[1]}"

    @property
    def gossip_address(self) -> str:
        return f"{self.advertise_host}:{self.gossip_bind[1]}"

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of a schedule that names none."""
        return RetryPolicy(
            max_attempts=self.max_attempts,
            backoff=timedelta(seconds=self.retry_backoff),
            backoff_max=timedelta(seconds=self.retry_backoff_max),
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare one flag per setting; absent flags fall back to the environment."""
    for setting in SETTINGS:
        parser.add_argument(
            setting.flag,
            dest=setting.attr,
            default=None,
            metavar=setting.env,
            help=_flag_help(setting),
        )


def _flag_help(setting: Setting) -> str:
    """A flag's help: its meaning, its variable and its default (unless the
    meaning names a default of its own, the host name for NODE_ID)."""
    if "(default:" in setting.help:
        return f"{setting.help} [env {setting.env}]"
    return f"{setting.help} [env {setting.env}, default {setting.default or 'none'}]"


def load(
    flags: Mapping[str, str | None] | argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> NodeConfig:
    """Build the config from flags, then environment, then defaults.

    Raises ConfigError naming the first invalid setting.
    """
    env = os.environ if environ is None else environ
    given = vars(flags) if isinstance(flags, argparse.Namespace) else dict(flags)
    values = _parse_settings(given, env)
    values["node_id"] = values["node_id"] or _host_node_id()
    _require_signed_gossip(values)
    values["advertise_host"] = values["advertise_host"] or _advertise_host(values["http_bind"][0])
    _check_together(values)
    known = {f.name for f in fields(NodeConfig)}
    return NodeConfig(**{k: v for k, v in values.items() if k in known})


def _parse_settings(given: Mapping[str, str | None], env: Mapping[str, str]) -> dict[str, Any]:
    """Every setting parsed, keyed by its attribute."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw, source = _raw_value(setting, given, env)
        try:
            values[setting.attr] = setting.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


def _raw_value(
    setting: Setting, given: Mapping[str, str | None], env: Mapping[str, str]
) -> tuple[str, str]:
    """A setting's text, from its flag, else its environment variable, else
    its default; and the name an error about it gives (the flag, if given)."""
    flag = given.get(setting.attr)
    if flag is not None:
        return flag, setting.flag
    raw = env.get(setting.env)
    return (setting.default if raw is None else raw), setting.env


def _host_node_id() -> str:
    """The node id when neither --node-id nor NODE_ID gives one: the host
    name's first label (in Kubernetes the pod's name, which a StatefulSet
    keeps stable across restarts), held to the rule of an explicit id."""
    host = socket.gethostname().split(".")[0]
    if not _NODE_ID.fullmatch(host):
        raise ConfigError(
            f"--node-id: not given (nor NODE_ID), and this host's name {host!r} is not a node "
            "id (1-64 of [A-Za-z0-9._-]): give one with --node-id or NODE_ID"
        )
    return host


def _require_signed_gossip(values: Mapping[str, Any]) -> None:
    if not values["cluster_keys"] and not values["gossip_unsigned"]:
        raise ConfigError(
            "CLUSTER_KEYS: not set, so gossip would be unsigned and anyone reaching the gossip "
            "port could add members or declare nodes dead. Set CLUSTER_KEYS on every node "
            "(head -c 32 /dev/urandom | base64), or GOSSIP_UNSIGNED=on on a trusted network"
        )


def _advertise_host(bind_host: str) -> str:
    """The address to advertise when ADVERTISE_HOST is not set."""
    return socket.gethostname() if bind_host in {"0.0.0.0", "::", ""} else bind_host


def _check_together(values: Mapping[str, Any]) -> None:
    """Settings valid one by one that are not together."""
    if values["retry_backoff_max"] < values["retry_backoff"]:
        raise ConfigError("RETRY_BACKOFF_MAX: must not be below RETRY_BACKOFF")
    if values["http_breaker_cooldown_max"] < values["http_breaker_cooldown"]:
        raise ConfigError("HTTP_BREAKER_COOLDOWN_MAX: must not be below HTTP_BREAKER_COOLDOWN")
    if values["dead_letter_topic"] and values["dead_letter_url"]:
        raise ConfigError("DEAD_LETTER_URL: set it or DEAD_LETTER_TOPIC, not both")
    if values["chaos_clock_skew"] and values["chaos_mode"] == "off":
        raise ConfigError("CHAOS_CLOCK_SKEW: a chaos testing setting; needs CHAOS_MODE on")


def describe(settings: Sequence[Setting] = SETTINGS) -> str:
    """The configuration table as Markdown (kept in docs/configuration.md)."""
    rows = ["| environment | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for s in settings:
        rows.append(f"| `{s.env}` | `{s.flag}` | `{s.default or '-'}` | {s.help} |")
    return "\n".join(rows)
