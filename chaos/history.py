"""One chaos run's history, in Jepsen's shape: an append-only list of
operations, and what the topic got. Pure: no IO, no clock of its own.

Every call the load makes is two ops of one ``process`` (a schedule's own
client, ``s17``; a recurring schedule's, ``chain3``; the bulk canceller's):
an ``invoke`` when it is sent, then its completion when it ends:

* ``ok``: it took effect (a 2xx);
* ``fail``: it did not, and never will (a 4xx, or a create refused after
  every try);
* ``info``: nobody knows (no answer, or a 5xx: the store may have applied
  the write before it failed). After the run ``chaos/settle.py`` turns each
  ``info`` into ``ok`` or ``fail`` by reading the schedule back, where a
  node can show it, and says ``settled`` in the completion's value.

The fault player writes its steps as ``info`` ops of the ``nemesis``
process (each value one fault's event, as the report shows it, and later
``note`` ops adding what was learnt of it: how long the cluster took to
settle, a flood's figures), and the observer the spells in which the nodes
said the broker stalled and the schedules the store held DELIVERY_FAILED
at the end. The checker (``chaos/checker/``) reads nothing
else: every ledger a run used to keep is a query over these ops.

An op's ``at`` is epoch seconds of the runner's clock, the one executeAt
values are written with; a value holds JSON-able data only, so a history
is written as JSON lines beside the run's summary and read back for a
check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
COMPLETIONS = (OK, FAIL, INFO)

# The processes that are not a client of the API.
NEMESIS = "nemesis"  # the fault player
OBSERVER = "observer"  # what the nodes' probes said (broker stalls)

# The client ops' functions.
CREATE = "create"
CANCEL = "cancel"  # a DELETE of one schedule
PATCH = "patch"  # a new executeAt
PAUSE = "pause"
RESUME = "resume"
BULK_CANCEL = "bulk-cancel"  # POST /v1/schedules:cancel of one label group
BULK_PAUSE = "bulk-pause"  # POST /v1/schedules:pause of one label group
# A nemesis op that adds fields to an earlier fault's event (value["of"]).
NOTE = "note"
BROKER_STALL = "broker-stall"
# An observer op per schedule the store held DELIVERY_FAILED at the end
# (value: its ``id`` and ``error``).
DELIVERY_FAILED = "delivery-failed"

# Between a recurring schedule's id and an occurrence's time in a unit's
# name; ids cannot contain it.
OCCURRENCE = "@"


def occurrence(schedule_id: str, execute_at: str) -> str:
    """The unit name of one occurrence of a recurring schedule."""
    return f"{schedule_id}{OCCURRENCE}{execute_at}"


@dataclass(frozen=True)
class Op:
    index: int
    process: str
    type: str  # invoke | ok | fail | info
    f: str
    at: float  # epoch seconds, the runner's clock
    schedule: str | None = None
    value: Mapping[str, Any] = field(default_factory=dict)

    @property
    def client(self) -> bool:
        """An op of the load (not the nemesis's nor the observer's)."""
        return self.process not in (NEMESIS, OBSERVER)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "at": round(self.at, 6),
        }
        if self.schedule is not None:
            out["schedule"] = self.schedule
        if self.value:
            out["value"] = dict(self.value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Op:
        return cls(
            int(data["index"]),
            str(data["process"]),
            str(data["type"]),
            str(data["f"]),
            float(data["at"]),
            data.get("schedule"),
            dict(data.get("value", {})),
        )


@dataclass(frozen=True)
class Call:
    """One client op: its invoke and its completion (None: it never ended)."""

    invoke: Op
    done: Op | None

    @property
    def type(self) -> str:
        return self.done.type if self.done is not None else INFO

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def schedule(self) -> str:
        return self.invoke.schedule or ""

    @property
    def done_value(self) -> Mapping[str, Any]:
        return self.done.value if self.done is not None else {}

    @property
    def unknown(self) -> bool:
        """Whether nobody knows what the call did, and no view settled it yet:
        no answer or a 5xx; for a resume, any answer but a 200 (a bulk cancel
        may have taken the schedule while it was paused)."""
        if "settled" in self.done_value:
            return False
        return self.type != OK if self.f == RESUME else self.type == INFO

    @property
    def ended(self) -> float:
        """When the call ended (or was given up on): its completion's time."""
        return self.done.at if self.done is not None else self.invoke.at

    def __getitem__(self, key: str) -> Any:
        """A value of the completion, else of the invoke."""
        if self.done is not None and key in self.done.value:
            return self.done.value[key]
        return self.invoke.value[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


class History:
    """The run's ops in the order they happened; ``started`` is when the
    load began (the report's times are seconds from it)."""

    def __init__(
        self,
        ops: Iterable[Op] = (),
        *,
        started: float = 0.0,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.ops: list[Op] = list(ops)
        self.started = started
        self.meta: dict[str, Any] = dict(meta or {})
        self._open: dict[str, Op] = {}  # process -> its invoke not yet completed

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def _append(
        self, process: str, type_: str, f: str, at: float, schedule: str | None, value: Any
    ) -> Op:
        op = Op(len(self.ops), process, type_, f, at, schedule, dict(value))
        self.ops.append(op)
        return op

    def invoke(
        self, process: str, f: str, at: float, schedule: str | None = None, /, **value: Any
    ) -> Op:
        if process in self._open:
            raise ValueError(f"{process} invoked {f} before its {self._open[process].f} ended")
        op = self._append(process, INVOKE, f, at, schedule, value)
        self._open[process] = op
        return op

    def complete(self, invoked: Op, type_: str, at: float, /, **value: Any) -> Op:
        if type_ not in COMPLETIONS:
            raise ValueError(f"not a completion: {type_}")
        if self._open.get(invoked.process) is not invoked:
            raise ValueError(f"{invoked.process} has no {invoked.f} open")
        del self._open[invoked.process]
        return self._append(invoked.process, type_, invoked.f, at, invoked.schedule, value)

    def event(self, process: str, f: str, at: float, /, **value: Any) -> Op:
        """An op with no invoke: a fault, a note on one, an observation. (Its
        arguments are positional: a fault's value has an ``at`` of its own,
        seconds from the start.)"""
        return self._append(process, INFO, f, at, None, value)

    # -- queries -------------------------------------------------------------

    def calls(self, *fs: str) -> list[Call]:
        """The client ops (of the functions ``fs``, or all), each invoke with
        its completion, in the order they were invoked."""
        done: dict[int, Op] = {}
        pending: dict[str, Op] = {}
        for op in self.ops:
            if not op.client:
                continue
            if op.type == INVOKE:
                pending[op.process] = op
            elif op.process in pending:
                done[pending.pop(op.process).index] = op
        return [
            Call(op, done.get(op.index))
            for op in self.ops
            if op.client and op.type == INVOKE and (not fs or op.f in fs)
        ]

    def took(self, f: str) -> set[str]:
        """The schedules a call of ``f`` took effect on (``ok``)."""
        return {call.schedule for call in self.calls(f) if call.type == OK}

    def events(self, process: str = NEMESIS, f: str | None = None) -> list[Op]:
        return [
            op
            for op in self.ops
            if op.process == process and op.type == INFO and (f is None or op.f == f)
        ]

    def replaced(self, completions: Mapping[int, Op]) -> History:
        """A copy with the completions at those indexes replaced (settling)."""
        ops = [completions.get(op.index, op) for op in self.ops]
        return History(ops, started=self.started, meta=self.meta)

    # -- files -----------------------------------------------------------------

    def write(self, path: Path) -> None:
        """JSON lines: a header (started, meta), then one op a line."""
        with path.open("w") as out:
            out.write(json.dumps({"started": self.started, "meta": self.meta}) + "\n")
            for op in self.ops:
                out.write(json.dumps(op.as_dict()) + "\n")

    @classmethod
    def read(cls, path: Path) -> History:
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])
        ops = [Op.from_dict(json.loads(line)) for line in lines[1:] if line]
        return cls(ops, started=float(header["started"]), meta=header.get("meta", {}))


