"""What the test modules share: builders, stand-ins and waits.

No test module imports another (tests/test_layout.py checks it); what
two of them need lives here, or, for fixtures, in tests/conftest.py. The
other helper modules beside this one (stores, virtual, tcp_cut,
kafka_standin, node_process, chaos_histories) are larger stand-ins of one
kind each."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from aiohttp import web

from node.delivery.leases import LeaseManager
from node.delivery.outcomes import Rules
from node.delivery.poller import BucketPoller
from node.delivery.sink import Failed, Trouble
from node.delivery.sinks.kafka import KafkaPublisher
from node.metrics import NodeMetrics
from node.ops.cli import build_parser
from node.ops.ctl import run
from node.process import Node
from node.schedule.model import Limits
from node.schedule.parse import parse_new_schedule
from node.schedule.record import Record
from node.schedule.retry import RetryPolicy
from node.store.schedules import ScheduleStore
from tests.conftest import EmbeddedServers, NodeFactory, NodeHandle, make_config, wait_until

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root, for tests that read its files (docs, deploy, tools)."""


@dataclass(frozen=True)
class Fenced:
    """A fenced block of a Markdown page: its language, its text, and the
    HTML comment on the line above its fence (the block's marker; "" if none)."""

    path: Path
    line: int  # of the opening fence, from 1
    language: str
    text: str
    marker: str


