"""Flow control: how fast and how many at once one key's deliveries go.

A schedule may name a flow key (``"flowControl": {"key": "acme-crm",
"rate": 20, "period": "PT1S", "parallelism": 3}``; rate and parallelism
each optional, at least one): across the whole cluster, at most ``rate``
deliveries of the key start per ``period`` and at most ``parallelism`` are
in flight at once. The key is the tenant's: two tenants' keys never share
a limit. What the limit holds back is not an attempt: it stays due and
goes in a later window.

The rate is counted in *slices*: a period is cut into ``slices`` equal
parts (ten, or one per delivery below ten a period), each with its share
of the rate, reserved in the store by every owner at once (``FlowGates``).
Any window of one period then overlaps at most ``slices + 1`` slices, so
it sees at most ``rate`` plus one slice's share of reservations (20 a
second: 22 in any second, however the window falls); a fixed window per
period would let twice the rate through across its edge. A start goes
within its slice or not at all (a node held up between its reservation
and its call, a pause, puts the call back), so the starts in any window
are at most ``rate`` plus one slice's share too.

Pure: no IO and no clock reads.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from node.errors import ValidationFailed
from node.schedule.times import format_duration, parse_duration

MAX_KEY_LENGTH = 200
# The key of a tenant's default delivery rate (``tenants set
# --delivery-rate``), on its schedules that name no key of their own.
TENANT_FLOW_KEY = "*tenant"
MAX_RATE = 100_000
MAX_PARALLELISM = 1_000
MIN_PERIOD = timedelta(milliseconds=100)
MAX_PERIOD = timedelta(days=1)
DEFAULT_PERIOD = timedelta(seconds=1)
# Slices a period is cut into at most: a window of one period sees at most
# 1 + 1 / SLICES of the rate.
SLICES = 10
_FIELDS = frozenset({"key", "rate", "period", "parallelism"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class FlowControl:
    key: str
    rate: int | None = None
    period: timedelta = DEFAULT_PERIOD
    parallelism: int | None = None

    @property
    def period_ms(self) -> int:
        return self.period // timedelta(milliseconds=1)

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"key": self.key}
        if self.rate is not None:
            doc["rate"] = self.rate
            doc["periodMs"] = self.period_ms
        if self.parallelism is not None:
            doc["parallelism"] = self.parallelism
        return doc

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> FlowControl:
        return cls(
            key=str(doc["key"]),
            rate=int(doc["rate"]) if doc.get("rate") is not None else None,
            period=timedelta(milliseconds=int(doc.get("periodMs", 1000))),
            parallelism=int(doc["parallelism"]) if doc.get("parallelism") is not None else None,
        )

    def to_view(self) -> dict[str, Any]:
        view: dict[str, Any] = {"key": self.key}
        if self.rate is not None:
            view["rate"] = self.rate
            view["period"] = format_duration(self.period)
        if self.parallelism is not None:
            view["parallelism"] = self.parallelism
        return view


def parse_flow_control(data: object, field: str = "flowControl") -> FlowControl:
    """A schedule's ``flowControl`` object."""
    if not isinstance(data, dict):
        raise ValidationFailed(f"{field} must be an object", field)
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown field {unknown[0]!r} in {field}", f"{field}.{unknown[0]}")
    key = data.get("key")
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH or not key.isprintable():
        raise ValidationFailed(
            f"{field}.key must be 1 to {MAX_KEY_LENGTH} printable characters", f"{field}.key"
        )
    rate = _bounded_int(data, "rate", MAX_RATE, field)
    parallelism = _bounded_int(data, "parallelism", MAX_PARALLELISM, field)
    if rate is None and parallelism is None:
        raise ValidationFailed(f"{field} needs a rate, a parallelism or both", f"{field}.rate")
    period = DEFAULT_PERIOD
    if "period" in data:
        if rate is None:
            raise ValidationFailed(f"{field}.period needs a rate", f"{field}.period")
        period = parse_duration(data["period"], f"{field}.period")
        if not MIN_PERIOD <= period <= MAX_PERIOD:
            raise ValidationFailed(f"{field}.period must be from PT0.1S to P1D", f"{field}.period")
    return FlowControl(key=key, rate=rate, period=period, parallelism=parallelism)


def _bounded_int(data: dict[str, Any], name: str, most: int, field: str) -> int | None:
    if name not in data:
        return None
    value = data[name]
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise ValidationFailed(
            f"{field}.{name} must be an integer from 1 to {most:,}", f"{field}.{name}"
        )
    return value


def flow_of(doc: dict[str, Any]) -> FlowControl | None:
    """The flow control a stored schedule is delivered under, if any."""
    stored = doc.get("flow")
    return FlowControl.from_document(stored) if stored else None


def key_id(tenant: str, key: str) -> str:
    """A short, fixed-length name of a tenant's key for the store's ids
    (keys are up to 200 characters of anything printable)."""
    return hashlib.sha256(f"{tenant}\x00{key}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Slice:
    """One slice of a key's rate: its id in the store, how many deliveries
    it lets start, and when it ends (the next one begins)."""

    id: str
    capacity: int
    ends_at: datetime


def rate_slice(tenant: str, flow: FlowControl, now: datetime) -> Slice:
    """The slice of ``flow``'s rate that ``now`` falls in. Slices are cut
    from the epoch, so every owner counts in the same ones; slice ``i`` of a
    period holds ``floor((i + 1) r / s) - floor(i r / s)``: together exactly
    the rate, spread as evenly as whole deliveries allow."""
    assert flow.rate is not None
    slices = min(SLICES, flow.rate)
    period_ms = flow.period_ms
    now_ms = (now - _EPOCH) // timedelta(milliseconds=1)
    index = now_ms * slices // period_ms
    within = index % slices
    capacity = (within + 1) * flow.rate // slices - within * flow.rate // slices
    end_ms = -(-(index + 1) * period_ms // slices)  # the ceiling
    return Slice(
        id=f"r/{key_id(tenant, flow.key)}/{flow.rate}/{period_ms}/{index}",
        capacity=capacity,
        ends_at=_EPOCH + timedelta(milliseconds=end_ms),
    )


def slot_ids(tenant: str, flow: FlowControl) -> list[str]:
    """The ids of a key's parallelism slots: one in-flight delivery each."""
    assert flow.parallelism is not None
    digest = key_id(tenant, flow.key)
    return [f"p/{digest}/{flow.parallelism}/{i}" for i in range(flow.parallelism)]
