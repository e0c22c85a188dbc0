"""Keys and policies as every API call needs them: a cache of a few seconds
over the store, so authenticating a call costs no store round trip; a
revoked key or a changed quota takes effect within that time on every node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from node.tenants.model import Tenant, key_digest, unlimited

CACHE_SECONDS = 5.0
# Unknown keys are remembered too, briefly, so guessing keys costs the store nothing.
UNKNOWN_KEY_CACHE_SECONDS = 1.0


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
