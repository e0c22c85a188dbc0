"""The simulation's load: the chaos load's creates and cancels, made
through a serving node's own store calls (what its API would make of the
same requests), each written into the run's history as the real load
writes it (``chaos/load.py``), so the same checker reads both.

A create goes to a node picked at random among those running, up to
CREATE_TRIES times while the store does not answer (the same id: a retry
of an insert that applied is the same schedule). One in CANCEL_SHARE is
cancelled a moment later through another pick.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chaos import history as ops
from chaos.history import KAFKA, History
from chaos.lab.harness import iso
from chaos.sim.cluster import Cluster
from node.errors import NotCancellable, SchedulerError, StoreUnavailable
from node.schedule.model import Limits
from node.schedule.parse import parse_new_schedule

LIMITS = Limits(max_payload_bytes=64 * 1024, horizon=timedelta(days=30))
CANCEL_SHARE = 0.05
CREATE_TRIES = 6
GROUPS = 8
TOPIC = "sim"
NOT_CANCELLABLE, UNAVAILABLE = "not_cancellable", "store_unavailable"


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
        count = int(self.rate * self.duration)
        for i in range(count):
            await asyncio.sleep(self.rng.expovariate(self.rate))
            self.tasks.append(asyncio.create_task(self._schedule(i)))
        await asyncio.gather(*self.tasks)

    async def _schedule(self, i: int) -> None:
        lead = 0.0 if self.rng.random() < 0.05 else self.rng.uniform(1.0, 4.0)
        execute_at = self.now() + timedelta(seconds=lead)
        schedule_id, group = f"s{i}", f"g{self.rng.randrange(GROUPS)}"
        body = {"id": schedule_id, "topic": TOPIC, "executeAt": iso(execute_at), "payload": i,
                "labels": {"group": group}}  # fmt: skip
        invoked = self.history.invoke(
            schedule_id, ops.CREATE, self.at(), schedule_id,
            executeAt=execute_at.timestamp(), group=group, sink=KAFKA,
        )  # fmt: skip
        stored = await self._create(json.dumps(body).encode())
        if isinstance(stored, str):
            self.history.complete(invoked, ops.FAIL, self.at(), error=stored)
            return
        self.history.complete(invoked, ops.OK, self.at(), version=stored.get("version"))
        if self.rng.random() < CANCEL_SHARE and lead > 0.5:
            await asyncio.sleep(self.rng.uniform(0.0, lead / 2))
            await self._cancel(schedule_id, str(stored["_id"]))

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
        node = self.cluster.serving(self.rng)
        if node is None:
            return
        invoked = self.history.invoke(schedule_id, ops.CANCEL, self.at(), schedule_id)
        try:
            await node.store.cancel(stored_id, self.now())
        except NotCancellable:
            self.history.complete(invoked, ops.FAIL, self.at(), status=409, code=NOT_CANCELLABLE)
        except StoreUnavailable:
            self.history.complete(invoked, ops.INFO, self.at(), status=503, code=UNAVAILABLE)
        else:
            self.history.complete(invoked, ops.OK, self.at(), status=200, code=None)
