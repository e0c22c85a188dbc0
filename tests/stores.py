"""The store under test, whichever it is: the ``store`` fixture of
``tests/conftest.py`` hands each store test a kit for the memory twin and
one for MongoDB (the embedded SecantusDB), so the same tests run over both
and the two cannot drift (APScheduler 4's ``raw_datastore`` fixture).

A kit gives the contract's four stores, and the few raw moves a test needs
to set a scene the contract has no call for (a document as an older version
stored it, a newer owner's write, a lease taken elsewhere).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from node.store.contract import AttemptHistory, BucketLeases, FlowGates, Schedules
from node.store.flow import SLOT_TERM, FlowStore
from node.store.history import HistoryStore
from node.store.leases import LeaseStore
from node.store.memory import (
    Documents,
    MemoryFlow,
    MemoryHistory,
    MemoryLeases,
    MemorySchedules,
)
from node.store.schedules import ScheduleStore


class VirtualClock:
    """An aware UTC clock that moves only when told (the memory store's)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class StoreKit:
    kind: str

    def schedules(self, bucket_count: int, *, unfenced: bool = False) -> Schedules:
        raise NotImplementedError

    def leases(self, node_id: str) -> BucketLeases:
        raise NotImplementedError

    def history(self, *, cap: int, retention: timedelta) -> AttemptHistory:
        raise NotImplementedError

    def flow(self, holder: str, term: float = SLOT_TERM) -> FlowGates:
        """One node's view of the flow-control counts."""
        raise NotImplementedError

    async def seed(self, docs: Sequence[dict[str, Any]]) -> None:
        """Store these schedule documents as they are."""
        raise NotImplementedError

    async def stored(self) -> dict[str, dict[str, Any]]:
        """Every schedule document, by id."""
        raise NotImplementedError

    async def overwrite(self, query: dict[str, Any], fields: dict[str, Any]) -> None:
        """Set ``fields`` on every schedule ``query`` matches (another
        writer's move: a newer owner's token, say)."""
        raise NotImplementedError

    async def lease_docs(self) -> dict[int, dict[str, Any]]:
        """Every lease document, by bucket."""
        raise NotImplementedError

    async def steal_lease(self, bucket: int, owner: str) -> None:
        """Another node takes ``bucket``: its owner, and a token one newer."""
        raise NotImplementedError

    async def pass_time(self, seconds: float) -> None:
        """Let the store's clock move on by ``seconds``."""
        raise NotImplementedError

    async def put_legacy_lease(self, bucket: int, owner: str, *, seconds: float) -> None:
        """A lease as a node before sessions wrote it: no holder, its own
        expiry ``seconds`` from the store's now."""
        raise NotImplementedError


class MemoryKit(StoreKit):
    kind = "memory"

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        # One set of documents, as one database holds them, whatever the view.
        self.documents = Documents()
        self._leases = MemoryLeases("", clock)
        self._records: dict[str, dict[str, Any]] = {}
        self._flow = MemoryFlow("", clock)

    def schedules(self, bucket_count: int, *, unfenced: bool = False) -> MemorySchedules:
        return MemorySchedules(
            bucket_count, self.clock, unfenced=unfenced, documents=self.documents
        )

    def leases(self, node_id: str) -> MemoryLeases:
        return self._leases.of(node_id)

    def history(self, *, cap: int, retention: timedelta) -> MemoryHistory:
        history = MemoryHistory(self.clock, cap=cap, retention=retention)
        history.records = self._records
        return history

    def flow(self, holder: str, term: float = SLOT_TERM) -> MemoryFlow:
        return self._flow.of(holder, term)

    async def seed(self, docs: Sequence[dict[str, Any]]) -> None:
        for doc in docs:
            self.documents.put(doc)

    async def stored(self) -> dict[str, dict[str, Any]]:
        return {d["_id"]: d for d in self.documents.find({})}

    async def overwrite(self, query: dict[str, Any], fields: dict[str, Any]) -> None:
        self.documents.update(query, {"$set": fields}, many=True)

    async def lease_docs(self) -> dict[int, dict[str, Any]]:
        return {b: dict(d) for b, d in self._leases.table.items()}

    async def steal_lease(self, bucket: int, owner: str) -> None:
        lease = self._leases.table[bucket]
        lease.update(owner=owner, token=lease["token"] + 1)

    async def pass_time(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def put_legacy_lease(self, bucket: int, owner: str, *, seconds: float) -> None:
        expires_at = self.clock() + timedelta(seconds=seconds)
        self._leases.table[bucket] = {
            "_id": bucket,
            "owner": owner,
            "token": 1,
            "expiresAt": expires_at,
        }


class MongoKit(StoreKit):
    kind = "secantus"

    def __init__(self, database: Any) -> None:
        self.database = database

    def schedules(self, bucket_count: int, *, unfenced: bool = False) -> ScheduleStore:
        return ScheduleStore(self.database, bucket_count, unfenced=unfenced)

    def leases(self, node_id: str) -> LeaseStore:
        # The embedded server's lease shapes, as a node sets them on finding
        # it (Node._prepare_store); the one-statement shape a real
        # MongoDB gets is tested on it too (tests/node/store/test_leases.py).
        return LeaseStore(self.database.buckets, node_id, chunked=True)

    def history(self, *, cap: int, retention: timedelta) -> HistoryStore:
        return HistoryStore(self.database.history, retention=retention, cap=cap)

    def flow(self, holder: str, term: float = SLOT_TERM) -> FlowStore:
        # The embedded server's shape, as a node sets it on finding it (the
        # upsert shape of a real MongoDB: tests/node/delivery/test_flow_control.py).
        store = FlowStore(self.database, holder, term)
        store.embedded = True
        return store

    async def seed(self, docs: Sequence[dict[str, Any]]) -> None:
        await self.database.schedules.insert_many([dict(d) for d in docs])

    async def stored(self) -> dict[str, dict[str, Any]]:
        return {d["_id"]: d for d in await self.database.schedules.find({}).to_list()}

    async def overwrite(self, query: dict[str, Any], fields: dict[str, Any]) -> None:
        await self.database.schedules.update_many(query, {"$set": fields})

    async def lease_docs(self) -> dict[int, dict[str, Any]]:
        return {d["_id"]: d for d in await self.database.buckets.find({}).to_list()}

    async def steal_lease(self, bucket: int, owner: str) -> None:
        await self.database.buckets.update_one(
            {"_id": bucket}, {"$set": {"owner": owner}, "$inc": {"token": 1}}
        )

    async def pass_time(self, seconds: float) -> None:
        # The server's clock is this host's: once this much real time has
        # passed, so has the server's (a wait with a certain end, not a guess).
        await asyncio.sleep(seconds)

    async def put_legacy_lease(self, bucket: int, owner: str, *, seconds: float) -> None:
        expires_at = datetime.now(UTC) + timedelta(seconds=seconds)
        await self.database.buckets.insert_one(
            {"_id": bucket, "owner": owner, "token": 1, "expiresAt": expires_at}
        )
