"""Placement versions, so a rolling upgrade never strands a bucket.

Every node computes the bucket owners from its own view, so every node must
run the same placement: a member on the old one and a member on a new one
would each leave some buckets to the other, and a bucket that neither
wants would go undelivered until one of them restarts. So each node
advertises in its gossip metadata the newest placement version it knows,
and all of them use the oldest version any alive member advertises; when
the last old node leaves, all switch together (the leases cover the moment
their views disagree). A version, once released, never changes.

* 1: one cap ``max(ceil(B/N), floor(1.25 B/N))`` for every member, buckets
  ranking members by ``murmur3(bucket-b/member)``. Nodes that advertise no
  version run this one.
* 2: ``ring.placement.bounded`` (stratified ranks, per-member capacities).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import mmh3

from ring.placement import DEFAULT_LOAD_FACTOR, Owners, bounded

PLACEMENT_VERSION = 2
# What a member that advertises no version runs.
UNVERSIONED = 1


def place(view: Mapping[str, int], bucket_count: int) -> Owners:
    """Owners of every bucket for ``view`` (member -> newest placement version
    it runs), with the oldest version of the view."""
    if not view:
        return ()
    return PLACEMENTS[in_use(view)](view, bucket_count)


def in_use(view: Mapping[str, int]) -> int:
    """The placement version ``place`` uses for ``view``."""
    return min([*view.values(), PLACEMENT_VERSION])


def parse_version(text: str | None) -> int:
    """A member's advertised version; absent or unreadable counts as 1."""
    try:
        version = int(text) if text is not None else UNVERSIONED
    except ValueError:
        return UNVERSIONED
    return version if version >= UNVERSIONED else UNVERSIONED


def bounded_v1(
    members: Iterable[str], bucket_count: int, *, load_factor: float = DEFAULT_LOAD_FACTOR
) -> Owners:
    """Version 1: one cap for every member, raw rendezvous ranks. Frozen."""
    nodes = sorted(set(members))
    if not nodes:
        return ()
    if load_factor < 1:
        raise ValueError(f"load_factor must be at least 1, got {load_factor}")
    cap = max(
        math.ceil(bucket_count / len(nodes)), math.floor(load_factor * bucket_count / len(nodes))
    )
    ranks = [_ranking_v1(bucket, nodes) for bucket in range(bucket_count)]
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
            worst = max(held[node], key=lambda b: (position[b][node], -_weight_v1(b, node)))
            held[node].remove(worst)
            free.append(worst)
    owners = [""] * bucket_count
    for node, buckets in held.items():
        for bucket in buckets:
            owners[bucket] = node
    return tuple(owners)


def _weight_v1(bucket: int, node: str) -> int:
    return int(mmh3.hash(f"bucket-{bucket}/{node}", 0, signed=False))


def _ranking_v1(bucket: int, nodes: list[str]) -> list[str]:
    return sorted(nodes, key=lambda node: (-_weight_v1(bucket, node), node))


PLACEMENTS: Mapping[int, Callable[[Iterable[str], int], Owners]] = {1: bounded_v1, 2: bounded}
