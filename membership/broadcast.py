"""The retransmit queue for piggybacked updates (SWIM section 4.1;
memberlist queue.go).

One entry per member: a newer update about a member replaces the older one.
Each entry goes out ``limit`` times (about lambda * log(n)); those sent
fewest times go first, newest first among equals, so fresh news spreads
fastest.
"""

from __future__ import annotations

from dataclasses import dataclass

from membership.codec import message_size
from membership.messages import Update


@dataclass
class _Entry:
    update: Update
    size: int
    transmits: int
    order: int


class BroadcastQueue:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, update: Update) -> None:
        self._order += 1
        self._entries[update.member] = _Entry(update, message_size(update), 0, self._order)

    def take(self, budget: int, limit: int, *, skip: str | None = None) -> list[Update]:
        """Updates that fit in ``budget`` bytes; each counts as one transmit."""
        chosen: list[Update] = []
        if budget <= 0 or not self._entries:
            return chosen
        for entry in sorted(self._entries.values(), key=lambda e: (e.transmits, -e.order)):
            if entry.size > budget or entry.update.member == skip:
                continue
            chosen.append(entry.update)
            budget -= entry.size
            entry.transmits += 1
            if entry.transmits >= limit:
                del self._entries[entry.update.member]
        return chosen
