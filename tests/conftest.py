"""Fixtures: the real embedded servers (SecantusDB and Tansu) on free ports,
nodes started in-process against them, and helpers that wait on conditions
with a deadline instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from node import config as node_config
from node.ops import embedded
from node.ops.tail import topic_consumer
from node.process import Node
from tests.stores import MemoryKit, MongoKit, StoreKit, VirtualClock

# The fixtures of the tests in virtual time.
pytest_plugins = ["tests.virtual"]

HOST = "127.0.0.1"
_names = itertools.count()
# Nodes refuse to gossip unsigned unless told: the tests' nodes sign with
# this key (base64 of 32 bytes), all of them, so that they form clusters.
TEST_CLUSTER_KEY = "dGVzdC1jbHVzdGVyLWtleS1mb3ItdGVzdHMtb25seSE="


@dataclass
class EmbeddedServers:
    mongo_host: str
    mongo_port: int
    kafka_bootstrap: str
    data_dir: Path
    mongo: Any
    kafka: Any

    @property
    def mongo_uri(self) -> str:
        return embedded.mongo_uri(self.mongo_host, self.mongo_port)


# SecantusDB's TTL sweeper walks every document of every collection that has
# a TTL index, in every database, under its global lock (mongod walks the
# index instead). Tests leave hundreds of databases behind, so late in a run
# each sweep stalled the server for tens of seconds and tests timed out on a
# store that was merely busy. The tests that check expiry run the sweep
# themselves (secantusAdmin.pruneTtl).
_NO_TTL_SWEEP = "[storage]\nttl_sweep_seconds = 0\n"


# -- the servers marker ----------------------------------------------------------

# A test needs the embedded servers when its fixtures reach ``servers`` (the
# session's SecantusDB and Tansu: ``start_node``, ``mongo`` and
# ``database_name`` do), when it runs over the SecantusDB side of ``store``,
# or when it is in tests/system/ (whole nodes against real servers). Modules
# that start processes of their own say so with ``pytestmark``.
SERVERS = "servers"
SYSTEM = Path(__file__).resolve().parent / "system"


def needs_servers(item: pytest.Item) -> bool:
    if SERVERS in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("store") == "secantus":
        return True
    return SYSTEM in Path(str(item.path)).resolve().parents


@pytest.hookimpl(tryfirst=True)  # before -m deselects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_servers(item):
            item.add_marker(SERVERS)
        if item.get_closest_marker("slow") is not None:
            # Whole process trees, one after another on one worker (with
            # pytest-xdist): two chaos runs at once on two cores would be
            # each other's fault.
            item.add_marker(pytest.mark.xdist_group("process-trees"))


_running: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def _spawn_guarded(argv: list[str], *args: Any, **kwargs: Any) -> Any:
    """``embedded.spawn``, refusing a test not marked ``servers``: so a
    ``-m "not servers"`` run starts no server, and a test that starts one
    without the marker fails, naming itself."""
    if _running and _running[-1].get_closest_marker(SERVERS) is None:
        raise AssertionError(
            f"{_running[-1].nodeid} starts {Path(argv[0]).name} but is not marked servers"
        )
    return _spawn(argv, *args, **kwargs)


_spawn = embedded.spawn
embedded.spawn = _spawn_guarded  # type: ignore[assignment]


def start_mongo(data_dir: Path, port: int | None = None) -> tuple[Any, int]:
    port = port or embedded.free_port(HOST)
    config = data_dir.with_name(data_dir.name + ".toml")
    config.write_text(_NO_TTL_SWEEP)
    process = embedded.spawn(embedded.mongo_argv(HOST, port, data_dir, config))
    embedded.wait_for_port(HOST, port, 60, process)
    return process, port


def start_kafka() -> tuple[Any, str]:
    port = embedded.free_port(HOST)
    process = embedded.spawn(embedded.kafka_argv(HOST, port))
    embedded.wait_for_port(HOST, port, 60, process)
    return process, f"{HOST}:{port}"


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServers]:
    data_dir = tmp_path_factory.mktemp("mongo")
    mongo, mongo_port = start_mongo(data_dir)
    kafka, bootstrap = start_kafka()
    try:
        yield EmbeddedServers(HOST, mongo_port, bootstrap, data_dir, mongo, kafka)
    finally:
        embedded.discard(kafka)
        embedded.discard(mongo)


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}x{int(time.time() * 1000) % 10**8}"


@pytest.fixture
def database_name(request: pytest.FixtureRequest) -> Iterator[str]:
    name = unique("t")
    yield name
    # Drop what the test wrote, so the shared server stays small: its scans
    # (the explicit TTL sweeps among them) walk every database it holds.
    if "servers" in request.fixturenames:
        servers: EmbeddedServers = request.getfixturevalue("servers")
        client: MongoClient[dict[str, Any]] = MongoClient(
            servers.mongo_uri, serverSelectionTimeoutMS=2000, timeoutMS=10000
        )
        with client, contextlib.suppress(PyMongoError):
            client.drop_database(name)


def make_config(
    servers: EmbeddedServers, database: str, **overrides: str
) -> node_config.NodeConfig:
    flags: dict[str, str | None] = {
        "node_id": "node-a",
        "http_bind": f"{HOST}:0",
        "gossip_bind": f"{HOST}:0",
        "advertise_host": HOST,
        "mongo_uri": servers.mongo_uri,
        "mongo_database": database,
        "kafka_bootstrap": servers.kafka_bootstrap,
        "buckets": "16",
        "log_format": "console",
        "log_level": "warning",
        "auth": "off",
        "cluster_keys": TEST_CLUSTER_KEY,
        # Tests poll and list as fast as they like, as one tenant: the read
        # budget is tests/node/tenants/test_reads.py's to exercise, at its own settings.
        "read_budget": "100",
    }
    flags.update(overrides)
    return node_config.load(flags, environ={})


class NodeHandle:
    """A node running in the test's event loop, and an HTTP client for it."""

    def __init__(self, node: Node, session: aiohttp.ClientSession) -> None:
        self.node = node
        self.session = session

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.node.http_port}"

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.session.request(method, self.url + path, **kwargs) as response:
            text = await response.text()
            try:
                import json

                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