# The sinks a delivery arrives at: the run's topic, or the run's receiver
# (an ``http`` target).
KAFKA, HTTP = "kafka", "http"


@dataclass(frozen=True)
class Delivery:
    """One record the topic got, or one request the receiver took (a 2xx),
    named by the unit the checker judges."""

    schedule_id: str  # the unit: a schedule, or one occurrence of a recurring one
    token: int
    attempt: int
    # Epoch seconds: the Kafka record timestamp (the publishing node's
    # reading of the store's clock when it made the batch), or when the
    # receiver read the request's head (its host's clock, the runner's).
    at: float
    # What the record carried and where the broker put it: the evidence that
    # tells a producer's resend of one batch from a second publish. None
    # when not recorded (such a repeat is never explained as a resend).
    digest: str | None = None  # of the record value
    partition: int | None = None
    offset: int | None = None
    # When the runner read it (epoch seconds, its own clock); None: not noted.
    received: float | None = None
    # The record's execute-at header (epoch seconds); None: not noted.
    execute_at: float | None = None
    sink: str = KAFKA  # where it arrived: KAFKA or HTTP

    @property
    def schedule(self) -> str:
        return self.schedule_id.partition(OCCURRENCE)[0]

    @property
    def record(self) -> tuple[str, str | None, int | None, int | None]:
        """What one record read twice shares: its unit, its bytes, its place."""
        return self.schedule_id, self.digest, self.partition, self.offset


@dataclass(frozen=True)
class Topic:
    """What the sinks got, as one stream keyed by unit (a PATCH may switch a
    schedule between the topic and an http target, so its delivery may
    arrive at either): every record of the topic read live and every
    request the receiver took; the units a fresh reader found in the topic
    at the end (None: not read again); the units whose request the
    receiver refused for good (a 4xx the node must not retry: the schedule
    ends DELIVERY_FAILED, as asked); and the records the fresh reader found
    that the live one was never served (its fetches passed their offsets
    before the broker showed them: in the topic all the same, so delivered)."""

    deliveries: tuple[Delivery, ...]
    kept: frozenset[str] | None = None
    refused: frozenset[str] = frozenset()
    replayed: tuple[Delivery, ...] = ()
