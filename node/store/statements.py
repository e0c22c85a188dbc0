"""Every condition and every change the store applies to a schedule, written
once, as data: MongoDB filters and updates (``contract.py`` says what each
method means).

The Mongo store (``schedules.py``) sends these to the server; the memory
store (``memory.py``) applies the very same ones to its documents
(``emulation.py``). So what a claim takes, what a completion writes, what a
cancel or a verb may change, and what a recovery counts as left behind are
decided here and nowhere else.

Pure: no IO and no driver call, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from node.errors import InvalidState, NotCancellable, ScheduleInFlight, VersionMismatch
from node.schedule.changes import BulkVerb, Change, version_of
from node.schedule.model import CHANGEABLE, FINAL, RECENT_OCCURRENCES, Status, public_id
from node.schedule.payload import INLINE, LARGE
from node.schedule.times import aware
from node.store.contract import Claimed, Completion, Outcome
from node.store.documents import bucket_of, version_filter

# PENDING and PAUSED: what a cancel (one or many) and the quota count.
LIVE = sorted(s.value for s in CHANGEABLE)
# The projections of the reads that hold many schedules at once
# (``node/schedule/payload.py``): the owner's due reads leave the large
# payloads behind, listings every payload unless asked.
WITHOUT_LARGE_PAYLOAD = {LARGE: 0}
WITHOUT_PAYLOADS = {LARGE: 0, INLINE: 0}
ONLY_LARGE_PAYLOAD = {LARGE: 1}


def large_payloads_of(docs: Iterable[Mapping[str, Any]]) -> dict[str, bytes]:
    """Schedule id -> its large payload, of the documents that hold one."""
    return {str(doc["_id"]): bytes(doc[LARGE]) for doc in docs if LARGE in doc}


# -- which schedules -----------------------------------------------------------


def one(schedule_id: str, bucket_count: int) -> dict[str, Any]:
    """The filter of one schedule: its id and its bucket."""
    return {"_id": schedule_id, "bucket": bucket_of(schedule_id, bucket_count)}


def ids_and_buckets(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The filter of several schedules: their ids, then their buckets (so a
    sharded cluster asks only the shards that hold them)."""
    return {
        "_id": {"$in": [d["_id"] for d in docs]},
        "bucket": {"$in": sorted({int(d["bucket"]) for d in docs})},
    }


def fence(operator: str, token: int, *, unfenced: bool = False) -> dict[str, Any]:
    """The token condition of an owner write: ``$lte`` to claim (no newer
    token wrote it), ``$eq`` to complete (ours still holds it). Unfenced
    (CHAOS_MODE=unfenced, chaos testing only): none."""
    return {} if unfenced else {"token": {operator: token}}


def due(bucket: int, until: datetime, after: datetime | None = None) -> dict[str, Any]:
    """``bucket``'s PENDING schedules due by ``until`` (and after ``after``)."""
    window: dict[str, Any] = {"$lte": until}
    if after is not None:
        window["$gt"] = after
    return {"bucket": bucket, "status": Status.PENDING.value, "dueAt": window}


def due_after(bucket: int, after: datetime, until: datetime | None = None) -> dict[str, Any]:
    """``bucket``'s PENDING schedules due after ``after`` (and by ``until``)."""
    window: dict[str, Any] = {"$gt": after}
    if until is not None:
        window["$lte"] = until
    return {"bucket": bucket, "status": Status.PENDING.value, "dueAt": window}


def due_past(
    buckets: Iterable[int], until: datetime, skipping: Collection[str | None]
) -> dict[str, Any]:
    """``buckets``' PENDING schedules due by ``until``, but those of the
    lanes ``skipping`` (HTTP hosts; None: Kafka schedules, which have no
    ``http.host``)."""
    # In a fixed order: the same lanes make the same statement.
    lanes = sorted(skipping, key=lambda h: (h is not None, h or ""))
    chosen = sorted(buckets)
    return {
        "bucket": chosen[0] if len(chosen) == 1 else {"$in": chosen},
        "status": Status.PENDING.value,
        "http.host": {"$nin": lanes},
        "dueAt": {"$lte": until},
    }


