"""The load of a chaos run: the API's clients, each writing what it asked
and what it was told into the run's history (``chaos/history.py``).

It posts ``rate`` schedules per second through the serving nodes, due 0-4 s
ahead (one in twenty already due), each labelled with one of GROUPS groups;
one in fifty is cancelled a moment later. The verbs are in every
scenario's load (the load's, not a scenario's field: every fault should
meet them, and at these shares the load stays what it was):

* RESCHEDULE_SHARE of the schedules get a PATCH of their executeAt (later
  or earlier, at least half a second ahead) up to a second after their
  create, some of them twice; half of them with ``If-Match`` (the version
  the last answer gave). A 200 moves the time they are owed at; a 409 (in
  flight already, or final) or a 412 leaves the time they had;
* PAUSE_SHARE are paused up to a second after their create, and half of
  those resumed 0.5-3 s later: a paused one must not go out until resumed,
  a resumed one is owed again, one never resumed is owed nothing;
* BULK_CANCELS times a run, ``POST /v1/schedules:cancel`` takes the
  PENDING and PAUSED schedules of one group (a different one each time)
  due within BULK_AHEAD seconds, and BULK_PAUSES times ``POST
  /v1/schedules:pause`` the PENDING ones of another group, never resumed:
  each is called again while it answers ``more``, and once it answers
  ``more: false`` nothing it took may go out;
* CHAINS recurring schedules, one occurrence every CHAIN_EVERY seconds
  over the whole load, each occurrence owed once.

With a receiver (``Webhook``), a share of the schedules (drawn by the
run's seed, in the order they are made) and as many of the chains go to
an ``http`` target, the receiver's URL, instead of the topic; every verb
works on them alike, and SWITCH_SHARE of the PATCHes (of a run with a
receiver) also switch the destination, topic to http or back. Each create
notes its ``sink`` in the history, and each switching PATCH the one it
switches to (with the executeAt it moves the schedule to as well, so that
``chaos/settle.py`` can tell by the time whether an unanswered one took).

Every call goes through the project's own client (``clients/python``,
``AsyncClient``), one per node and with its retries off: each try goes to a
serving node picked for it (``Api``), and the load makes and waits its own
tries. An answer is an ``ok`` (2xx), a ``fail`` (any other 4xx) or an
``info`` (no answer, or a 5xx: the store may have applied the write before
it failed; ``chaos/settle.py`` asks after the run). A create is tried up to
six times, as a client would, waiting as long as a 503's or a 429's
``Retry-After`` asks (at most RETRY_AFTER_CAP); one still refused then is a
``fail`` (a record of it anyway is an unknown delivery, not a breach).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from bucket_scheduler_client import NO_RETRY, ApiError, AsyncClient, ClientError

from chaos import history as ops
from chaos.history import HTTP, KAFKA, History, Op
from chaos.lab.harness import iso

CANCEL_SHARE = 0.02
RESCHEDULE_SHARE = 0.04
RESCHEDULE_AGAIN = 0.25  # of the rescheduled, moved once more
PAUSE_SHARE = 0.03
RESUME_SHARE = 0.5  # of the paused, resumed
VERB_DELAY = 1.0  # a verb follows its schedule's create by up to this (seconds)
GROUPS = 8  # each schedule's label {"group": "g<k>"}
BULK_CANCELS = 3  # bulk cancels a run, each of its own group
BULK_PAUSES = 2  # bulk pauses a run, each of a group of its own
BULK_AHEAD = 3.0  # seconds: a bulk verb's dueBefore, from when it is sent
# Recurring schedules running through every fault: each occurrence must be
# delivered once (fire_all with a cap no outage here reaches, so even an
# occurrence missed by more than the misfire threshold is owed).
CHAINS = 8
CHAIN_EVERY = 2.0  # seconds
CREATE_TRIES = 6
CHAIN_TRIES = 50
# The longest wait between two tries of a POST that a 503 asked for.
RETRY_AFTER_CAP = 2.0
# Calls in flight at once (a client's connection pool).
IN_FLIGHT = 64
# Of the PATCHes of a run with a receiver, the share that also switch the
# schedule's destination (topic to http, http to topic).
SWITCH_SHARE = 0.5
# The methods the http targets use, one after another by schedule number.
METHODS = ("POST", "PUT", "PATCH")
# An http target's timeout: a receiver answering slower (``slow``) times out.
HTTP_TIMEOUT = "PT10S"
# Of the one-shot schedules to the receiver, the share under one flow key
# (the checker: never more in a second than its limit allows); about one a
# second at the default rate, so the limit holds back a burst, and the
# backlog a fault leaves, not the steady load.
FLOW_SHARE = 0.1
FLOW_LIMIT = {"key": "chaos-limited", "rate": 4, "parallelism": 2}
# Of the one-shot schedules, the share with a priority of their own (0-9).
PRIORITY_SHARE = 0.2


@dataclass(frozen=True)
class Webhook:
    """Where the load's http targets point, and how many of them."""

    url: str  # the receiver's base URL, as the nodes reach it
    share: float  # of the one-shot schedules (and of the chains)
    rng: random.Random  # draws which schedules, in order: the same for the same seed

    def target(self, schedule_id: str, n: int) -> dict[str, Any]:
        """The ``http`` member of schedule ``schedule_id`` (the ``n``th of its kind)."""
        return {
            "url": f"{self.url}/hooks/{schedule_id}",
            "method": METHODS[n % len(METHODS)],
            "headers": {"x-chaos-schedule": schedule_id},
            "timeout": HTTP_TIMEOUT,
        }


