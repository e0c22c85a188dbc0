"""The schedules above the default priority this node was told of, kept
until they fall due: then each one a full view would hide (a backlog due
before it fills its bucket's view) joins the work in hand at once, ahead
of that backlog, read by id when the node has not the document itself.

A node hears of one when it stores it (the document) or when the change
feed tells of its insert (its id, bucket, due time and priority). At most
TRACKED are kept: past that, the ones told last go in due order, like any
other schedule (priority is for the urgent minority of the work).

Pure: no IO and no clock reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

TRACKED = 10_000


@dataclass(frozen=True)
class Urgent:
    schedule_id: str
    bucket: int
    due_at: datetime | None  # None: not said (due now)
    doc: dict[str, Any] | None = None  # the document, when this node stored it


class UrgentWatch:
    def __init__(self, tracked: int = TRACKED) -> None:
        self.tracked = tracked
        self._kept: dict[str, Urgent] = {}

    def told(self, urgent: Urgent) -> None:
        if urgent.schedule_id in self._kept or len(self._kept) < self.tracked:
            self._kept[urgent.schedule_id] = urgent

    def due(self, now: datetime) -> list[Urgent]:
        """Those due by ``now``, forgotten from here on, earliest first."""
        ready = [u for u in self._kept.values() if u.due_at is None or u.due_at <= now]
        for urgent in ready:
            del self._kept[urgent.schedule_id]
        return sorted(ready, key=lambda u: (u.due_at is not None, u.due_at or now))

    def next_due(self) -> datetime | None:
        return min((u.due_at for u in self._kept.values() if u.due_at is not None), default=None)

    def __len__(self) -> int:
        return len(self._kept)
