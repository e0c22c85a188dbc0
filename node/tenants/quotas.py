"""Per-tenant admission: a token-bucket rate limit on new schedules and a
cap on PENDING schedules.

Both are enforced by each node on its own, with no coordination, so both
are approximate across the cluster, in the way their users can rely on:

* Rate: a tenant's configured rate is cluster-wide; each node grants its
  share, rate / alive nodes (clients spread over nodes by a load balancer).
  A client pinned to one node gets that node's share.
* Pending: the count comes from the store at most a second old, plus what
  this node accepted since. Other nodes' intake within that second is not
  seen, so a tenant can overshoot by at most about one second of intake.

Time is passed in (``now``, monotonic seconds): the logic is tested with
virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from node.tenants.model import Tenant

PENDING_REFRESH_SECONDS = 1.0


@dataclass
class TokenBucket:
    rate: float  # tokens per second
    capacity: float
    tokens: float
    updated: float

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
        self.updated = now

    def reshape(self, rate: float, capacity: float, now: float) -> None:
        """A new rate or capacity (a changed quota, another node count):
        what is filled so far stays, up to the new capacity."""
        if (self.rate, self.capacity) == (rate, capacity):
            return
        self.refill(now)
        self.rate, self.capacity = rate, capacity
        self.tokens = min(self.tokens, capacity)

    def take(self, wanted: int, now: float) -> tuple[int, float]:
        """Take up to ``wanted`` tokens; returns (taken, seconds until the
        next token when some were refused, else 0)."""
        self.refill(now)
        taken = min(wanted, int(self.tokens))
        self.tokens -= taken
        if taken == wanted:
            return taken, 0.0
        if not self.rate:
            return taken, math.inf
        return taken, (1.0 - (self.tokens - int(self.tokens))) / self.rate


class RateLimiter:
    """Each tenant's token bucket on this node, sized to this node's share."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def admit(self, tenant: Tenant, wanted: int, now: float, nodes: int) -> tuple[int, float]:
        """How many of ``wanted`` new schedules may go ahead now, and when to
        retry the rest (seconds)."""
        if tenant.rate is None:
            return wanted, 0.0
        share = 1.0 / max(1, nodes)
        rate, capacity = tenant.rate * share, max(1.0, tenant.burst_size * share)
        bucket = self._buckets.get(tenant.name)
        if bucket is None:
            bucket = self._buckets[tenant.name] = TokenBucket(rate, capacity, capacity, now)
        else:
            bucket.reshape(rate, capacity, now)
        return bucket.take(wanted, now)


class PendingQuota:
    """How many more schedules a tenant may have PENDING."""

    def __init__(self, count_pending: Callable[[str], Awaitable[int]]) -> None:
        self.count_pending = count_pending
        # tenant -> (when counted, the store's count, accepted here since)
        self._counts: dict[str, tuple[float, int, int]] = {}

    async def room(self, tenant: Tenant, now: float) -> int | None:
        """Schedules the tenant may still add (None: no cap)."""
        if tenant.max_pending is None:
            return None
        counted = self._counts.get(tenant.name)
        if counted is None or now - counted[0] >= PENDING_REFRESH_SECONDS:
            counted = (now, await self.count_pending(tenant.name), 0)
            self._counts[tenant.name] = counted
        return max(0, tenant.max_pending - counted[1] - counted[2])

    def accepted(self, tenant: str, count: int) -> None:
        counted = self._counts.get(tenant)
        if counted is not None:
            self._counts[tenant] = (counted[0], counted[1], counted[2] + count)
