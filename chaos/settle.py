"""After the run: each call whose outcome the load does not know becomes
``ok`` or ``fail`` by reading its schedule back (``views``), and each bulk
cancel learns which schedules it took.

Pure (``needs_views`` and ``settle``) around one IO step (``read_views``):
a schedule no node can show stays as it was, and the checker counts it
unsettled (a PATCH's then counts as either time).

The rules, by the schedule's status (and executeAt) in its view:

* a DELETE with no answer or a 5xx: CANCELLED is ``ok``, like a 200;
  anything else ``fail``;
* a pause with no answer or a 5xx: PAUSED is ``ok`` (paused from when the
  load gave up on the answer, and never resumed); anything else ``fail``;
* a resume that got no 200 (no answer, a 5xx, or a refusal: a bulk cancel
  may have taken the schedule while it was paused): still PAUSED is
  ``fail`` (paused for good); CANCELLED is ``fail`` too, but its pause
  ended when the resume was sent; anything else ``ok``, resumed when the
  load gave up on the answer;
* a PATCH with no answer or a 5xx: the view has its executeAt, ``ok``; the
  time it had before, ``fail``; neither (no node should show that), it
  stays ``info`` marked ``neither``: either time may go out;
* a bulk cancel: the CANCELLED members of its label group that no DELETE
  cancelled were taken by it, noted (``took``) on the group's last answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import aiohttp

from chaos import history as ops
from chaos.history import Call, History, Op
from chaos.lab.harness import epoch

# executeAt values are whole milliseconds: two this close are one time.
SAME_TIME = 0.0005

Views = Mapping[str, Mapping[str, Any]]


def needs_views(history: History) -> set[str]:
    """The schedules whose views settle something: every unknown call's, and
    the members of each group a bulk verb was sent to, but those a DELETE
    took aside."""
    unknown = {
        call.schedule
        for call in history.calls(ops.CANCEL, ops.PAUSE, ops.PATCH, ops.RESUME)
        if call.unknown
    }
    return (
        unknown
        | set(_bulk_members(history, ops.BULK_CANCEL))
        | set(_bulk_members(history, ops.BULK_PAUSE, settled=False))
    )


# What a bulk verb leaves a schedule it took.
_TAKEN_TO = {ops.BULK_CANCEL: "CANCELLED", ops.BULK_PAUSE: "PAUSED"}


def _bulk_members(history: History, verb: str, *, settled: bool = True) -> dict[str, str]:
    """Schedule -> its label group, for the groups ``verb`` was sent to:
    those a DELETE took aside, and (a bulk pause's, once the history is
    ``settled``) those paused on their own and not resumed, which may be
    PAUSED at the end by their own pause, not the bulk one."""
    groups = {call["group"] for call in history.calls(verb)}
    aside = history.took(ops.CANCEL)
    if verb == ops.BULK_PAUSE and settled:
        aside |= history.took(ops.PAUSE) - history.took(ops.RESUME)
    return {
        call.schedule: call["group"]
        for call in history.calls(ops.CREATE)
        if call.type == ops.OK and call.get("group") in groups and call.schedule not in aside
    }


def settle(history: History, views: Views) -> History:
    """The history with every call the views settle replaced by its outcome."""
    replaced: dict[int, Op] = {}
    before = _times_before(history)
    for call in history.calls(ops.CANCEL, ops.PAUSE, ops.RESUME, ops.PATCH):
        view = views.get(call.schedule)
        if view is None or call.done is None or "settled" in call.done.value:
            continue
        outcome = _outcome(call, view, before.get(call.invoke.index))
        if outcome is not None:
            type_, extra = outcome
            replaced[call.done.index] = _settled(call.done, type_, view, extra)
    settled = history.replaced(replaced)
    return settled.replaced(_bulk_takings(settled, views))


def _outcome(
    call: Call, view: Mapping[str, Any], before: float | None
) -> tuple[str, dict[str, Any]] | None:
    """A call's settled type, or None where the view settles nothing."""
    status = view.get("status")
    if call.f == ops.RESUME:
        if call.type == ops.OK:
            return None
        return (ops.FAIL if status in ("PAUSED", "CANCELLED") else ops.OK), {}
    if call.type != ops.INFO:
        return None
    if call.f == ops.CANCEL:
        return (ops.OK if status == "CANCELLED" else ops.FAIL), {}
    if call.f == ops.PAUSE:
        return (ops.OK if status == "PAUSED" else ops.FAIL), {}
    return _patch_outcome(call, epoch(str(view.get("executeAt"))), before)


def _patch_outcome(
    call: Call, execute_at: float | None, before: float | None
) -> tuple[str, dict[str, Any]]:
    if execute_at is not None and abs(execute_at - call["executeAt"]) <= SAME_TIME:
        return ops.OK, {}
    if execute_at is not None and before is not None and abs(execute_at - before) <= SAME_TIME:
        return ops.FAIL, {}
    return ops.INFO, {"neither": True}  # either may go out


def _settled(done: Op, type_: str, view: Mapping[str, Any], extra: dict[str, Any]) -> Op:
    return replace(done, type=type_, value={**done.value, "settled": view.get("status"), **extra})


def _times_before(history: History) -> dict[int, float]:
    """For each ops.PATCH (its invoke's index), the executeAt its schedule had
    when it was sent: the create's, or the last PATCH's that took."""
    current: dict[str, float] = {}
    before: dict[int, float] = {}
    for call in history.calls(ops.CREATE, ops.PATCH):
        if call.f == ops.PATCH:
            if call.schedule in current:
                before[call.invoke.index] = current[call.schedule]
            if call.type != ops.OK:
                continue
        if call.type == ops.OK and call.get("executeAt") is not None:
            current[call.schedule] = call["executeAt"]
    return before


def _bulk_takings(history: History, views: Views) -> dict[int, Op]:
    """Each group's last bulk answer, with the members it took: those left
    CANCELLED by a bulk cancel, PAUSED by a bulk pause."""
    replaced: dict[int, Op] = {}
    for verb, status in _TAKEN_TO.items():
        last = {call["group"]: call for call in history.calls(verb)}
        took: dict[str, list[str]] = {group: [] for group in last}
        for schedule, group in _bulk_members(history, verb).items():
            if views.get(schedule, {}).get("status") == status:
                took[group].append(schedule)
        for group, call in last.items():
            if call.done is not None:
                value = {**call.done.value, "took": sorted(took[group])}
                replaced[call.done.index] = replace(call.done, value=value)
    return replaced


async def read_views(
    urls: Callable[[], Iterable[str]], ids: Iterable[str], headers: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """Each schedule's view from the first node (of ``urls()``, asked anew
    for each) that shows it."""
    found: dict[str, dict[str, Any]] = {}
    limit = asyncio.Semaphore(16)

    async def one(session: aiohttp.ClientSession, schedule_id: str) -> None:
        async with limit:
            for url in urls():
                try:
                    async with session.get(f"{url}/v1/schedules/{schedule_id}") as r:
                        body = await r.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError):  # down
                    continue
                if isinstance(body, dict) and "status" in body:
                    found[schedule_id] = body
                    return

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout, headers=dict(headers)) as session:
        await asyncio.gather(*(one(session, schedule_id) for schedule_id in sorted(ids)))
    return found
