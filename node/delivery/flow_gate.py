"""What one node knows of the flow-controlled keys, and what it asks the
store for them (``node/schedule/flow.py`` says what a limit is;
``node/store/flow.py`` keeps the cluster-wide counts).

A round's batch goes through the gate before its claim. For each key in it
the node asks, in one round trip for all keys each:

1. for a key with a parallelism: the key's slots, when it holds fewer free
   ones than it has due (or those it holds near the end of their term). A
   node keeps the slots it took while it has work of the key, and gives
   them back once it has none (``idle``): a key drained by one node costs a
   round trip a round, not one per delivery;
2. for a key with a rate: its starts in the current slice, as many as the
   key may still send (its free slots, the slice's capacity).

It admits each key's earliest schedules up to what both granted; the rest
stay due in the book, unclaimed. A key refused is *shut*: until its slice
ends (the rate), or for a backoff doubling from SHUT_FIRST to SHUT_MOST
while other nodes hold its slots. A shut key's schedules are held back as
one route (``routes.py``): they never hold back another key's.

Rounds keep the key's in-flight count here: a slot is in use from its
admission until the node no longer has that delivery out (``settle``).

Pure: no IO and no clock reads.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from node.schedule.flow import FlowControl, rate_slice, slot_ids
from node.store.contract import RateWant, SlotWant

Doc = dict[str, Any]
# A key whose slots other nodes hold is asked for again after this long,
# doubling while refused, at most SHUT_MOST (seconds).
SHUT_FIRST = 0.05
SHUT_MOST = 1.0


def flow_key(doc: Doc) -> tuple[str, FlowControl] | None:
    """(the route's name of the key, its limit), for a schedule with one."""
    stored = doc.get("flow")
    if not stored:
        return None
    return _flow_key(
        str(doc.get("tenant")),
        str(stored.get("key")),
        stored.get("rate"),
        stored.get("periodMs"),
        stored.get("parallelism"),
    )


@functools.lru_cache(maxsize=1024)
def _flow_key(
    tenant: str, key: str, rate: int | None, period_ms: int | None, parallelism: int | None
) -> tuple[str, FlowControl]:
    """Made once per limit, not per schedule and round (a round asks of
    every schedule in hand)."""
    stored = {"key": key, "rate": rate, "periodMs": period_ms or 1000, "parallelism": parallelism}
    return f"{tenant}\x00{key}", FlowControl.from_document(stored)


@dataclass
class _Key:
    tenant: str
    flow: FlowControl
    shut_until: float = 0.0  # monotonic
    backoff: float = 0.0
    held: set[str] = field(default_factory=set)  # slot ids this node holds
    renewed_at: float = 0.0  # monotonic: when they were last taken or renewed
    using: dict[str, str] = field(default_factory=dict)  # slot -> schedule id


@dataclass(frozen=True)
class Asks:
    """What a batch asks of the store: slots first, then rate."""

    slots: list[SlotWant]
    due: dict[str, list[Doc]]  # by key, earliest first


class FlowGate:
    def __init__(self, slot_term: float) -> None:
        self.slot_term = slot_term
        self._keys: dict[str, _Key] = {}
        # Schedule id -> the end of the slice its start was reserved in: the
        # latest it may go.
        self._starts_by: dict[str, datetime] = {}

    # -- what a round may take --------------------------------------------------

    def shut(self, doc: Doc, monotonic: float) -> bool:
        """Whether ``doc``'s key is shut now (the same for its whole route)."""
        found = flow_key(doc)
        if found is None:
            return False
        state = self._keys.get(found[0])
        return state is not None and monotonic < state.shut_until

    def room(self, doc: Doc, now: datetime) -> int:
        """How many of ``doc``'s key one batch may hold at most: its free
        slots (or its parallelism, before it holds any) and the current
        slice's share of its rate."""
        found = flow_key(doc)
        if found is None:
            return 1 << 30
        name, flow = found
        state = self._keys.get(name)
        most = 1 << 30
        if flow.parallelism is not None:
            in_use = 0 if state is None else len(state.using)
            most = flow.parallelism - in_use
        if flow.rate is not None:
            most = min(most, rate_slice(str(doc.get("tenant")), flow, now).capacity)
        return max(0, most)

    # -- the asks of a batch, and what they granted ------------------------------

    def asks(self, batch: Sequence[Doc], monotonic: float) -> Asks:
        """Group the batch's limited schedules by key; the slots to take or
        renew (for these keys and any whose held slots near their term)."""
        due: dict[str, list[Doc]] = defaultdict(list)
        for doc in batch:
            found = flow_key(doc)
            if found is None:
                continue
            name, flow = found
            if name not in self._keys:
                self._keys[name] = _Key(str(doc.get("tenant")), flow)
            due[name].append(doc)
        slots: list[SlotWant] = []
        for name, state in self._keys.items():
            if state.flow.parallelism is None:
                continue
            free = len(state.held) - len(state.using)
            wanted = (
                name in due and free < len(due[name]) and len(state.held) < state.flow.parallelism
            )
            aging = bool(state.held) and monotonic - state.renewed_at > self.slot_term / 2
            if wanted or aging:
                ids = tuple(slot_ids(state.tenant, state.flow))
                slots.append(SlotWant(state.tenant, state.flow.key, ids))
        return Asks(slots, {k: sorted(v, key=lambda d: d["dueAt"]) for k, v in due.items()})

    def held(self, asks: Asks, taken: Collection[str], monotonic: float) -> None:
        """The slots the store says this node holds now, of those asked."""
        for want in asks.slots:
            name = f"{want.tenant}\x00{want.key}"
            state = self._keys[name]
            state.held = {slot for slot in want.slots if slot in taken}
            state.renewed_at = monotonic
            for slot in list(state.using):
                if slot not in state.held:
                    # Lost while in use (expired unrenewed): the delivery
                    # goes on; the count keeps it until it is settled.
                    state.held.add(slot)

    def rate_wants(self, asks: Asks, now: datetime) -> tuple[list[str], list[RateWant]]:
        """After the slots: the starts to reserve for each key with a rate,
        as many as it may send (its free slots and its due work)."""
        names, wants = [], []
        for name, docs in asks.due.items():
            state = self._keys[name]
            if state.flow.rate is None:
                continue
            count = min(len(docs), self._free(state))
            if count <= 0:
                continue
            names.append(name)
            wants.append(
                RateWant(
                    state.tenant, state.flow.key, rate_slice(state.tenant, state.flow, now), count
                )
            )
        return names, wants

    def admit(
        self,
        asks: Asks,
        rated: Sequence[str],
        grants: Sequence[int],
        wants: Sequence[RateWant],
        monotonic: float,
        now: datetime,
    ) -> tuple[list[Doc], Counter[str]]:
        """The schedules admitted (each key's earliest, up to its grants;
        a slot marked in use for each), and by tenant how many were held
        back. Keys refused are shut."""
        by_rate = dict(zip(rated, zip(grants, wants, strict=True), strict=True))
        admitted: list[Doc] = []
        refused: Counter[str] = Counter()
        for name, docs in asks.due.items():
            state = self._keys[name]
            allowed = len(docs)
            if state.flow.parallelism is not None:
                allowed = min(allowed, self._free(state))
                if allowed < len(docs) and len(state.held) < state.flow.parallelism:
                    self._shut_for_slots(state, monotonic)
            if name in by_rate:
                grant, want = by_rate[name]
                allowed = min(allowed, grant)
                for doc in docs[:allowed]:
                    self._starts_by[str(doc["_id"])] = want.slice.ends_at
                if grant < want.count or grant >= want.slice.capacity:
                    # The slice is spent: nothing more before the next one.
                    state.shut_until = monotonic + max(
                        0.0, (want.slice.ends_at - now).total_seconds()
                    )
            elif state.flow.rate is not None:
                allowed = 0
            if allowed == len(docs) and state.flow.parallelism is not None:
                state.backoff = 0.0
            free = iter(sorted(state.held - set(state.using)))
            for doc in docs[:allowed]:
                if state.flow.parallelism is not None:
                    state.using[next(free)] = str(doc["_id"])
                admitted.append(doc)
            refused[state.tenant] += len(docs) - allowed
        return admitted, refused

    def _free(self, state: _Key) -> int:
        if state.flow.parallelism is None:
            return 1 << 30
        return len(state.held) - len(state.using)

    def _shut_for_slots(self, state: _Key, monotonic: float) -> None:
        state.backoff = min(SHUT_MOST, max(SHUT_FIRST, state.backoff * 2))
        state.shut_until = max(state.shut_until, monotonic + state.backoff)

    # -- after the claims ---------------------------------------------------------

    def settle(self, out: Collection[str]) -> None:
        """Only the deliveries in ``out`` (schedule ids) are still in flight:
        the slots of the rest are free again."""
        for state in self._keys.values():
            state.using = {slot: sid for slot, sid in state.using.items() if sid in out}
        self._starts_by = {sid: by for sid, by in self._starts_by.items() if sid in out}

    def too_late(self, schedule_id: str, now: datetime) -> bool:
        """Whether the start reserved for ``schedule_id`` may no longer go
        (the node was held up between its reservation and its call)."""
        by = self._starts_by.get(schedule_id)
        return by is not None and now > by

    def idle(self, due_keys: Collection[str], monotonic: float) -> list[str]:
        """The slots to give back: of keys with no work due here and none
        in flight. Keys with nothing held or shut are forgotten."""
        released: list[str] = []
        for name in list(self._keys):
            state = self._keys[name]
            if name in due_keys or state.using:
                continue
            released += sorted(state.held)
            state.held = set()
            if monotonic >= state.shut_until:
                del self._keys[name]
        return released

    def next_open(self, monotonic: float) -> float | None:
        """Seconds until the first shut key opens again, if any is shut."""
        waits = [s.shut_until - monotonic for s in self._keys.values() if s.shut_until > monotonic]
        return min(waits, default=None)

    def keys_shut(self, monotonic: float) -> int:
        return sum(1 for s in self._keys.values() if s.shut_until > monotonic)


__all__ = ["SHUT_FIRST", "SHUT_MOST", "Asks", "FlowGate", "flow_key"]