@dataclass(frozen=True)
class Answer:
    """What one call got: the client's result, its refusal, or no answer."""

    status: int | None  # None: no answer
    data: Any = None  # the body as JSON (a result's or a refusal's); None if none
    text: str = ""  # no answer: what went wrong
    retry_after: float | None = None  # seconds a refusal asked to wait

    @classmethod
    def of(cls, result: Any) -> Answer:
        """A 2xx: the body the client's model was read from. The API answers
        every verb's success with a 200 (a create's 201 and 200 both take)."""
        return cls(200, getattr(result, "raw", None))

    @classmethod
    def refused(cls, error: ApiError) -> Answer:
        return cls(error.status, error.body, retry_after=error.retry_after)

    @classmethod
    def unanswered(cls, error: BaseException) -> Answer:
        return cls(None, text=f"{type(error).__name__} {error}"[:200])

    @property
    def type(self) -> str:
        """The op's completion: what the answer says of the call's outcome."""
        if self.status is not None and 200 <= self.status < 300:
            return ops.OK
        return ops.INFO if self.status is None or self.status >= 500 else ops.FAIL

    @property
    def code(self) -> str | None:
        error = self.data.get("error") if isinstance(self.data, dict) else None
        return error.get("code") if isinstance(error, dict) else None

    @property
    def version(self) -> int | None:
        """The ``version`` of a schedule's view, when the answer is one."""
        version = self.data.get("version") if isinstance(self.data, dict) else None
        return version if isinstance(version, int) else None

    def why(self) -> str:
        """What a refusal said, for the run's count of refusals."""
        if self.status is None:
            return self.text
        error = self.data.get("error") if isinstance(self.data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return f"HTTP {self.status} {self.code or ''}: {message or ''}"[:200]

    def fields(self) -> dict[str, Any]:
        """What the history keeps of it: the status, the error's code, and
        the figures a verb's answer carries."""
        data = self.data if isinstance(self.data, dict) else {}
        kept = {"status": self.status, "code": self.code}
        for key in ("version", "cancelled", "changed", "more"):
            if key in data:
                kept[key] = data[key]
        return kept


# One call of the client, given the client of the node picked for it.
Call = Callable[[AsyncClient], Awaitable[Any]]


class Api:
    """One call path to the cluster: a serving node picked at random for
    each call (``serving`` gives their base URLs, as a load balancer would
    know them), through a client of that node that never retries itself."""

    def __init__(
        self,
        serving: Callable[[], Sequence[str]],
        rng: random.Random,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.serving = serving
        self.rng = rng
        self.headers = dict(headers or {})
        self.timeout = timeout
        self._clients: dict[str, AsyncClient] = {}

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.close() for client in clients))

    def client(self, node: str) -> AsyncClient:
        """The node's client, made on first use."""
        if node not in self._clients:
            self._clients[node] = AsyncClient(
                node, headers=self.headers, timeout=self.timeout, retry=NO_RETRY
            )
        return self._clients[node]

    def pick(self) -> str | None:
        """A serving node's base URL; None: none serves."""
        urls = self.serving()
        return self.rng.choice(list(urls)) if urls else None

    async def send(self, node: str, call: Call) -> Answer:
        try:
            return Answer.of(await call(self.client(node)))
        except ApiError as refusal:
            return Answer.refused(refusal)
        except ClientError as error:  # no answer: the node is down, cut off or too slow
            return Answer.unanswered(error)

    async def call(self, call: Call) -> Answer | None:
        """The answer of a node picked now, or None: no node to ask, nothing sent."""
        node = self.pick()
        return None if node is None else await self.send(node, call)


