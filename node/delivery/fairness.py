"""Fair selection of due work across tenants (the poller's selection policy,
applied once per round).

Due work is served oldest first, which is fair between schedules but not
between tenants: one tenant's burst of 50,000 due at once would hold every
other tenant's schedules behind it until it drained. So a round's batch is
filled round-robin over the tenants with due work, each tenant's oldest
first: a tenant with a few due schedules gets them into the very next batch
whatever another tenant's backlog, and a tenant alone gets the whole batch.

When a backlog fills a bucket's view, tenants absent from what was read are
asked for their own due work, a window of them per round (``next_window``):
each round's window starts where the last one ended, so with more tenants
than one window holds, every tenant is asked within a few rounds.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from itertools import chain, zip_longest
from typing import Any

from node.schedule.model import priority_of
from node.schedule.times import aware


def fair_order(docs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``docs`` in the order a fair round takes them: one from each tenant in
    turn (tenants in the order of their first schedule), each tenant's
    highest priority first, then oldest first."""
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for doc in sorted(docs, key=by_turn):
        by_tenant.setdefault(str(doc.get("tenant")), []).append(doc)
    turns = chain.from_iterable(zip_longest(*by_tenant.values()))
    return [doc for doc in turns if doc is not None]


def fair_share(docs: Sequence[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` of ``docs``, taken in turn from each tenant; returned
    oldest first, as the poller delivers them."""
    if len(docs) <= limit:
        return sorted(docs, key=by_due)
    return sorted(fair_order(docs)[:limit], key=by_due)


def by_due(doc: dict[str, Any]) -> datetime:
    return aware(doc["dueAt"])


def by_turn(doc: dict[str, Any]) -> tuple[int, datetime]:
    """Which goes first within a tenant: the higher priority, then the older."""
    return -priority_of(doc), aware(doc["dueAt"])


def next_window(
    names: Sequence[str], start: int, present: Collection[str], size: int
) -> tuple[list[str], int]:
    """The next ``size`` tenants of ``names`` (in a fixed order) not in
    ``present``, from position ``start`` around, and where the window after
    this one starts: past the last tenant taken (so the next round asks
    the ones after it, not nearly the same ones again)."""
    chosen: list[str] = []
    if not names:
        return chosen, 0
    start %= len(names)
    after = start
    for offset in range(len(names)):
        position = (start + offset) % len(names)
        if names[position] not in present:
            chosen.append(names[position])
            after = (position + 1) % len(names)
            if len(chosen) == size:
                break
    return chosen, after
