"""A view's schedules grouped by route, for the questions a round asks of
all of them.

A round asks of every schedule in the node's views: is it due, is it held
back (its host at its bound, its circuit open, the broker down), which
lane does it wait on. With a hung host's backlog in every view that is
thousands of the same schedules, round after round: in the isolation
bench, 4,400 of a hung host's calls in 256 views, walked a dozen times a
round, while the calls of another host waited for the rounds. Held back
or not is the same for every schedule of one *route*: its lane (``lane``:
the HTTP host, or None for Kafka), its URL (a host's bound counts by
host, its circuit by URL) and its flow key (``node/schedule/flow.py``: a
key's limit holds back all of its schedules at once). So a view's schedules are grouped by route,
each group earliest first, once when the view changes (a hung host's
backlog does not), and each question is asked once per group: a round
costs the routes in the views and the work it takes, not the backlog held.

Pure: no IO and no clock reads.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from node.schedule.destination import lane
from node.schedule.times import aware

Doc = dict[str, Any]
Lane = str | None
# (lane, URL, flow key); (None, None, None): a Kafka record of no flow key.
Route = tuple[Lane, str | None, str | None]
KAFKA: Route = (None, None, None)


def route(doc: Doc) -> Route:
    http = doc.get("http")
    flow = doc.get("flow")
    key = f"{doc.get('tenant')}\x00{flow['key']}" if flow else None
    return (lane(doc), str(http.get("url")), key) if http else (None, None, key)


def due_at(doc: Doc) -> datetime:
    return aware(doc["dueAt"])


class Routes:
    """One view's schedules grouped by route, each group earliest first."""

    __slots__ = ("_dues", "_groups", "tenants")

    def __init__(self, docs: Iterable[Doc]) -> None:
        groups: dict[Route, list[Doc]] = {}
        for doc in docs:
            groups.setdefault(route(doc), []).append(doc)
        for group in groups.values():
            group.sort(key=due_at)
        self._groups = groups
        self._dues = {found: [due_at(d) for d in group] for found, group in groups.items()}
        self.tenants = frozenset(str(d.get("tenant")) for group in groups.values() for d in group)

    def heads(self) -> Iterator[tuple[Route, Doc]]:
        """Each route's earliest schedule."""
        return ((found, group[0]) for found, group in self._groups.items())

    def due_heads(self, now: datetime) -> Iterator[tuple[Route, Doc]]:
        """Each route's earliest schedule, of the routes with any due by ``now``."""
        return (
            (found, group[0])
            for found, group in self._groups.items()
            if self._dues[found][0] <= now
        )

    def due(self, now: datetime, held: frozenset[Route] = frozenset()) -> list[Doc]:
        """What is due by ``now``, but of the ``held`` routes (by route)."""
        return [
            doc
            for found, group in self._groups.items()
            if found not in held
            for doc in group[: bisect_right(self._dues[found], now)]
        ]

    def unheld(self, held: frozenset[Route]) -> list[Doc]:
        """Every schedule but of the ``held`` routes."""
        return [doc for found, group in self._groups.items() if found not in held for doc in group]

    def earliest(self, held: frozenset[Route] = frozenset()) -> datetime | None:
        """The earliest due time but of the ``held`` routes."""
        return min(
            (dues[0] for found, dues in self._dues.items() if found not in held), default=None
        )

    def in_hand(self, now: datetime, held: frozenset[Route]) -> bool:
        """Whether a Kafka record is due by ``now`` and not held back: work
        the poller takes whole. HTTP calls go a host's bound at a time, so
        a view whose work in hand is calls may keep some a while, and is
        refreshed meanwhile as if held back (after its bound), or a record
        due behind them would wait for them."""
        dues = self._dues.get(KAFKA)
        return dues is not None and dues[0] <= now and KAFKA not in held

    def calls_due(self, now: datetime) -> bool:
        return any(found[1] is not None and dues[0] <= now for found, dues in self._dues.items())

    def due_lanes(self, now: datetime) -> frozenset[Lane]:
        return frozenset(found[0] for found, dues in self._dues.items() if dues[0] <= now)

    def due_calls_by_host(self, now: datetime) -> Counter[Lane]:
        counts: Counter[Lane] = Counter()
        for found, dues in self._dues.items():
            if found[1] is not None:
                counts[found[0]] += bisect_right(dues, now)
        return counts

    def all_due_of(self, lanes: frozenset[Lane], now: datetime) -> bool:
        """Whether every schedule is due by ``now`` and of ``lanes``."""
        return all(found[0] in lanes and dues[-1] <= now for found, dues in self._dues.items())


def held_routes(views: Iterable[Routes], held: Callable[[Doc], bool] | None) -> frozenset[Route]:
    """The routes ``held`` holds back, asked once per route (of one of its
    schedules): what it says of one it must say of every schedule of that
    route, due or not."""
    if held is None:
        return frozenset()
    heads: dict[Route, Doc] = {}
    for routes in views:
        for found, doc in routes.heads():
            heads.setdefault(found, doc)
    return frozenset(found for found, doc in heads.items() if held(doc))