def fenced_blocks(path: Path) -> list[Fenced]:
    """Every fenced block of the page, in order."""
    lines = path.read_text().splitlines()
    found: list[Fenced] = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1].strip() if i else ""
        marker = above if above.startswith("<!--") and above.endswith("-->") else ""
        text = "\n".join(lines[i + 1 : end])
        found.append(Fenced(path, i + 1, opening.group(1), text, marker))
        i = end + 1
    return found


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """``app`` listening on a free port of ``host`` (an HTTP destination, a
    collector) for the block; its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, 0).start()
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


# -- times, statuses, and a broker fault the real broker cannot make -----------


def at(seconds: float) -> str:
    when = datetime.now(UTC) + timedelta(seconds=seconds)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def status_of(handle: NodeHandle, schedule_id: str) -> str:
    _, body = await handle.request("GET", f"/v1/schedules/{schedule_id}")
    return str(body["status"])


async def wait_status(handle: NodeHandle, schedule_id: str, status: str) -> dict[str, Any]:
    async def reached() -> bool:
        return await status_of(handle, schedule_id) == status

    await wait_until(reached, what=f"{schedule_id} to be {status}")
    _, body = await handle.request("GET", f"/v1/schedules/{schedule_id}")
    return dict(body)


class FailingPublisher(KafkaPublisher):
    """A broker fault the real broker cannot be made to produce on demand:
    refuse the first ``failures`` attempts of the chosen schedules on ``topic``."""

    def __init__(self, inner: KafkaPublisher, topic: str, failures: dict[str, int]) -> None:
        self.inner = inner
        self.topic = topic
        self.failures = failures

    @property
    def started(self) -> bool:
        return self.inner.started

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def reachable(self) -> bool:
        return await self.inner.reachable()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # idempotent, refusal: the real producer's

    async def publish(self, records: Sequence[Record]) -> list[Failed | None]:
        results: list[Failed | None] = [None] * len(records)
        passed = []
        for i, record in enumerate(records):
            headers = dict(record.headers)
            schedule_id = headers["schedule-id"].decode()
            attempt = int(headers["attempt"])
            if record.topic == self.topic and attempt <= self.failures.get(schedule_id, 0):
                # The record's own fault (say, too large): it spends an attempt.
                results[i] = Failed(
                    f"MessageSizeTooLargeError: injected failure {attempt}", Trouble.RETRY
                )
            else:
                passed.append(i)
        sent = await self.inner.publish([records[i] for i in passed])
        for i, outcome in zip(passed, sent, strict=True):
            results[i] = outcome
        return results


async def failing_node(
    start_node: NodeFactory,
    servers: EmbeddedServers,
    database: str,
    topic: str,
    failures: dict[str, int],
    **overrides: str,
) -> NodeHandle:
    node = Node(make_config(servers, database, **overrides))
    node.publisher = node.poller.publisher = FailingPublisher(node.publisher, topic, failures)
    return await start_node(node)


# -- the API's time stamps -----------------------------------------------------


def stamp(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- a cluster of in-process nodes ---------------------------------------------


BUCKETS = 32


async def cluster(start_node: NodeFactory, names: list[str], **overrides: str) -> list[NodeHandle]:
    first = await start_node(
        node_id=names[0], membership_preset="fast", buckets=str(BUCKETS), **overrides
    )
    seed = first.node.membership.address  # type: ignore[union-attr]
    rest = [
        await start_node(
            node_id=name, membership_preset="fast", buckets=str(BUCKETS), seeds=seed, **overrides
        )
        for name in names[1:]
    ]
    return [first, *rest]


# -- a poller and a store of overdue schedules, without a node -----------------


def poller(
    store: ScheduleStore,
    leases: LeaseManager,
    publisher: KafkaPublisher,
    name: str,
    batch_size: int = 10,
) -> BucketPoller:
    return BucketPoller(
        store,
        leases,
        publisher,
        NodeMetrics(),
        node_id=name,
        batch_size=batch_size,
        poll_interval=0.2,
        rules=Rules(
            RetryPolicy(
                max_attempts=5, backoff=timedelta(seconds=0.1), backoff_max=timedelta(seconds=1)
            ),
            misfire_threshold=timedelta(seconds=60),
        ),
    )


async def store_overdue(store: ScheduleStore, topic: str, ids: Sequence[str]) -> None:
    """Prepare ``store`` and insert one-shots due long ago, one per id."""
    now = datetime.now(UTC)
    await store.prepare(now)
    limits = Limits(max_payload_bytes=1000, horizon=timedelta(days=1))
    for schedule_id in ids:
        body = (
            f'{{"id":"{schedule_id}","topic":"{topic}","executeAt":"2000-01-01T00:00:00Z",'
            f'"payload":"{schedule_id}"}}'
        ).encode()
        await store.insert(parse_new_schedule(body, limits, now), now)


# -- a node's metrics ----------------------------------------------------------


async def metric(node: NodeHandle, name: str) -> float:
    _, text = await node.request("GET", "/metrics")
    line = next((x for x in text.splitlines() if x.startswith(name + " ")), None)
    return float(line.split()[-1]) if line else 0.0


# -- chaos scenarios and the HTML report ---------------------------------------


def scenario(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"nodes": 3, "duration": 60, "rate": 10, "timeline": []}
    base.update(fields)
    return base


class Svgs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, Counter[str]] = {}
        self._current: str | None = None
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "svg":
            self._current = named["data-plot"] or ""
            self.plots[self._current] = Counter()
        elif self._current is not None:
            self.plots[self._current][named.get("class") or tag] += 1
        self._in_title = tag == "title" and self._current is None

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


# -- a schedule's body ---------------------------------------------------------


FAR = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")


def schedule(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"topic": "api-test", "executeAt": FAR, "payload": {"n": 1}}
    base.update(fields)
    return base


# -- python -m node ctl, in process --------------------------------------------


async def ctl(handle: NodeHandle | str, *argv: str) -> tuple[int, str]:
    code, out, _ = await ctl_with_errors(handle, *argv)
    return code, out


async def ctl_with_errors(handle: NodeHandle | str, *argv: str) -> tuple[int, str, str]:
    url = handle if isinstance(handle, str) else handle.url
    args = build_parser().parse_args(["ctl", "--url", url, *argv])
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(run, args, out, err)
    return code, out.getvalue(), err.getvalue()