def pending_of(tenant: str, buckets: Iterable[int]) -> dict[str, Any]:
    """A tenant's PENDING schedules in ``buckets`` (due or not: the caller
    reads them in due order and bounds the time itself)."""
    return {"tenant": tenant, "status": Status.PENDING.value, "bucket": {"$in": sorted(buckets)}}


def live_of(tenant: str) -> dict[str, Any]:
    """A tenant's live schedules (PENDING or PAUSED): its quota's count."""
    return {"tenant": tenant, "status": {"$in": LIVE}}


def in_flight(bucket: int) -> dict[str, Any]:
    """``bucket``'s IN_FLIGHT schedules: what a recovery looks through."""
    return {"bucket": bucket, "status": Status.IN_FLIGHT.value}


# -- the bucket owner's writes ---------------------------------------------------


def claimable(
    docs: Sequence[dict[str, Any]], version: int, token: int, now: datetime, *, unfenced: bool
) -> dict[str, Any]:
    """What a claim under ``token`` takes of ``docs`` (all read at
    ``version``): still PENDING, due by ``now``, unchanged since read, and
    written by no newer token."""
    return {
        **ids_and_buckets(docs),
        "status": Status.PENDING.value,
        "dueAt": {"$lte": now},
        "version": version_filter(version),
        **fence("$lte", token, unfenced=unfenced),
    }


def claim_update(token: int, owner: str, now: datetime) -> dict[str, Any]:
    return {
        "$set": {
            "status": Status.IN_FLIGHT.value,
            "token": token,
            "owner": owner,
            "claimedAt": now,
        },
        # attempts: of this occurrence; runs: of the schedule's whole life
        # (its history records are numbered by it).
        "$inc": {"attempts": 1, "runs": 1, "version": 1},
    }


def held_by(docs: Sequence[dict[str, Any]], token: int, *, unfenced: bool) -> dict[str, Any]:
    """Those of ``docs`` that ``token`` still holds IN_FLIGHT: the condition
    of every write that completes or puts back a claim."""
    return {
        **ids_and_buckets(docs),
        "status": Status.IN_FLIGHT.value,
        **fence("$eq", token, unfenced=unfenced),
    }


def owned(item: Claimed, *, unfenced: bool) -> dict[str, Any]:
    """The filter of a write completing one claimed schedule."""
    return {
        "_id": item.id,
        "bucket": item.bucket,
        "status": Status.IN_FLIGHT.value,
        **fence("$eq", item.token, unfenced=unfenced),
    }


# The put-back of a claim never published: undoes the claim's counters.
UNCLAIM = {
    "$set": {"status": Status.PENDING.value},
    "$inc": {"attempts": -1, "runs": -1, "version": 1},
}


