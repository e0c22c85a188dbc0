"""Tenants and their API keys: who may call, and within which limits.

A tenant is a document in ``tenants``; each of its API keys is a document in
``api_keys`` whose ``_id`` is the key's SHA-256 digest (``node/store/tenants.py``).
The key itself is shown once, when made, and never stored: a copy of the
database grants no access. A fast hash is enough because a key is 256 random
bits: there is no dictionary of likely keys to try, which is what slow
password hashes defend against.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from node.errors import TenantError
from node.schedule.egress import allows_prefix
from node.schedule.model import TENANT_NAME

KEY_PREFIX = "sk_"
# The first characters of a key, kept to tell keys apart when listing or revoking.
KEY_HINT_LENGTH = len(KEY_PREFIX) + 6


@dataclass(frozen=True, kw_only=True)
class Tenant:
    """A tenant and its limits; ``None`` means no limit."""

    name: str
    admin: bool = False  # may call the operator routes (/v1/cluster, /v1/admin/)
    max_pending: int | None = None  # PENDING schedules at once
    rate: float | None = None  # schedules accepted per second, cluster-wide
    burst: int | None = None  # schedules accepted at once above the rate
    topic_prefixes: tuple[str, ...] = ()  # empty: any topic
    url_prefixes: tuple[str, ...] = ()  # empty: any URL the egress policy allows
    # The secrets its HTTP deliveries are signed with, newest first: two
    # during a rotation (both signatures are sent), else one; none: the
    # cluster's HTTP_SIGNING_SECRET.
    signing_secrets: tuple[str, ...] = ()
    # Seconds of store time a second its API calls may take, cluster-wide
    # (node/tenants/reads.py); None: the node's READ_BUDGET.
    read_budget: float | None = None
    # Deliveries a second of its schedules that name no flow key, cluster-
    # wide (``node/schedule/flow.py``, the key TENANT_FLOW_KEY); None: none.
    delivery_rate: int | None = None

    def allows_topic(self, topic: str) -> bool:
        return not self.topic_prefixes or topic.startswith(self.topic_prefixes)

    def allows_url(self, url: str) -> bool:
        return allows_prefix(url, self.url_prefixes)

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
            "urlPrefixes": list(self.url_prefixes),
            "signingSecrets": list(self.signing_secrets),
            "readBudget": self.read_budget,
            "deliveryRate": self.delivery_rate,
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
            url_prefixes=tuple(doc.get("urlPrefixes") or ()),
            signing_secrets=tuple(doc.get("signingSecrets") or ()),
            read_budget=doc.get("readBudget"),
            delivery_rate=doc.get("deliveryRate"),
        )

    def to_view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "admin": self.admin,
            "maxPending": self.max_pending,
            "rate": self.rate,
            "burst": self.burst,
            "topicPrefixes": list(self.topic_prefixes),
            "urlPrefixes": list(self.url_prefixes),
            # Never the secrets themselves: a listing is not where they are read.
            "signingSecrets": len(self.signing_secrets),
            "readBudget": self.read_budget,
            "deliveryRate": self.delivery_rate,
        }


def unlimited(name: str) -> Tenant:
    """The policy of a tenant with no document: no quota, any topic."""
    return Tenant(name=name)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def validate_name(name: str) -> str:
    if not TENANT_NAME.fullmatch(name):
        raise TenantError(f"tenant name must be 1-64 characters of [A-Za-z0-9._-], got {name!r}")
    return name