NodeFactory = Callable[..., Awaitable[NodeHandle]]


@pytest.fixture
async def start_node(servers: EmbeddedServers, database_name: str) -> AsyncIterator[NodeFactory]:
    handles: list[NodeHandle] = []
    session = aiohttp.ClientSession()

    async def factory(node: Node | None = None, **overrides: str) -> NodeHandle:
        if node is None:
            node = Node(make_config(servers, database_name, **overrides))
        assert await node.start()
        handle = NodeHandle(node, session)
        handles.append(handle)
        return handle

    try:
        yield factory
    finally:
        for handle in handles:
            await handle.node.stop()
        await session.close()


@pytest.fixture
async def mongo(servers: EmbeddedServers, database_name: str) -> AsyncIterator[Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(servers.mongo_uri, tz_aware=True)
    try:
        yield client[database_name]
    finally:
        await client.close()


@pytest.fixture(params=["memory", "secantus"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StoreKit]:
    """The store under test: the memory twin, then MongoDB (the embedded
    SecantusDB), so every store test holds for both (``tests/stores.py``).
    The embedded server starts only when a test runs over it."""
    if request.param == "memory":
        yield MemoryKit(VirtualClock(datetime.now(UTC).replace(microsecond=0)))
        return
    servers: EmbeddedServers = request.getfixturevalue("servers")
    name = unique("k")
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(servers.mongo_uri, tz_aware=True)
    try:
        yield MongoKit(client[name])
    finally:
        with contextlib.suppress(PyMongoError):
            await client.drop_database(name)
        await client.close()


async def wait_until(
    condition: Callable[[], Awaitable[bool]], within: float = 30.0, what: str = "condition"
) -> None:
    """Poll ``condition`` until true; fail with ``what`` after ``within`` seconds.

    The timeout is a hang guard, not a performance assertion: it is far above
    what any healthy run needs.
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {within:g} s waiting for {what}")


class TopicReader:
    """Collects every record of a topic from the beginning."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = topic_consumer(bootstrap, topic)
        self.records: list[Any] = []

    async def __aenter__(self) -> TopicReader:
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def poll(self) -> list[Any]:
        batch = await self.consumer.getmany(timeout_ms=100)
        for records in batch.values():
            self.records.extend(records)
        return self.records

    async def wait_for(self, count: int, within: float = 30.0) -> list[Any]:
        async def enough() -> bool:
            return len(await self.poll()) >= count

        await wait_until(enough, within, f"{count} records")
        return self.records

    def by_id(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for record in self.records:
            out.setdefault(dict(record.headers)["schedule-id"].decode(), []).append(record)
        return out


def metric_samples(metrics: Any, name: str) -> dict[tuple[str, ...], float]:
    """label values -> value, of every sample named ``name`` a node's metrics hold."""
    found: dict[tuple[str, ...], float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sample.labels.values())] = sample.value
    return found


def metrics_read(expr: str) -> set[str]:
    """The scheduler's metrics a PromQL expression reads (as written: a
    counter with _total, a histogram's _bucket), not recording rules."""
    return set(re.findall(r"(?<![\w:])scheduler_[a-z_]+(?![\w:])", expr))


def recordings_read(expr: str) -> set[str]:
    """The recording rules (level:metric:operations) a PromQL expression reads."""
    return set(re.findall(r"(?<![\w:])[a-z_][a-z0-9_]*:[a-z0-9_:]+", expr))


def undeclared(names: Iterable[str], exposition: str) -> set[str]:
    """Of metrics as a query names them, those of no family a node's
    /metrics text declares (a labelled family has no sample before its first
    event, but is declared from the start)."""
    declared = set(re.findall(r"^# TYPE (scheduler_[a-z_]+) ", exposition, re.M))
    return {
        name
        for name in names
        if name not in declared and re.sub(r"_(bucket|total|count|sum)$", "", name) not in declared
    }
