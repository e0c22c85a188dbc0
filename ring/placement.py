"""Bucket -> node: the second layer of sharding (DESIGN.md).

Every node computes the same placement from the same view, with no
messages: a pure function of the ALIVE member ids and the bucket count.

Two placements, measured side by side by ``python -m bench ring``:

* ``ketama``: plain consistent hashing on a uhashring continuum (160 points
  per member). Minimal movement, but lumpy: at 32 members and 256 buckets
  the busiest member holds about 1.8x the mean.
* ``bounded`` (in use): rendezvous hashing (highest random weight: each
  bucket ranks the members by ``murmur3(bucket/member)``) with bounded loads
  (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads",
  2018): no member takes more than ``cap = max(ceil(B/N), floor(1.25 B/N))``
  buckets. Buckets propose to members in their rank order and a full member
  keeps the buckets that rank it highest (deferred acceptance, Gale and
  Shapley 1962), so the result does not depend on any processing order and
  a join mostly moves the buckets that rank the newcomer first.

Rendezvous ranks rather than a ring walk feed the cap because they spread
the overflow of a full member over all others instead of onto its ring
neighbour, which halves the buckets moved per join (measured).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import mmh3
from uhashring import HashRing

DEFAULT_LOAD_FACTOR = 1.25
# ketama's default: 40 vnodes of 4 points each, 160 points per member.
KETAMA_VNODES = 40

Owners = tuple[str, ...]


@dataclass(frozen=True)
class Change:
    """What one member gains and loses when the placement changes."""

    gained: frozenset[int]
    lost: frozenset[int]


def bounded(
    members: Iterable[str], bucket_count: int, *, load_factor: float = DEFAULT_LOAD_FACTOR
) -> Owners:
    """The owner of every bucket, indexed by bucket; () when there are no members."""
    nodes = sorted(set(members))
    if not nodes:
        return ()
    if load_factor < 1:
        raise ValueError(f"load_factor must be at least 1, got {load_factor}")
    cap = max(
        math.ceil(bucket_count / len(nodes)), math.floor(load_factor * bucket_count / len(nodes))
    )
    ranks = [_ranking(bucket, nodes) for bucket in range(bucket_count)]
    position = [{node: i for i, node in enumerate(r)} for r in ranks]
    proposals = [0] * bucket_count
    held: dict[str, set[int]] = {node: set() for node in nodes}
    free = list(range(bucket_count - 1, -1, -1))
    while free:
        bucket = free.pop()
        node = ranks[bucket][proposals[bucket]]
        proposals[bucket] += 1
        held[node].add(bucket)
        if len(held[node]) > cap:
            # The member keeps the buckets that rank it highest; ties (equal
            # rank) go by the bucket's weight for it, so the choice is total.
            worst = max(held[node], key=lambda b: (position[b][node], -_weight(b, node)))
            held[node].remove(worst)
            free.append(worst)
    owners = [""] * bucket_count
    for node, buckets in held.items():
        for bucket in buckets:
            owners[bucket] = node
    return tuple(owners)


def ketama(members: Iterable[str], bucket_count: int, *, vnodes: int = KETAMA_VNODES) -> Owners:
    """Plain consistent hashing, the baseline the bounded placement is measured against."""
    nodes = sorted(set(members))
    if not nodes:
        return ()
    ring = HashRing(nodes=nodes, vnodes=vnodes)
    return tuple(str(ring.get_node(f"bucket-{b}")) for b in range(bucket_count))


def owned_by(owners: Owners, member: str) -> frozenset[int]:
    return frozenset(b for b, owner in enumerate(owners) if owner == member)


def diff(before: Owners, after: Owners, member: str) -> Change:
    old, new = owned_by(before, member), owned_by(after, member)
    return Change(gained=new - old, lost=old - new)


def balance(owners: Owners) -> float:
    """Busiest member's buckets over the mean (1.0 is perfect)."""
    if not owners:
        return 0.0
    counts: dict[str, int] = {}
    for owner in owners:
        counts[owner] = counts.get(owner, 0) + 1
    return max(counts.values()) / (len(owners) / len(counts))


def moved(before: Owners, after: Owners) -> float:
    """Share of buckets whose owner changed."""
    if not before:
        return 1.0
    return sum(1 for a, b in zip(before, after, strict=True) if a != b) / len(before)


def _weight(bucket: int, node: str) -> int:
    return int(mmh3.hash(f"bucket-{bucket}/{node}", 0, signed=False))


def _ranking(bucket: int, nodes: list[str]) -> list[str]:
    return sorted(nodes, key=lambda node: (-_weight(bucket, node), node))
