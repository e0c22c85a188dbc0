"""Histories for the chaos checker's tests, made through the History API as
the load, the fault player and the observer write them: each client call an
invoke and its completion, each fault a nemesis event."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from chaos import history as ops
from chaos.checker import passed
from chaos.checker.model import occurrences
from chaos.history import Delivery, History, Op, Topic

# How long before its answer each call is sent, unless told.
TOOK = 0.01
STATUS = {ops.OK: 200, ops.FAIL: 409, ops.INFO: None}


def iso(epoch: float) -> str:
    """Epoch seconds as the API writes times (to the millisecond)."""
    when = datetime.fromtimestamp(epoch, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Load:
    """One run's history, written call by call."""

    def __init__(self, started: float = 0.0, **meta: Any) -> None:
        self.history = History(started=started, meta=meta)

    def _call(
        self, process: str, f: str, at: float, type_: str, schedule: str | None, **value: Any
    ) -> tuple[Op, Op]:
        invoked = self.history.invoke(process, f, at - TOOK, schedule, **value)
        status = {"status": STATUS[type_]} if STATUS[type_] else {}
        return invoked, self.history.complete(invoked, type_, at, **status)

    def create(
        self,
        unit: str,
        execute_at: float,
        *,
        at: float = 0.0,
        group: str | None = None,
        sink: str | None = None,
        flow_rate: int | None = None,
    ) -> Load:
        """A one-shot schedule's create that took (a 201); ``sink``: the
        destination it named, as the load notes it (none: as before sinks);
        ``flow_rate``: under the load's flow key, at that rate a second."""
        labels = {"group": group} if group else {}
        named: dict[str, Any] = {"sink": sink} if sink else {}
        if flow_rate:
            named.update(flowRate=flow_rate, flowPeriod=1.0)
        invoked = self.history.invoke(
            unit, ops.CREATE, at, unit, executeAt=execute_at, tenant="default", **labels, **named
        )
        self.history.complete(invoked, ops.OK, at + TOOK, status=201)
        return self

    def created(self, accepted: Mapping[str, float], *, group: str | None = None) -> Load:
        for unit, execute_at in accepted.items():
            self.create(unit, execute_at, group=group)
        return self

    def chain(
        self, schedule: str, start: float, end: float, every: float, *, sink: str | None = None
    ) -> list[str]:
        """A recurring schedule's create that took; its occurrences' units."""
        recurrence = {"start": iso(start), "end": iso(end), "every": every}
        named = {"sink": sink} if sink else {}
        invoked = self.history.invoke(
            schedule, ops.CREATE, 0.0, schedule, recurrence=recurrence, **named
        )
        self.history.complete(invoked, ops.OK, TOOK, status=201)
        return list(occurrences(schedule, recurrence))

    def cancel(self, unit: str, answered: float, type_: str = ops.OK) -> Load:
        self._call(unit, ops.CANCEL, answered, type_, unit)
        return self

    def patch(self, unit: str, execute_at: float, answered: float, type_: str = ops.OK) -> Load:
        """A PATCH of ``unit``'s executeAt, answered (or given up on) then."""
        self._call(unit, ops.PATCH, answered, type_, unit, executeAt=execute_at)
        return self

    def switch(
        self, unit: str, sink: str, execute_at: float, answered: float, type_: str = ops.OK
    ) -> Load:
        """A PATCH that moves ``unit`` to ``execute_at`` and switches its
        destination to ``sink``, as the load sends one."""
        self._call(unit, ops.PATCH, answered, type_, unit, executeAt=execute_at, sink=sink)
        return self

    def failed(self, schedule: str, error: str = "HTTP 400") -> Load:
        """The store held ``schedule`` DELIVERY_FAILED at the end."""
        self.history.event(ops.OBSERVER, ops.DELIVERY_FAILED, 0.0, id=schedule, error=error)
        return self

    def pause(self, unit: str, answered: float, type_: str = ops.OK) -> Load:
        self._call(unit, ops.PAUSE, answered, type_, unit)
        return self

    def resume(self, unit: str, sent: float, answered: float, type_: str = ops.OK) -> Load:
        invoked = self.history.invoke(unit, ops.RESUME, sent, unit)
        status = {"status": STATUS[type_]} if STATUS[type_] else {}
        self.history.complete(invoked, type_, answered, **status)
        return self

    def bulk_cancel(self, group: str, answered: float, took: Iterable[str]) -> Load:
        """A bulk cancel of a label group, settled: the members it took."""
        taken = sorted(took)
        invoked = self.history.invoke("bulk", ops.BULK_CANCEL, answered - TOOK, group=group)
        self.history.complete(
            invoked, ops.OK, answered, status=200, cancelled=len(taken), more=False, took=taken
        )
        return self

    def bulk_pause(self, group: str, answered: float, took: Iterable[str]) -> Load:
        """A bulk pause of a label group, settled: the members it took."""
        taken = sorted(took)
        invoked = self.history.invoke("bulk", ops.BULK_PAUSE, answered - TOOK, group=group)
        self.history.complete(
            invoked, ops.OK, answered, status=200, changed=len(taken), more=False, took=taken
        )
        return self

    def fault(
        self, do: str, at: float, lasting: float = 0.0, step: str | None = None, **fields: Any
    ) -> Op:
        """A fault the player played ``at`` seconds from the start."""
        return self.history.event(
            ops.NEMESIS,
            do,
            self.history.started + at,
            at=at,
            do=do,
            step=step or f"{do} for {lasting:g} s",
            lasting=lasting,
            **fields,
        )

    def note(self, of: Op, at: float, **fields: Any) -> Op:
        return self.history.event(ops.NEMESIS, ops.NOTE, at, of=of.index, **fields)

    def stall(self, label: str, start: float, end: float, *, most: bool = False) -> Op:
        """A spell in which the nodes' /readyz said the broker stalled
        (``most``: most nodes said so)."""
        return self.history.event(
            ops.OBSERVER, ops.BROKER_STALL, start, label=label, start=start, end=end, most=most
        )


def created(accepted: Mapping[str, float], **meta: Any) -> History:
    """A history of nothing but these creates, each taken."""
    return Load(**meta).created(accepted).history


def topic(
    *deliveries: Delivery,
    kept: Iterable[str] | None = None,
    refused: Iterable[str] = (),
    replayed: Iterable[Delivery] = (),
) -> Topic:
    return Topic(
        tuple(deliveries),
        None if kept is None else frozenset(kept),
        frozenset(refused),
        tuple(replayed),
    )


def as_run(result: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A checker's result with the fields a run adds (a plain one unless
    ``fields`` say otherwise), judged as a run judges it."""
    run: dict[str, Any] = {
        "scenario": "s",
        "seed": 1,
        "unfenced": False,
        "refused": 0,
        "chains": 0,
        "network": "loopback",
        "events": [],
        "refusals": {},
        "started": 995.0,
    }
    result.update(run | fields)
    result.setdefault("passed", passed(result))
    return result
