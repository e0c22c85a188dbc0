"""What a listing or a bulk cancel asks of ``schedules``: its filter, its
order, and the one index that serves it (``documents.INDEXES``).

Each filter is served by an index whose leading fields it fixes by equality
(the tenant, then a label, a key, a topic or a status), so the store reads
one range of that index and nothing outside it; the other conditions are
applied within that range. The index is named (``hint``): the planner of a
real MongoDB would likely pick it anyway, the hint makes the cost a
property of the code rather than of the planner's guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from node.schedule.model import storage_id

ASCENDING = 1
# After every character an id may hold ([A-Za-z0-9._:-]): the end of the
# range of ids starting with a prefix.
_PAST_ID_CHARACTERS = "\x7f"


def destination_filter(
    topic: str | None, host: str | None, destination: str | None
) -> dict[str, Any]:
    """Where the schedules go: a topic, an http target's host, a kind
    (``kafka`` or ``http``)."""
    query: dict[str, Any] = {}
    if topic is not None:
        query["topic"] = topic
    if host is not None:
        query["http.host"] = host
    if destination is not None:
        query["http" if destination == "http" else "topic"] = {"$exists": True}
    return query


@dataclass(frozen=True, kw_only=True)
class Cursor:
    """Where a page ended: the last id, and its dueAt for due-ordered pages."""

    after: str
    due: datetime | None = None


@dataclass(frozen=True)
class Page:
    """A page of a listing, and whether more schedules follow it."""

    docs: list[dict[str, Any]]
    more: bool


@dataclass(frozen=True, kw_only=True)
class Listing:
    tenant: str | None  # None: every tenant (an operator's listing, auth off)
    limit: int
    status: str | None = None
    labels: tuple[str, ...] = ()  # "name=value" pairs, all must match
    topic: str | None = None
    host: str | None = None  # an http target's host
    # "kafka" or "http": applied within the range the other filters read
    # (no index of its own: the host's is partial, the topic's has no order
    # of destinations), so it is for narrowing, not for finding.
    destination: str | None = None
    key: str | None = None
    due_after: datetime | None = None  # dueAt >= due_after
    due_before: datetime | None = None  # dueAt < due_before
    after: Cursor | None = None

    @property
    def by_due(self) -> bool:
        """Ordered by due time: a listing by status or due window alone."""
        return not (self.labels or self.key or self.topic or self.host) and (
            self.status is not None or self.due_after is not None or self.due_before is not None
        )

    @property
    def by_status(self) -> bool:
        """A tenant's listing by status (and perhaps a due window) alone."""
        return self.by_due and self.tenant is not None and self.status is not None

    @property
    def index(self) -> str | None:
        """The index the page is read from (None: no tenant to bound it by)."""
        if self.tenant is None:
            return None
        if self.labels:
            return "by_tenant_label"
        if self.key is not None:
            return "by_tenant_key"
        if self.topic is not None:
            return "by_tenant_topic"
        if self.host is not None:
            return "by_tenant_host"
        if self.by_due:
            return "by_tenant_due"
        return "by_tenant_id"

    @property
    def count_index(self) -> str | None:
        """The index the counts per status are read from: a label's, a key's
        or a topic's range, else the one whose prefix is (tenant, status)."""
        if self.index in (
            None,
            "by_tenant_label",
            "by_tenant_key",
            "by_tenant_topic",
            "by_tenant_host",
        ):
            return self.index
        return "tenant_status_bucket_due"

    def order(self) -> list[tuple[str, int]]:
        if self.by_due:
            return [("dueAt", ASCENDING), ("_id", ASCENDING)]
        return [("_id", ASCENDING)]

    def _destination_filter(self) -> dict[str, Any]:
        return destination_filter(self.topic, self.host, self.destination)

    def filter(self, *, status: str | None = None, paged: bool = True) -> dict[str, Any]:
        """The page's filter; ``status`` replaces the listing's own (counts),
        and ``paged`` False leaves the cursor out."""
        status = status if status is not None else self.status
        query: dict[str, Any] = {}
        if self.tenant is not None:
            query["tenant"] = self.tenant
        if self.labels:
            query["labels"] = (
                self.labels[0] if len(self.labels) == 1 else {"$all": list(self.labels)}
            )
        query.update(self._destination_filter())
        if self.key is not None:
            query["key"] = self.key
        if status is not None:
            query["status"] = status
        due: dict[str, Any] = {}
        if self.due_after is not None:
            due["$gte"] = self.due_after
        if self.due_before is not None:
            due["$lt"] = self.due_before
        if due:
            query["dueAt"] = due
        if paged and self.after is not None:
            if self.by_due and self.after.due is not None:
                query["$or"] = [
                    {"dueAt": {"$gt": self.after.due}},
                    {"dueAt": self.after.due, "_id": {"$gt": self.after.after}},
                ]
            else:
                query["_id"] = {"$gt": self.after.after}
        return query


@dataclass(frozen=True, kw_only=True)
class Selector:
    """What a bulk verb matches (``:cancel``, ``:pause``, ``:resume``,
    ``:retry``): labels (all), a key, an id prefix, a topic or an http
    target's host, at least one of them (each an index's range); then,
    within it, a due bound, a destination kind and statuses (the verb's
    own, narrowed)."""

    labels: tuple[str, ...] = ()
    key: str | None = None
    id_prefix: str | None = None
    topic: str | None = None
    host: str | None = None
    due_before: datetime | None = None
    destination: str | None = None  # "kafka" or "http": narrowing only
    statuses: tuple[str, ...] = ()  # empty: the verb's own

    def __post_init__(self) -> None:
        # A selector of nothing would match, and change, the whole tenant.
        if not self.finds:
            raise ValueError("a selector needs labels, a key, an id prefix, a topic or a host")

    @property
    def finds(self) -> bool:
        """Whether it names a range to read (not the whole tenant)."""
        return bool(self.labels or self.key or self.id_prefix or self.topic or self.host)

    @property
    def index(self) -> str:
        if self.labels:
            return "by_tenant_label"
        if self.key is not None:
            return "by_tenant_key"
        if self.topic is not None:
            return "by_tenant_topic"
        if self.host is not None and self.id_prefix is None:
            return "by_tenant_host"
        return "by_tenant_id"

    def filter(self, tenant: str, statuses: Sequence[str]) -> dict[str, Any]:
        """The tenant's schedules it matches at one of ``statuses`` (the
        verb's); the selector's own statuses narrow them."""
        query: dict[str, Any] = {"tenant": tenant}
        if self.labels:
            query["labels"] = {"$all": list(self.labels)}
        if self.key is not None:
            query["key"] = self.key
        if self.id_prefix is not None:
            first = storage_id(tenant, self.id_prefix)
            query["_id"] = {"$gte": first, "$lt": first + _PAST_ID_CHARACTERS}
        query.update(destination_filter(self.topic, self.host, self.destination))
        if self.due_before is not None:
            query["dueAt"] = {"$lt": self.due_before}
        wanted = [s for s in statuses if not self.statuses or s in self.statuses]
        query["status"] = wanted[0] if len(wanted) == 1 else {"$in": wanted}
        return query
