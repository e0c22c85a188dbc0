"""Per-tenant read budgets: how much of the store's time a tenant's scans
may take.

A scan (a listing, its counts, a bulk cancel's selection) costs the store
what the tenant holds, not what it returns, and nothing limited them: six
clients of one tenant repeating a status listing took another tenant's
deliveries from a p50 of 17 ms to 18.6 s. So each scan is charged the time
its store calls took, from the moment it asked to the answer (a timeout
too): the work it caused, in the one unit every store shares. A listing
that finds its page at once costs little; one that scans a large tenant
for a rare status costs what the scan took, and so does the count of a
large range. On a fast MongoDB a budget buys many scans, on a slow or busy
store few: it follows the store. A tenant whose budget is spent, or that
has a scan under way on the node already, gets 429 with Retry-After.

A call on one schedule (a GET, a cancel, a PATCH or a verb, a history,
which its cap bounds) reads one document: those are not charged, as
creates are not (they have the intake rate, ``quotas.py``).

Like the intake rate, the budget is cluster-wide and each node grants its
share, rate / alive nodes, with no coordination (docs/operations.md, "Bounds"). The cost
of a call is known only once it is done, so a call is let through while the
balance is not negative and charged after: a tenant can overdraw by one
call, which it then waits out.

Time is passed in (monotonic seconds): tested in virtual time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

from node.errors import RateLimited
from node.recent import Recent
from node.tenants.directory import TenantDirectory
from node.tenants.model import Tenant
from node.tenants.quotas import TokenBucket

# A budget fills up to this many seconds of its rate: a quiet tenant may
# then make a few slow calls at once.
BURST_SECONDS = 5.0
# Budgets kept at once (the least recently used go first): with auth off a
# call may name any tenant, and names must not grow this without bound.
KEPT = 10_000
# The budget of a listing across every tenant (auth off, no tenant named).
ANY_TENANT = "*"
# A tenant's calls in the store at once, on each node: past it, 429. The
# budget is charged only once a call is done, so without this several
# clients starting together would all be let through on a full budget, and
# their scans run side by side.
IN_FLIGHT_PER_TENANT = 1


class ReadBudget:
    """Each tenant's read budget on this node, in seconds of store time a
    second, sized to this node's share."""

    def __init__(self, default_rate: float) -> None:
        self.default_rate = default_rate  # READ_BUDGET: for tenants without their own
        self._buckets: Recent[str, TokenBucket] = Recent(KEPT)

    def check(self, tenant: Tenant, now: float, nodes: int) -> None:
        """Raise RateLimited while the tenant's budget is spent (overdrawn)."""
        bucket = self._bucket(tenant, now, nodes)
        bucket.refill(now)
        if bucket.tokens < 0:
            raise RateLimited(
                f"tenant {tenant.name!r} has used its read budget ({self._rate(tenant):g} s "
                "of store time a second); slow down",
                retry_after=-bucket.tokens / bucket.rate,
            )

    def charge(self, tenant: Tenant, seconds: float, now: float, nodes: int) -> None:
        """A call of the tenant kept the store busy ``seconds``."""
        bucket = self._bucket(tenant, now, nodes)
        bucket.refill(now)
        bucket.tokens -= max(0.0, seconds)

    def _rate(self, tenant: Tenant) -> float:
        return tenant.read_budget if tenant.read_budget is not None else self.default_rate

    def _bucket(self, tenant: Tenant, now: float, nodes: int) -> TokenBucket:
        share = 1.0 / max(1, nodes)
        rate = self._rate(tenant) * share
        capacity = rate * BURST_SECONDS
        bucket = self._buckets.get(tenant.name)
        if bucket is None:
            bucket = TokenBucket(rate, capacity, capacity, now)
            self._buckets.put(tenant.name, bucket)
        else:
            bucket.reshape(rate, capacity, now)
        return bucket


class TenantReads:
    """The read budgets as the API uses them: ``reading(tenant)`` around a
    call's store work, refused (429) while the budget is spent, charged the
    time it took however it ended."""

    def __init__(
        self,
        directory: TenantDirectory,
        *,
        default_rate: float,
        alive_nodes: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.budget = ReadBudget(default_rate)
        self.alive_nodes = alive_nodes
        self.clock = clock
        self._in_flight: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def reading(self, tenant: str | None) -> AsyncIterator[None]:
        policy = await self.directory.policy(tenant or ANY_TENANT)
        began = self.clock()
        self.budget.check(policy, began, self.alive_nodes())
        name = policy.name
        if self._in_flight.get(name, 0) >= IN_FLIGHT_PER_TENANT:
            raise RateLimited(
                f"tenant {name!r} has {IN_FLIGHT_PER_TENANT} calls reading the store on this "
                "node already; wait for them",
                retry_after=1,
            )
        self._in_flight[name] = self._in_flight.get(name, 0) + 1
        try:
            yield
        finally:
            left = self._in_flight[name] - 1
            if left:
                self._in_flight[name] = left
            else:
                del self._in_flight[name]
            now = self.clock()
            self.budget.charge(policy, now - began, now, self.alive_nodes())