@dataclass
class Load:
    """The clients of one run; each schedule's calls are one process of the
    history (its id), made one after another."""

    history: History
    api: Api
    rng: random.Random
    topic: str
    rate: float
    duration: float
    # The recurring schedules the topic's reader names occurrence by
    # occurrence: known before their first occurrence can arrive.
    recurring: set[str] = field(default_factory=set)
    webhook: Webhook | None = None  # None: every schedule goes to the topic

    async def run(self) -> None:
        """The whole load, from ``history.started``."""
        started = self.history.started
        limit = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int, http: bool) -> None:
            async with limit:
                await self._schedule(i, http)

        share = self.webhook.share if self.webhook else 0.0
        http_chains = round(CHAINS * share)
        tasks = [asyncio.create_task(self._chain(n, n < http_chains)) for n in range(CHAINS)]
        tasks.append(asyncio.create_task(self._bulk_verbs()))
        for i in range(int(self.rate * self.duration)):
            delay = started + i / self.rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            http = self.webhook is not None and self.webhook.rng.random() < share
            tasks.append(asyncio.create_task(one(i, http)))
        await asyncio.gather(*tasks)

    async def _called(
        self,
        process: str,
        f: str,
        call: Call,
        **value: Any,
    ) -> tuple[Op, Answer] | None:
        """One call as an invoke and its completion (None: no node to ask,
        nothing sent, nothing written)."""
        node = self.api.pick()
        if node is None:
            return None
        schedule = value.pop("schedule", process)
        invoked = self.history.invoke(process, f, time.time(), schedule, **value)
        answer = await self.api.send(node, call)
        done = self.history.complete(invoked, answer.type, time.time(), **answer.fields())
        return done, answer

    # -- one-shot schedules ------------------------------------------------------

    def _destination(self, schedule_id: str, n: int, http: bool) -> dict[str, Any]:
        """The body's destination member: the receiver's, or the topic."""
        if http and self.webhook is not None:
            return {"http": self.webhook.target(schedule_id, n)}
        return {"topic": self.topic}

    async def _schedule(self, i: int, http: bool = False) -> None:
        """Create schedule ``s<i>`` (to the receiver when ``http``); then,
        drawn by their shares, cancel, reschedule or pause it."""
        lead = 0.0 if self.rng.random() < 0.05 else self.rng.uniform(1.0, 4.0)
        execute_at = _to_ms(datetime.now(UTC) + timedelta(seconds=lead))
        schedule_id = f"s{i}"
        group = f"g{self.rng.randrange(GROUPS)}"
        fields: dict[str, Any] = {
            "id": schedule_id,
            **self._destination(schedule_id, i, http),
            "execute_at": iso(execute_at),
            "payload": i,
            "labels": {"group": group},
        }
        limited = http and self.webhook is not None and self.rng.random() < FLOW_SHARE
        noted: dict[str, Any] = {}
        if limited:
            fields["flow_control"] = FLOW_LIMIT
            noted = {"flowRate": FLOW_LIMIT["rate"], "flowPeriod": 1.0}
        if self.rng.random() < PRIORITY_SHARE:
            fields["priority"] = self.rng.randrange(10)
        invoked = self.history.invoke(
            schedule_id, ops.CREATE, time.time(), schedule_id,
            executeAt=execute_at.timestamp(), group=group, sink=HTTP if http else KAFKA, **noted,
        )  # fmt: skip
        answer = await self._create(fields)
        if answer is None or answer.type != ops.OK:
            why = answer.why() if answer is not None else ""
            self.history.complete(invoked, ops.FAIL, time.time(), error=why)
            return
        self.history.complete(invoked, ops.OK, time.time(), version=answer.version)
        draw = self.rng.random()
        if draw < CANCEL_SHARE:
            if lead > 0.5:
                await self._cancel(schedule_id)
        elif draw < CANCEL_SHARE + RESCHEDULE_SHARE:
            await self._reschedule(schedule_id, answer.version, i, http)
        elif draw < CANCEL_SHARE + RESCHEDULE_SHARE + PAUSE_SHARE:
            await self._pause(schedule_id)

    async def _create(self, fields: dict[str, Any]) -> Answer | None:
        """Create it until a node takes it, CREATE_TRIES at most; the last answer."""
        last = None
        for _ in range(CREATE_TRIES):
            answer = await self.api.call(lambda c: c.create(**fields))
            if answer is None:
                await asyncio.sleep(0.2)
                continue
            if answer.type == ops.OK:
                return answer
            last = answer
            # A client keeps the API's contract: a 503 says when to come back
            # (a store restarting takes seconds, and six tries 0.1 s apart
            # gave up inside one).
            await asyncio.sleep(retry_after(answer.retry_after, 0.1))
        return last

    async def _cancel(self, schedule_id: str) -> None:
        await self._called(schedule_id, ops.CANCEL, lambda c: c.cancel(schedule_id))

    async def _reschedule(
        self, schedule_id: str, version: int | None, i: int = 0, http: bool = False
    ) -> None:
        """PATCH a new executeAt, half a second to five ahead (later or
        earlier than the one it had), once or twice; with a receiver, half
        of the PATCHes also switch the destination."""
        while True:
            await asyncio.sleep(self.rng.uniform(0.0, VERB_DELAY))
            new = _to_ms(datetime.now(UTC) + timedelta(seconds=self.rng.uniform(0.5, 5.0)))
            # Half with the version the last answer gave: a 412 if it moved since.
            match = version is not None and self.rng.random() < 0.5
            fields: dict[str, Any] = {"execute_at": iso(new)}
            switch: dict[str, Any] = {}
            if self.webhook is not None and self.rng.random() < SWITCH_SHARE:
                http = not http
                fields.update(self._destination(schedule_id, i, http))
                switch["sink"] = HTTP if http else KAFKA
            patch = patching(schedule_id, fields, version if match else None)
            called = await self._called(
                schedule_id, ops.PATCH, patch, executeAt=new.timestamp(), **switch
            )
            if called is None or called[1].type != ops.OK:
                return  # unknown (settled after the run), or refused: as it was
            version = called[1].version
            if self.rng.random() >= RESCHEDULE_AGAIN:
                return

    async def _pause(self, schedule_id: str) -> None:
        """Pause it; resume half of those paused 0.5-3 s later."""
        await asyncio.sleep(self.rng.uniform(0.0, VERB_DELAY))
        called = await self._called(schedule_id, ops.PAUSE, lambda c: c.pause(schedule_id))
        if called is None or called[1].type != ops.OK:
            return  # paused or not, asked after the run; or in flight already, or final
        if self.rng.random() >= RESUME_SHARE:
            return
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        await self._called(schedule_id, ops.RESUME, lambda c: c.resume(schedule_id))

    # -- recurring schedules -----------------------------------------------------

    async def _chain(self, n: int, http: bool = False) -> None:
        """A recurring schedule every CHAIN_EVERY s over the load (to the
        receiver when ``http``)."""
        started = self.history.started
        start = datetime.fromtimestamp(started, UTC).replace(microsecond=0)
        start += timedelta(seconds=2 + n * CHAIN_EVERY / CHAINS)
        end = _to_ms(datetime.fromtimestamp(started + self.duration, UTC))
        schedule_id = f"chain{n}"
        recurrence = {
            "every": f"PT{CHAIN_EVERY:g}S",
            "start": iso(start),
            "end": iso(end),
            "misfire": "fire_all",
            "maxCatchUp": 1000,
        }
        fields = {
            "id": schedule_id,
            **self._destination(schedule_id, n, http),
            "payload": n,
            "recurrence": recurrence,
        }
        self.recurring.add(schedule_id)
        invoked = self.history.invoke(
            schedule_id, ops.CREATE, time.time(), schedule_id,
            recurrence={"start": iso(start), "end": iso(end), "every": CHAIN_EVERY},
            sink=HTTP if http else KAFKA,
        )  # fmt: skip
        for _ in range(CHAIN_TRIES):
            answer = await self.api.call(lambda c: c.create(**fields))
            if answer is not None and answer.type == ops.OK:
                self.history.complete(invoked, ops.OK, time.time())
                return
            await asyncio.sleep(0.2)
        self.history.complete(
            invoked, ops.FAIL, time.time(), error="recurring schedule not accepted"
        )
        self.recurring.discard(schedule_id)

    # -- bulk verbs ---------------------------------------------------------------

    async def _bulk_verbs(self) -> None:
        """BULK_CANCELS bulk cancels and BULK_PAUSES bulk pauses spread over
        the load, each of a group of its own (so a schedule one took was
        taken by that call)."""
        verbs = [ops.BULK_CANCEL] * BULK_CANCELS + [ops.BULK_PAUSE] * BULK_PAUSES
        groups = self.rng.sample(range(GROUPS), len(verbs))
        times = sorted(self.rng.uniform(0.15, 0.85) * self.duration for _ in groups)
        for verb, group, at in zip(verbs, groups, times, strict=True):
            delay = self.history.started + at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._bulk(verb, f"g{group}")

    async def _bulk(self, verb: str, group: str) -> None:
        """Cancel or pause the group's schedules due within BULK_AHEAD s; safe
        to repeat, so tried again on no answer or a 5xx, and while ``more``
        (a moment later when nothing changed: what is left is in flight)."""
        due_before = datetime.now(UTC) + timedelta(seconds=BULK_AHEAD)
        name = "cancel" if verb == ops.BULK_CANCEL else "pause"

        def bulk(c: AsyncClient) -> Awaitable[Any]:
            return c.bulk(name, labels={"group": group}, due_before=iso(due_before))

        for _ in range(CREATE_TRIES):
            called = await self._called("bulk", verb, bulk, schedule=None, group=group)
            if called is None:
                await asyncio.sleep(0.2)
                continue
            answer = called[1]
            if answer.type == ops.OK and isinstance(answer.data, dict):
                if not answer.data.get("more"):
                    return
                if not answer.data.get("changed"):
                    await asyncio.sleep(0.2)  # what is left is in flight: a moment later
            elif answer.status is not None and answer.status < 500 and answer.status != 429:
                return  # refused (or an answer it cannot read): asking again changes nothing
            else:
                await asyncio.sleep(0.5)


def patching(schedule_id: str, fields: dict[str, Any], version: int | None) -> Call:
    """A PATCH of ``fields``, with If-Match of ``version`` unless None."""
    return lambda c: c.patch(schedule_id, if_match=version, **fields)


def _to_ms(when: datetime) -> datetime:
    """``when`` cut to whole milliseconds, as the API stores times."""
    return when.replace(microsecond=when.microsecond // 1000 * 1000)


def retry_after(asked: float | None, default: float) -> float:
    """Seconds to wait for a refusal's Retry-After (at most RETRY_AFTER_CAP)."""
    return default if asked is None else min(RETRY_AFTER_CAP, max(default, asked))
