"""The ``tenants`` and ``api_keys`` collections (``node/tenants/model.py``
says what a tenant and a key are)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from node.errors import TenantError
from node.store.boundary import store_call
from node.tenants.model import KEY_HINT_LENGTH, Tenant, key_digest, new_key, validate_name


class TenantStore:
    """The ``tenants`` and ``api_keys`` collections."""

    def __init__(self, database: AsyncDatabase[dict[str, Any]]) -> None:
        self.tenants = database["tenants"]
        self.keys = database["api_keys"]

    @store_call
    async def prepare(self) -> None:
        await self.keys.create_index([("tenant", ASCENDING)], name="by_tenant")

    @store_call
    async def add(self, tenant: Tenant, now: datetime) -> str:
        """Create a tenant and its first key; returns the key (shown once)."""
        validate_name(tenant.name)
        try:
            await self.tenants.insert_one(tenant.to_document(now))
        except DuplicateKeyError:
            raise TenantError(f"tenant {tenant.name!r} exists") from None
        return await self.add_key(tenant.name, now)

    @store_call
    async def add_key(self, name: str, now: datetime) -> str:
        """Another key for a tenant (rotation: add, roll out, revoke the old)."""
        if await self.get(name) is None:
            raise TenantError(f"no tenant {name!r}")
        key = new_key()
        await self.keys.insert_one(
            {
                "_id": key_digest(key),
                "tenant": name,
                "hint": key[:KEY_HINT_LENGTH],
                "createdAt": now,
            }
        )
        return key

    @store_call
    async def revoke_key(self, hint: str) -> int:
        """Revoke the keys starting with ``hint`` (as ``list`` shows them)."""
        if len(hint) < KEY_HINT_LENGTH:
            raise TenantError(f"give at least the first {KEY_HINT_LENGTH} characters of the key")
        matches = await self.keys.find({"hint": hint[:KEY_HINT_LENGTH]}).to_list()
        if len(hint) > KEY_HINT_LENGTH:
            matches = [m for m in matches if m["_id"] == key_digest(hint)] or matches
        if len(matches) > 1:
            raise TenantError(f"{len(matches)} keys start with {hint!r}: give the whole key")
        if not matches:
            return 0
        result = await self.keys.delete_one({"_id": matches[0]["_id"]})
        return result.deleted_count

    @store_call
    async def update(self, name: str, **changes: Any) -> Tenant:
        tenant = await self.get(name)
        if tenant is None:
            raise TenantError(f"no tenant {name!r}")
        updated = replace(tenant, **changes)
        await self.tenants.update_one({"_id": name}, {"$set": updated.settings_document()})
        return updated

    @store_call
    async def remove(self, name: str) -> bool:
        """Delete a tenant and its keys; its schedules stay and still fire."""
        await self.keys.delete_many({"tenant": name})
        result = await self.tenants.delete_one({"_id": name})
        return result.deleted_count == 1

    @store_call
    async def get(self, name: str) -> Tenant | None:
        doc = await self.tenants.find_one({"_id": name})
        return None if doc is None else Tenant.from_document(doc)

    @store_call
    async def all(self) -> list[tuple[Tenant, list[str]]]:
        """Every tenant with the hints of its keys."""
        tenants = await self.tenants.find().sort("_id", ASCENDING).to_list()
        hints: dict[str, list[str]] = {}
        for key in await self.keys.find({}, {"tenant": 1, "hint": 1}).to_list():
            hints.setdefault(key["tenant"], []).append(key["hint"])
        return [(Tenant.from_document(t), sorted(hints.get(t["_id"], []))) for t in tenants]

    @store_call
    async def names(self) -> list[str]:
        return [str(doc["_id"]) for doc in await self.tenants.find({}, {"_id": 1}).to_list()]

    @store_call
    async def tenant_for_key(self, key: str) -> Tenant | None:
        found = await self.keys.find_one({"_id": key_digest(key)})
        if found is None:
            return None
        return await self.get(found["tenant"])
