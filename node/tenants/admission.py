"""Whether a tenant may add these schedules now: its allowed topics, its
rate and its pending cap (``quotas.py``), and the broker's knowledge of the
topic, checked in that order. Every new
schedule goes through here, one at a time or a batch at once, and each gets
its own answer, so one refused item of a batch does not refuse the others.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from node.errors import QuotaExceeded, RateLimited, SchedulerError, TopicNotAllowed, UnknownTopic
from node.schedule.flow import TENANT_FLOW_KEY, FlowControl
from node.schedule.model import NewSchedule
from node.tenants.directory import TenantDirectory
from node.tenants.model import Tenant
from node.tenants.quotas import PendingQuota, RateLimiter

# A tenant this node accepted work for is served fairly for this long after,
# registered or not (with auth off, tenants need no record).
RECENT_TENANT_SECONDS = 24 * 3600.0
# How long the broker's answer about a topic is trusted: a topic it has
# stays (deleting one under live schedules is the operator's doing); one it
# refused may be created meanwhile.
TOPIC_KNOWN_SECONDS = 300.0
TOPIC_UNKNOWN_SECONDS = 5.0
# Topics one call may ask the broker about (see ``Admission.check``).
NEW_TOPICS_PER_CALL = 16

# Whether the broker has a topic or creates it on first use: True, False
# when it answered that it does not, None when it could not be asked (a
# broker outage must not stop intake: the schedule waits for the broker).
TopicCheck = Callable[[str], Awaitable[bool | None]]


def destination_refusal(
    tenant: Tenant, topic: str | None, url: str | None
) -> TopicNotAllowed | None:
    """Why ``tenant`` may not deliver to this topic or URL (its prefixes), if
    it may not: at create, and when a PATCH names a new destination."""
    if topic is not None and not tenant.allows_topic(topic):
        return TopicNotAllowed(
            f"tenant {tenant.name!r} may publish only to topics starting with "
            + ", ".join(repr(p) for p in tenant.topic_prefixes),
            "topic",
        )
    if url is not None and not tenant.allows_url(url):
        return TopicNotAllowed(
            f"tenant {tenant.name!r} may call only URLs starting with "
            + ", ".join(repr(p) for p in tenant.url_prefixes),
            "http.url",
        )
    return None


class Admission:
    def __init__(
        self,
        directory: TenantDirectory,
        pending: PendingQuota,
        *,
        alive_nodes: Callable[[], int],
        topic_known: TopicCheck | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.pending = pending
        self.topic_known = topic_known
        self._topics: dict[str, tuple[float, bool]] = {}
        self.rates = RateLimiter()
        self.alive_nodes = alive_nodes
        self.clock = clock
        self.recent_tenants: dict[str, float] = {}

    async def check(self, schedules: Sequence[NewSchedule]) -> list[SchedulerError | None]:
        """One answer per schedule: None to go ahead, else the refusal.

        The broker is asked about a topic last, for what the tenant's
        prefixes, rate and pending cap let through: asking it may create the
        topic (a broker that creates topics on first use does so for a
        metadata request), so a refused schedule must never cost one. And
        one call asks about at most NEW_TOPICS_PER_CALL topics the broker
        has not been asked about lately: the rest of that call's new topics
        are refused (429), so one batch cannot make hundreds of topics."""
        answers: list[SchedulerError | None] = [None] * len(schedules)
        by_tenant: dict[str, list[int]] = defaultdict(list)
        for index, new in enumerate(schedules):
            by_tenant[new.tenant].append(index)
        now = self.clock()
        asked: set[str] = set()
        for name, indexes in by_tenant.items():
            tenant = await self.directory.policy(name)
            allowed = []
            for index in indexes:
                new = schedules[index]
                url = new.http.url if new.http is not None else None
                refusal = destination_refusal(tenant, new.topic, url)
                if refusal is None:
                    allowed.append(index)
                else:
                    answers[index] = refusal
            admitted, retry_after = self.rates.admit(tenant, len(allowed), now, self.alive_nodes())
            for index in allowed[admitted:]:
                answers[index] = RateLimited(
                    f"tenant {name!r} is over its rate of {tenant.rate:g} schedules/s",
                    retry_after=retry_after,
                )
            allowed = allowed[:admitted]
            room = await self.pending.room(tenant, now)
            if room is not None:
                for index in allowed[room:]:
                    answers[index] = QuotaExceeded(
                        f"tenant {name!r} has its maximum of {tenant.max_pending} "
                        "pending schedules",
                        # Room appears as schedules fire or are cancelled: no useful hint.
                        retry_after=1,
                    )
                allowed = allowed[:room]
            for index in allowed:
                topic = schedules[index].topic
                if topic is not None:
                    answers[index] = await self._topic_refusal(topic, now, asked)
        return answers

    async def with_defaults(self, schedules: Sequence[NewSchedule]) -> list[NewSchedule]:
        """The schedules with their tenants' default delivery rate where
        they name no flow control of their own (``Tenant.delivery_rate``)."""
        out = []
        for new in schedules:
            if new.flow_control is None:
                tenant = await self.directory.policy(new.tenant)
                if tenant.delivery_rate:
                    limit = FlowControl(TENANT_FLOW_KEY, rate=tenant.delivery_rate)
                    new = replace(new, tenant_flow=limit)
            out.append(new)
        return out

    async def new_destination(
        self, tenant_name: str, topic: str | None, url: str | None
    ) -> SchedulerError | None:
        """Why a PATCH may not move a schedule of ``tenant_name`` to this topic
        or URL: its prefixes, and the broker's knowledge of the topic."""
        refusal = destination_refusal(await self.directory.policy(tenant_name), topic, url)
        if refusal is None and topic is not None:
            return await self._topic_refusal(topic, self.clock(), set())
        return refusal

    async def _topic_refusal(
        self, topic: str, now: float, asked: set[str]
    ) -> SchedulerError | None:
        """Why ``topic`` is refused, if the broker says it does not have it
        (``asked``: the topics this call has asked the broker about)."""
        if self._cached(topic, now) is None and topic not in asked:
            if len(asked) >= NEW_TOPICS_PER_CALL:
                return RateLimited(
                    f"one call may name at most {NEW_TOPICS_PER_CALL} topics the node has not "
                    "seen lately; send the rest again",
                    "topic",
                    retry_after=1,
                )
            asked.add(topic)
        if await self._topic_known(topic, now):
            return None
        return UnknownTopic(
            f"topic {topic!r} does not exist and the broker does not create topics: "
            "create it first",
            "topic",
        )

    def _cached(self, topic: str, now: float) -> bool | None:
        """What the broker last said of ``topic``, if that is still trusted."""
        cached = self._topics.get(topic)
        return cached[1] if cached is not None and cached[0] > now else None

    async def _topic_known(self, topic: str, now: float) -> bool:
        if self.topic_known is None:
            return True
        cached = self._cached(topic, now)
        if cached is not None:
            return cached
        known = await self.topic_known(topic)
        if known is None:
            return True  # the broker did not answer: accept, the schedule waits for it
        if len(self._topics) > 10_000:  # made-up topics must not grow this forever
            self._topics.clear()
        ttl = TOPIC_KNOWN_SECONDS if known else TOPIC_UNKNOWN_SECONDS
        self._topics[topic] = (now + ttl, known)
        return known

    def accepted(self, tenant: str, count: int = 1) -> None:
        self.pending.accepted(tenant, count)
        self.recent_tenants[tenant] = self.clock()

    def tenants_seen(self, within: float = RECENT_TENANT_SECONDS) -> list[str]:
        """Tenants this node accepted schedules for lately (registered or not)."""
        horizon = self.clock() - within
        for name in [t for t, at in self.recent_tenants.items() if at < horizon]:
            del self.recent_tenants[name]
        return list(self.recent_tenants)
