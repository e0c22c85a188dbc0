"""Whether a tenant may add these schedules now: its allowed topics, its rate
and its pending cap (``quotas.py``), checked in that order. Every new
schedule goes through here, one at a time or a batch at once, and each gets
its own answer, so one refused item of a batch does not refuse the others.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from node.errors import QuotaExceeded, RateLimited, SchedulerError, TopicNotAllowed
from node.schedule.model import NewSchedule
from node.tenants.directory import TenantDirectory
from node.tenants.quotas import PendingQuota, RateLimiter

# A tenant this node accepted work for is served fairly for this long after,
# registered or not (with auth off, tenants need no record).
RECENT_TENANT_SECONDS = 24 * 3600.0


class Admission:
    def __init__(
        self,
        directory: TenantDirectory,
        pending: PendingQuota,
        *,
        alive_nodes: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.pending = pending
        self.rates = RateLimiter()
        self.alive_nodes = alive_nodes
        self.clock = clock
        self.recent_tenants: dict[str, float] = {}

    async def check(self, schedules: Sequence[NewSchedule]) -> list[SchedulerError | None]:
        """One answer per schedule: None to go ahead, else the refusal."""
        answers: list[SchedulerError | None] = [None] * len(schedules)
        by_tenant: dict[str, list[int]] = defaultdict(list)
        for index, new in enumerate(schedules):
            by_tenant[new.tenant].append(index)
        now = self.clock()
        for name, indexes in by_tenant.items():
            tenant = await self.directory.policy(name)
            allowed = []
            for index in indexes:
                topic = schedules[index].topic
                if tenant.allows_topic(topic):
                    allowed.append(index)
                else:
                    answers[index] = TopicNotAllowed(
                        f"tenant {name!r} may publish only to topics starting with "
                        + ", ".join(repr(p) for p in tenant.topic_prefixes),
                        "topic",
                    )
            admitted, retry_after = self.rates.admit(tenant, len(allowed), now, self.alive_nodes())
            for index in allowed[admitted:]:
                answers[index] = RateLimited(
                    f"tenant {name!r} is over its rate of {tenant.rate:g} schedules/s",
                    retry_after=retry_after,
                )
            room = await self.pending.room(tenant, now)
            if room is None:
                continue
            for index in allowed[:admitted][room:]:
                answers[index] = QuotaExceeded(
                    f"tenant {name!r} has its maximum of {tenant.max_pending} pending schedules",
                    # Room appears as schedules fire or are cancelled: no useful hint.
                    retry_after=1,
                )
        return answers

    def accepted(self, tenant: str, count: int = 1) -> None:
        self.pending.accepted(tenant, count)
        self.recent_tenants[tenant] = self.clock()

    def tenants_seen(self, within: float = RECENT_TENANT_SECONDS) -> list[str]:
        """Tenants this node accepted schedules for lately (registered or not)."""
        horizon = self.clock() - within
        for name in [t for t, at in self.recent_tenants.items() if at < horizon]:
            del self.recent_tenants[name]
        return list(self.recent_tenants)
