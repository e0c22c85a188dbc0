"""Tenants and their API keys: who may call, and within which limits.

A tenant is a document in ``tenants``; each of its API keys is a document in
``api_keys`` whose ``_id`` is the key's SHA-256 digest. The key itself is
shown once, when made, and never stored: a copy of the database grants no
access. A fast hash is enough because a key is 256 random bits: there is no
dictionary of likely keys to try, which is what slow password hashes defend
against.

Every node reads these through ``TenantDirectory``, a cache of a few
seconds, so authenticating a call costs no store round trip; a revoked key
or a changed quota takes effect within that time on every node.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from node.errors import SchedulerError

KEY_PREFIX = "sk_"
# The first characters of a key, kept to tell keys apart when listing or revoking.
KEY_HINT_LENGTH = len(KEY_PREFIX) + 6
TENANT_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
DEFAULT_TENANT = "default"
CACHE_SECONDS = 5.0
# Unknown keys are remembered too, briefly, so guessing keys costs the store nothing.
UNKNOWN_KEY_CACHE_SECONDS = 1.0


class TenantError(SchedulerError):
    """A tenant command cannot be carried out; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Tenant:
    """A tenant and its limits; ``None`` means no limit."""

    name: str
    admin: bool = False  # may call the operator routes (/v1/cluster, /v1/admin/)
    max_pending: int | None = None  # PENDING schedules at once
    rate: float | None = None  # schedules accepted per second, cluster-wide
    burst: int | None = None  # schedules accepted at once above the rate
    topic_prefixes: tuple[str, ...] = ()  # empty: any topic

    def allows_topic(self, topic: str) -> bool:
        return not self.topic_prefixes or topic.startswith(self.topic_prefixes)

    @property
    def burst_size(self) -> float:
        # A rate with no burst admits one second's worth at once.
        if self.burst is not None:
            return float(self.burst)
        return max(1.0, self.rate or 0.0)

    def settings_document(self) -> dict[str, Any]:
        """Everything but the name, as stored."""
        return {
            "admin": self.admin,
            "maxPending": self.max_pending,
            "rate": self.rate,
            "burst": self.burst,
            "topicPrefixes": list(self.topic_prefixes),
        }

    def to_document(self, now: datetime) -> dict[str, Any]:
        return {"_id": self.name, **self.settings_document(), "createdAt": now}

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> Tenant:
        return cls(
            name=str(doc["_id"]),
            admin=bool(doc.get("admin", False)),
            max_pending=doc.get("maxPending"),
            rate=doc.get("rate"),
            burst=doc.get("burst"),
            topic_prefixes=tuple(doc.get("topicPrefixes") or ()),
        )

    def to_view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "admin": self.admin,
            "maxPending": self.max_pending,
            "rate": self.rate,
            "burst": self.burst,
            "topicPrefixes": list(self.topic_prefixes),
        }


def unlimited(name: str) -> Tenant:
    """The policy of a tenant with no document: no quota, any topic."""
    return Tenant(name=name)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def validate_name(name: str) -> str:
    if not TENANT_NAME.match(name):
        raise TenantError(f"tenant name must be 1-64 characters of [A-Za-z0-9._-], got {name!r}")
    return name


class TenantStore:
    """The ``tenants`` and ``api_keys`` collections."""

    def __init__(self, database: AsyncDatabase[dict[str, Any]]) -> None:
        self.tenants = database["tenants"]
        self.keys = database["api_keys"]

    async def prepare(self) -> None:
        await self.keys.create_index([("tenant", ASCENDING)], name="by_tenant")

    async def add(self, tenant: Tenant, now: datetime) -> str:
        """Create a tenant and its first key; returns the key (shown once)."""
        validate_name(tenant.name)
        try:
            await self.tenants.insert_one(tenant.to_document(now))
        except DuplicateKeyError:
            raise TenantError(f"tenant {tenant.name!r} exists") from None
        return await self.add_key(tenant.name, now)

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

    async def update(self, name: str, **changes: Any) -> Tenant:
        tenant = await self.get(name)
        if tenant is None:
            raise TenantError(f"no tenant {name!r}")
        updated = replace(tenant, **changes)
        await self.tenants.update_one({"_id": name}, {"$set": updated.settings_document()})
        return updated

    async def remove(self, name: str) -> bool:
        """Delete a tenant and its keys; its schedules stay and still fire."""
        await self.keys.delete_many({"tenant": name})
        result = await self.tenants.delete_one({"_id": name})
        return result.deleted_count == 1

    async def get(self, name: str) -> Tenant | None:
        doc = await self.tenants.find_one({"_id": name})
        return None if doc is None else Tenant.from_document(doc)

    async def all(self) -> list[tuple[Tenant, list[str]]]:
        """Every tenant with the hints of its keys."""
        tenants = await self.tenants.find().sort("_id", ASCENDING).to_list()
        hints: dict[str, list[str]] = {}
        for key in await self.keys.find({}, {"tenant": 1, "hint": 1}).to_list():
            hints.setdefault(key["tenant"], []).append(key["hint"])
        return [(Tenant.from_document(t), sorted(hints.get(t["_id"], []))) for t in tenants]

    async def names(self) -> list[str]:
        return [str(doc["_id"]) for doc in await self.tenants.find({}, {"_id": 1}).to_list()]

    async def tenant_for_key(self, key: str) -> Tenant | None:
        found = await self.keys.find_one({"_id": key_digest(key)})
        if found is None:
            return None
        return await self.get(found["tenant"])


class TenantDirectory:
    """Keys and policies as every API call needs them: cached for a few seconds."""

    def __init__(self, store: TenantStore, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._by_key: dict[str, tuple[float, Tenant | None]] = {}
        self._by_name: dict[str, tuple[float, Tenant]] = {}
        self._names: tuple[float, list[str]] | None = None

    async def authenticate(self, key: str) -> Tenant | None:
        digest = key_digest(key)
        now = self.clock()
        cached = self._by_key.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        tenant = await self.store.tenant_for_key(key)
        ttl = CACHE_SECONDS if tenant is not None else UNKNOWN_KEY_CACHE_SECONDS
        if len(self._by_key) > 10_000:  # a flood of made-up keys must not grow this forever
            self._by_key.clear()
        self._by_key[digest] = (now + ttl, tenant)
        if tenant is not None:
            self._by_name[tenant.name] = (now + CACHE_SECONDS, tenant)
        return tenant

    async def names(self) -> list[str]:
        """Every registered tenant's name (cached like the rest)."""
        now = self.clock()
        if self._names is None or self._names[0] <= now:
            self._names = (now + CACHE_SECONDS, await self.store.names())
        return self._names[1]

    async def policy(self, name: str) -> Tenant:
        """The tenant's limits; a tenant with no document has none."""
        now = self.clock()
        cached = self._by_name.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
        tenant = await self.store.get(name) or unlimited(name)
        self._by_name[name] = (now + CACHE_SECONDS, tenant)
        return tenant