def completion_update(completion: Completion, retention: timedelta) -> dict[str, Any]:
    """The update that records a completion (its decisions are already
    made, ``node/delivery/outcomes.py``). A schedule that ends here gets its
    ``expireAt``."""
    if completion.outcome == Outcome.DEFERRED:
        # The same occurrence (a trigger's too), due when the destination
        # said, the claim's attempt given back (runs stays: the history
        # keeps the wait as a run of its own).
        return {
            "$set": {
                "status": Status.PENDING.value,
                "dueAt": completion.due_at,
                "lastError": completion.error,
            },
            "$inc": {"attempts": -1, "version": 1},
        }
    occurrence = completion.occurrence
    fields: dict[str, Any] = {}
    if occurrence is not None:
        fields["lastError"] = completion.error
        fields["lateStreak"] = occurrence.late_streak
    fields["status"] = completion.status.value
    if completion.outcome == Outcome.DELIVERED:
        fields["deliveredAt"] = completion.at
    if completion.status in FINAL:
        fields["expireAt"] = completion.at + retention
    if completion.extra:
        # An extra occurrence (a trigger) is over: the chain goes on where
        # it was, due at its own next occurrence.
        fields.update(dueAt=completion.due_at, attempts=0, lastError=completion.error)
        return {
            "$set": fields,
            "$unset": {"triggeredAt": ""},
            "$inc": {"version": 1},
            "$push": {"recent": {"$each": [_record(completion)], "$slice": -RECENT_OCCURRENCES}},
        }
    if occurrence is None:
        if completion.due_at is not None:
            fields["dueAt"] = completion.due_at
        fields["lastError"] = completion.error
        if completion.status == Status.EXPIRED:
            fields["expiredAt"] = completion.at
        return {"$set": fields, "$inc": {"version": 1}}
    # A recurring schedule: the record of this occurrence and the next one
    # (or the chain's end) in one write, so a crash can neither lose the
    # chain nor run an occurrence twice on purpose (only the at-least-once
    # repeat of an unmarked publish).
    if occurrence.next_at is not None:
        fields.update(executeAt=occurrence.next_at, dueAt=occurrence.next_at, attempts=0)
    return {
        "$set": fields,
        "$inc": {"occurrences": 1, "skippedOccurrences": occurrence.skipped, "version": 1},
        "$push": {"recent": {"$each": [_record(completion)], "$slice": -RECENT_OCCURRENCES}},
    }


def _record(completion: Completion) -> dict[str, Any]:
    """An occurrence as a recurring schedule's ``recent`` keeps it."""
    claimed = completion.claimed
    return {
        "executeAt": claimed.execute_at,
        "outcome": completion.outcome.value,
        "at": completion.at,
        "attempts": claimed.attempt,
        "token": claimed.token,
        "error": completion.error,
    }


def left_behind(doc: dict[str, Any], token: int, stranded_before: datetime | None) -> bool:
    """An IN_FLIGHT schedule no round of the holder of ``token`` is working:
    claimed under an older token, or under this one before ``stranded_before``."""
    held = int(doc.get("token", 0))
    if held < token:
        return True
    claimed_at = doc.get("claimedAt")
    return (
        held == token
        and stranded_before is not None
        and claimed_at is not None
        and aware(claimed_at) < stranded_before
    )


def still_left(doc: dict[str, Any]) -> dict[str, Any]:
    """The condition of a recovery's write: still IN_FLIGHT as it was read,
    under the same token and not claimed again meanwhile (a claim sets
    ``claimedAt``)."""
    return {
        "_id": doc["_id"],
        "bucket": doc["bucket"],
        "status": Status.IN_FLIGHT.value,
        "token": doc.get("token", 0),
        "claimedAt": doc.get("claimedAt"),
    }


def recovered(token: int) -> dict[str, Any]:
    # recovered: an attempt of it was in flight when its round ended
    # unfinished, and may have been published.
    return {
        "$set": {"status": Status.PENDING.value, "token": token, "recovered": True},
        "$inc": {"version": 1},
    }


# -- the API's writes --------------------------------------------------------------


def cancellable(schedule_id: str, bucket_count: int, if_match: int | None) -> dict[str, Any]:
    """A cancel's condition: PENDING or PAUSED (and at ``if_match``, given)."""
    condition: dict[str, Any] = {**one(schedule_id, bucket_count), "status": {"$in": LIVE}}
    if if_match is not None:
        condition["version"] = version_filter(if_match)
    return condition


def cancelled(now: datetime, retention: timedelta) -> dict[str, Any]:
    return {
        "$set": {
            "status": Status.CANCELLED.value,
            "cancelledAt": now,
            "expireAt": now + retention,
        },
        "$inc": {"version": 1},
    }


