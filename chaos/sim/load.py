"""The simulation's load: the chaos load's creates and verbs, made through
a serving node's own store calls with the API's own decisions (what its
API would make of the same requests: ``parse_new_schedule``, the verbs of
``node/schedule/changes.py``), each written into the run's history as the
real load writes it (``chaos/load.py``), so the same checker reads both.

A create (to the topic, or for HTTP_SHARE to the receiver) goes to a
node picked at random among those running, up to
CREATE_TRIES times while the store does not answer (the same id: a retry
of an insert that applied is the same schedule). Then, drawn by their
shares, through another pick: a cancel before it is due, a cancel after
(mostly refused: it went out), a PATCH of its executeAt (half with the
version the create answered; once more for some), a pause (resumed a
moment later for half).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chaos import history as ops
from chaos.history import HTTP, KAFKA, History
from chaos.lab.harness import iso
from chaos.sim import receiver
from chaos.sim.cluster import Cluster, SimNode
from node.errors import SchedulerError, StoreUnavailable
from node.schedule import changes
from node.schedule.changes import Change
from node.schedule.model import Limits
from node.schedule.parse import parse_new_schedule, parse_patch

LIMITS = Limits(max_payload_bytes=64 * 1024, horizon=timedelta(days=30))
# Of the schedules created: the shares each verb follows (the rest: none).
CANCEL_SHARE = 0.04
LATE_CANCEL_SHARE = 0.02
RESCHEDULE_SHARE = 0.10
RESCHEDULE_AGAIN = 0.25  # of the rescheduled, moved once more
PAUSE_SHARE = 0.04
RESUME_SHARE = 0.5  # of the paused, resumed 0.5-3 s later
VERB_DELAY = 1.0  # a verb follows its create by up to this (seconds)
CREATE_TRIES = 6
GROUPS = 8
CHAINS = 4  # recurring schedules, each every CHAIN_EVERY seconds over the load
CHAIN_EVERY = 5.0
TOPIC = "sim"
HTTP_SHARE = 0.3  # of the one-shot schedules, those to the receiver
HTTP_TIMEOUT = "PT5S"  # each call's
# A webhook's own retry policy, as a service calling an endpoint of its
# own would set one (docs/api.md): the node's default (5 attempts, backoff
# from 1 s) lasts about 15 s of failures, and a lone schedule, whose calls
# alone cannot open its node's circuit to the host before they run out
# (five failures), ends DELIVERY_FAILED in two hangs of the receiver 7 s
# apart (found by the simulation, seeds 26 and 163: docs/chaos.md).
HTTP_RETRY = {"maxAttempts": 10, "initialBackoff": "PT1S", "maxBackoff": "PT30S"}
Decide = Callable[[dict[str, Any], datetime], Change | None]


@dataclass
class Load:
    cluster: Cluster
    history: History
    rng: random.Random
    rate: float  # creates a second
    duration: float  # seconds of virtual time
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def now(self) -> datetime:
        return self.cluster.clock.wall()

    def at(self) -> float:
        return self.now().timestamp()

    async def run(self) -> None:
        """The load for its whole duration (the chains run to its end)."""
        ends = self.cluster.clock.loop_time() + self.duration
        self.tasks = [asyncio.create_task(self._chain(n)) for n in range(CHAINS)]
        count = int(self.rate * self.duration)
        for i in range(count):
            await asyncio.sleep(self.rng.expovariate(self.rate))
            self.tasks.append(asyncio.create_task(self._schedule(i)))
        await asyncio.gather(*self.tasks)
        await asyncio.sleep(max(0.0, ends - self.cluster.clock.loop_time()))

    async def _chain(self, n: int) -> None:
        """A recurring schedule every CHAIN_EVERY s over the load, missed
        occurrences fired all (``chaos/load.py``'s chains)."""
        start = self.now().replace(microsecond=0) + timedelta(seconds=2 + n * CHAIN_EVERY / CHAINS)
        end = self.now() + timedelta(seconds=self.duration)
        end = end.replace(microsecond=end.microsecond // 1000 * 1000)
        schedule_id = f"chain{n}"
        recurrence = {"every": f"PT{CHAIN_EVERY:g}S", "start": iso(start), "end": iso(end),
                      "misfire": "fire_all", "maxCatchUp": 1000}  # fmt: skip
        body = {"id": schedule_id, "topic": TOPIC, "payload": n, "recurrence": recurrence}
        self.cluster.broker.recurring.add(schedule_id)
        invoked = self.history.invoke(
            schedule_id, ops.CREATE, self.at(), schedule_id, sink=KAFKA,
            recurrence={"start": iso(start), "end": iso(end), "every": CHAIN_EVERY},
        )  # fmt: skip
        stored = await self._create(json.dumps(body).encode())
        if isinstance(stored, str):
            self.history.complete(invoked, ops.FAIL, self.at(), error=stored)
            self.cluster.broker.recurring.discard(schedule_id)
        else:
            self.history.complete(invoked, ops.OK, self.at())

    async def _schedule(self, i: int) -> None:
        lead = 0.0 if self.rng.random() < 0.05 else round(self.rng.uniform(1.0, 4.0), 3)
        execute_at = self.now() + timedelta(seconds=lead)  # at the millisecond, as stored
        schedule_id, group = f"s{i}", f"g{self.rng.randrange(GROUPS)}"
        http = self.rng.random() < HTTP_SHARE
        call = {"url": receiver.URL, "timeout": HTTP_TIMEOUT}
        target: dict[str, Any] = {"http": call, "retry": HTTP_RETRY} if http else {"topic": TOPIC}
        body = {"id": schedule_id, **target, "executeAt": iso(execute_at), "payload": i,
                "labels": {"group": group}}  # fmt: skip
        invoked = self.history.invoke(
            schedule_id, ops.CREATE, self.at(), schedule_id,
            executeAt=execute_at.timestamp(), group=group, sink=HTTP if http else KAFKA,
        )  # fmt: skip
        stored = await self._create(json.dumps(body).encode())
        if isinstance(stored, str):
            self.history.complete(invoked, ops.FAIL, self.at(), error=stored)
            return
        self.history.complete(invoked, ops.OK, self.at(), version=stored.get("version"))
        stored_id, version = str(stored["_id"]), stored.get("version")
        draw = self.rng.random()
        if draw < CANCEL_SHARE:
            if lead > 0.5:
                await asyncio.sleep(self.rng.uniform(0.0, lead / 2))
                await self._cancel(schedule_id, stored_id)
        elif (draw := draw - CANCEL_SHARE) < LATE_CANCEL_SHARE:
            await asyncio.sleep(lead + self.rng.uniform(0.0, 2.0))
            await self._cancel(schedule_id, stored_id)
        elif (draw := draw - LATE_CANCEL_SHARE) < RESCHEDULE_SHARE:
            await self._reschedule(schedule_id, stored_id, version)
        elif draw - RESCHEDULE_SHARE < PAUSE_SHARE:
            await self._pause(schedule_id, stored_id)

    async def _create(self, body: bytes) -> dict[str, Any] | str:
        """The stored schedule, or why every try failed."""
        why = "no node to ask"
        for _ in range(CREATE_TRIES):
            node = self.cluster.serving(self.rng)
            if node is None:
                await asyncio.sleep(0.5)
                continue
            try:
                doc, _created = await node.store.insert(
                    parse_new_schedule(body, LIMITS, self.now()), self.now()
                )
                return dict(doc)
            except StoreUnavailable as exc:
                why = f"503 {exc}"
                await asyncio.sleep(0.5)
            except SchedulerError as exc:
                return f"{exc.status_hint} {exc}"
        return why

    async def _cancel(self, schedule_id: str, stored_id: str) -> None:
        async def cancel(node: SimNode, now: datetime) -> dict[str, Any] | None:
            return await node.store.cancel(stored_id, now)  # type: ignore[no-any-return]

        await self._called(schedule_id, ops.CANCEL, cancel)

    async def _reschedule(self, schedule_id: str, stored_id: str, version: int | None) -> None:
        """PATCH a new executeAt, half a second to five ahead (later or
        earlier than the one it had), with If-Match of the last version for
        half; once more for RESCHEDULE_AGAIN."""
        while True:
            await asyncio.sleep(self.rng.uniform(0.0, VERB_DELAY))
            new = self.now() + timedelta(seconds=round(self.rng.uniform(0.5, 5.0), 3))
            match = version if version is not None and self.rng.random() < 0.5 else None
            done = await self._changed(
                schedule_id,
                stored_id,
                ops.PATCH,
                _patching({"executeAt": iso(new)}),
                match,
                executeAt=new.timestamp(),
            )
            if done is None or done.type != ops.OK:
                return  # unknown (settled after the run), or refused: as it was
            version = done.value.get("version")
            if self.rng.random() >= RESCHEDULE_AGAIN:
                return

    async def _pause(self, schedule_id: str, stored_id: str) -> None:
        await asyncio.sleep(self.rng.uniform(0.0, VERB_DELAY))
        done = await self._changed(schedule_id, stored_id, ops.PAUSE, changes.pause)
        if done is None or done.type != ops.OK or self.rng.random() >= RESUME_SHARE:
            return
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        await self._changed(schedule_id, stored_id, ops.RESUME, changes.resume)

    async def _changed(
        self,
        schedule_id: str,
        stored_id: str,
        f: str,
        decide: Decide,
        if_match: int | None = None,
        **value: Any,
    ) -> ops.Op | None:
        """One verb as the API's ``_change`` makes it (the store reads the
        schedule, ``decide`` judges it, the change is written where it is
        still as read)."""

        async def change(node: SimNode, now: datetime) -> dict[str, Any] | None:
            found = await node.store.change(stored_id, lambda doc: decide(doc, now), now, if_match)
            return None if found is None else dict(found[0])

        return await self._called(schedule_id, f, change, **value)

    async def _called(
        self,
        schedule_id: str,
        f: str,
        call: Callable[[SimNode, datetime], Any],
        **value: Any,
    ) -> ops.Op | None:
        """One call through a serving node, as an invoke and its completion
        (None: no node to ask, nothing sent, nothing written)."""
        node = self.cluster.serving(self.rng)
        if node is None:
            return None
        invoked = self.history.invoke(schedule_id, f, self.at(), schedule_id, **value)
        try:
            doc = await call(node, self.now())
        except StoreUnavailable as exc:
            return self.history.complete(invoked, ops.INFO, self.at(), status=503, code=exc.code)
        except SchedulerError as exc:
            return self.history.complete(
                invoked, ops.FAIL, self.at(), status=exc.status_hint, code=exc.code
            )
        if doc is None:
            return self.history.complete(invoked, ops.FAIL, self.at(), status=404, code="not_found")
        return self.history.complete(
            invoked, ops.OK, self.at(), status=200, code=None, version=doc.get("version")
        )


def _patching(body: dict[str, Any]) -> Decide:
    """The PATCH of ``body``, as the API decides it."""

    def patch(doc: dict[str, Any], now: datetime) -> Change | None:
        return changes.patch(doc, parse_patch(body, LIMITS, now), now)

    return patch
