"""Keys and policies as every API call needs them: a cache of a few seconds
over the store, so authenticating a call costs no store round trip; a
revoked key or a changed quota takes effect within that time on every node.

Keys that exist and keys that do not are cached apart, so a flood of
made-up keys can neither evict the good ones nor cost the store more than a
fixed number of lookups a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from node.errors import RateLimited
from node.recent import Recent
from node.tenants.model import Tenant, key_digest, unlimited
from node.tenants.quotas import TokenBucket

CACHE_SECONDS = 5.0
# Unknown keys are remembered too, briefly, so guessing keys costs the store nothing.
UNKNOWN_KEY_CACHE_SECONDS = 1.0
# At most this many unknown keys are remembered (the least recently seen go
# first). Known keys are kept apart: made-up keys can never push a good one out.
UNKNOWN_KEYS_KEPT = 10_000
# At most this many tenants' policies are kept (the least recently asked go first).
TENANTS_KEPT = 10_000
# Store lookups of keys this node has never seen, per second (and at once):
# a flood of made-up keys costs the store at most this, and a caller with a
# genuinely new key during one is told to try again (429), not refused.
NEW_KEY_LOOKUPS_PER_SECOND = 20.0
NEW_KEY_LOOKUP_BURST = 50.0


class TenantSource(Protocol):
    """Where tenants are kept (``node/store/tenants.py``)."""

    async def tenant_for_key(self, key: str) -> Tenant | None: ...

    async def get(self, name: str) -> Tenant | None: ...

    async def names(self) -> list[str]: ...


class TenantDirectory:
    """Keys and policies as every API call needs them: cached for a few seconds."""

    def __init__(self, store: TenantSource, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        # Keys that exist (or existed): as many as were ever issued, no more.
        self._known: dict[str, tuple[float, Tenant]] = {}
        # Digests of keys the store did not know, least recently seen first.
        self._unknown: Recent[str, float] = Recent(UNKNOWN_KEYS_KEPT)
        self._new_keys = TokenBucket(
            NEW_KEY_LOOKUPS_PER_SECOND, NEW_KEY_LOOKUP_BURST, NEW_KEY_LOOKUP_BURST, clock()
        )
        # Policies by tenant name; with auth off a call may name any tenant.
        self._by_name: Recent[str, tuple[float, Tenant]] = Recent(TENANTS_KEPT)
        self._names: tuple[float, list[str]] | None = None

    async def authenticate(self, key: str) -> Tenant | None:
        """The tenant of ``key``, None for an unknown or revoked one. Raises
        RateLimited when the key is new to this node and too many new keys
        are being looked up at once (a guessing flood)."""
        digest = key_digest(key)
        now = self.clock()
        known = self._known.get(digest)
        if known is not None and known[0] > now:
            return known[1]
        if known is None:
            unknown_until = self._unknown.get(digest)
            if unknown_until is not None and unknown_until > now:
                return None
            taken, retry_after = self._new_keys.take(1, now)
            if not taken:
                raise RateLimited(
                    "too many unknown API keys are being tried on this node; try again",
                    retry_after=retry_after,
                )
        tenant = await self.store.tenant_for_key(key)
        if tenant is None:
            self._known.pop(digest, None)  # revoked
            self._unknown.put(digest, now + UNKNOWN_KEY_CACHE_SECONDS)
            return None
        self._unknown.pop(digest)
        self._known[digest] = (now + CACHE_SECONDS, tenant)
        self._by_name.put(tenant.name, (now + CACHE_SECONDS, tenant))
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
        self._by_name.put(name, (now + CACHE_SECONDS, tenant))
        return tenant