def check_cancel(doc: dict[str, Any], if_match: int | None) -> None:
    """A cancel that wrote nothing: fine if already CANCELLED (at the
    version asked, if any); otherwise say why not."""
    check_version(doc, if_match)
    if doc["status"] == Status.CANCELLED.value:
        return
    shown = public_id(str(doc["_id"]))
    if doc.get("recurrence") and doc["status"] == Status.IN_FLIGHT.value:
        raise NotCancellable(
            f"an occurrence of {shown!r} is being delivered; "
            "cancel again in a moment to end the chain",
            retry_after=1,
        )
    raise NotCancellable(f"schedule {shown!r} is {doc['status']} and can no longer be cancelled")


def check_version(doc: dict[str, Any], if_match: int | None) -> None:
    """Refuse a conditional call (If-Match) on a schedule at another version."""
    if if_match is not None and version_of(doc) != if_match:
        raise VersionMismatch(
            f"schedule {public_id(str(doc['_id']))!r} is at version {version_of(doc)}, "
            f"not {if_match}"
        )


def unchanged(doc: dict[str, Any], bucket_count: int) -> dict[str, Any]:
    """A verb's condition: the schedule still at the status and version read."""
    return {
        **one(str(doc["_id"]), bucket_count),
        "status": doc["status"],
        "version": version_filter(version_of(doc)),
    }


def change_update(change: Change, now: datetime, retention: timedelta) -> dict[str, Any]:
    """The write of a verb's change; one to a final status gets ``expireAt``."""
    sets = dict(change.set)
    if change.status in FINAL:
        sets["expireAt"] = now + retention
    update: dict[str, Any] = {"$set": sets, "$inc": {"version": 1}}
    if change.unset:
        update["$unset"] = {name: "" for name in sorted(change.unset)}
    return update


def bulk_changes(
    found: Iterable[dict[str, Any]],
    verb: BulkVerb,
    now: datetime,
    bucket_count: int,
    retention: timedelta,
    due: dict[int, datetime],
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """A bulk verb's writes for the matches ``found`` (as read: ``BULK_FIELDS``):
    (condition, update) for each, under the status and version read; ``due``
    is brought down to the earliest due time, by bucket, of those it makes
    PENDING (the owners to wake). A match the verb refuses as stored (it
    moved since the read) is left alone."""
    writes: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for doc in found:
        try:
            change = verb.decide(doc, now)
        except (InvalidState, ScheduleInFlight):
            continue
        if change is None:
            continue
        writes.append((unchanged(doc, bucket_count), change_update(change, now, retention)))
        if change.due_at is not None:
            bucket = int(doc["bucket"])
            due[bucket] = min(due.get(bucket, change.due_at), change.due_at)
    return writes


def bulk_left(verb: BulkVerb, stopped: bool) -> list[str]:
    """The statuses in which a match left means the verb has more to do:
    its own, when it ``stopped`` at its limit (BULK_LIMIT); the unsettled
    ones (in flight) always."""
    return [*verb.statuses, *verb.unsettled] if stopped else [*verb.unsettled]


# -- leases ----------------------------------------------------------------------


def lease_takeable(
    lease: dict[str, Any], node_id: str, live_holders: Collection[str], now: datetime
) -> bool:
    """A lease ``node_id`` may take at the store's ``now``: free, already its
    own (a restart under the same node id), or held under a session that has
    ended (its holder document expired by the store's clock, or gone). An
    ended session never renews again (``holder_alive``), so a lease found
    takeable this way stays so until someone takes it. A lease written
    before sessions (no ``holder``: format 1, a node of an earlier release)
    lasts to its own ``expiresAt``, as it did then. (The Mongo store asks
    the same of the documents: ``leases.LeaseStore``.)"""
    owner = lease.get("owner")
    if owner is None or owner == node_id:
        return True
    if "holder" in lease:
        return lease["holder"] not in live_holders
    expires_at = lease.get("expiresAt")
    # No expiry at all counts as expired, as null sorts first on the server.
    return expires_at is None or expires_at < now


def holder_alive(holder: dict[str, Any], now: datetime) -> bool:
    """A lease holder's session is alive until its ``expiresAt`` by the
    store's clock; past it, the session has ended for good."""
    expires_at = holder.get("expiresAt")
    return expires_at is not None and expires_at > now
