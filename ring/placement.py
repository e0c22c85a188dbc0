"""Bucket -> node: the second layer of sharding (DESIGN.md).

Every node computes the same placement from the same view, with no
messages: a pure function of the ALIVE member ids and the bucket count.

Two placements, measured side by side by ``python -m bench ring``:

* ``ketama``: plain consistent hashing on a uhashring continuum (160 points
  per member). Minimal movement, but lumpy: at 32 members and 256 buckets
  the busiest member holds about 1.8x the mean.
* ``bounded`` (in use): rendezvous hashing with bounded loads (Mirrokni,
  Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018).
  Buckets propose to members in their rank order and a member over its
  capacity keeps the buckets that rank it highest (deferred acceptance, Gale
  and Shapley 1962), so the result does not depend on any processing order,
  and a join mostly moves the buckets that rank the newcomer first. Three
  choices, each measured with ``python -m bench ring`` and with other member
  names:

  - Stratified ranks. Each member orders all B buckets by
    ``murmur3(bucket-b/member)``; its *level* for a bucket is the bucket's
    place in that order (0..B-1), so every member has each level exactly
    once. Buckets rank members by level, highest first, the raw hash
    breaking ties. A member's count of first choices then varies about half
    as much as with raw hashes (variance about B/2N instead of B/N), so fewer
    members exceed their capacity, and each member at capacity costs a move
    or two on later view changes (it sheds when its capacity drops, it pulls
    a bucket back when a newcomer takes one of its own). Over 20 sets of
    member names, the joins up to 32 members that move over 1.5x the ideal
    went from 17% to 10%, and the mean movement down by about 6%.
  - Per-member capacities, smooth in N. The balance bound ``floor(1.25 B/N)``
    is a staircase: it drops for every member at once as N grows (11 -> 10
    from 29 to 30 members at B = 256), so every member at the bound shed a
    bucket on the same join. Instead the mean capacity descends in a
    straight line from each step of the staircase to the next, never above
    it, and is split into shares that differ by at most one, the larger ones
    to the members that come first by a hash of their ids: capacities drop a
    few members at a time. This spreads the shedding over the joins rather
    than lowering its total, which is what matters past 32 members, where
    one step of a 4- or 5-bucket bound removed a fifth of all capacity at
    once (8.4x the ideal movement at 64 members, 13x at 85).
  - A spare-capacity floor. Where the bound leaves under 15% spare capacity
    (at some sizes from 36 members on at B = 256; at 65 members it allows
    260 buckets for 256) the mean capacity is raised to 1.15 B/N, and some
    members then exceed the bound. With no spare nearly every member is full
    and a change cascades through them.

The limit at B = 256: near 30 members a member holds about 8 buckets, so a
newcomer with many first choices takes up to 1.25x its share, and a shed or
a pull-back or two on top exceeds 1.5x the ideal movement. That happens for
about one join in ten up to 32 members, more often near 32, whatever the
member names (once for node-0..node-32, at 26 -> 27; see tests/ring/test_placement.py).
With B = 512 no join up to 32 members exceeded 1.42x, over 12 sets of names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import mmh3
from uhashring import HashRing

DEFAULT_LOAD_FACTOR = 1.25
# The least spare capacity kept, as a share of B, even where that makes some
# members exceed the load factor (from 36 members on at B = 256). More spare
# moves fewer buckets per view change but balances worse: at B = 256 and
# 33-100 members, over 20 sets of member names, with 15% the busiest member
# holds up to 1.36x the mean up to 64 members and 1.53x up to 100, and a join
# or leave moves 1.9x the ideal on average (at most 4.3x); with 10%, 1.31x and
# 1.45x, 2.2x (4.3x); with one cap for all, 1.33x, 2.1x (17x).
MIN_SPARE = Fraction(3, 20)
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
    capacity = capacities(nodes, bucket_count, load_factor=load_factor)
    cap = [capacity[node] for node in nodes]
    keys = [_rank_keys(node, bucket_count) for node in nodes]
    # Each bucket's members (as indexes into nodes), best first: highest
    # level, then highest raw hash, then name (a stable sort of the sorted
    # names), so the order is total and the same for every caller.
    members_of = range(len(nodes))
    ranks = [
        sorted(members_of, key=column.__getitem__, reverse=True)
        for column in zip(*keys, strict=True)
    ]
    proposals = [0] * bucket_count
    held: list[set[int]] = [set() for _ in nodes]
    free = list(range(bucket_count - 1, -1, -1))
    while free:
        bucket = free.pop()
        member = ranks[bucket][proposals[bucket]]
        proposals[bucket] += 1
        mine = held[member]
        mine.add(bucket)
        if len(mine) > cap[member]:
            # The member keeps the buckets that rank it highest (a held
            # bucket's rank for its holder is its proposal count - 1); among
            # equals, the ones it has the highest levels for: a newcomer
            # outranks it for a bucket of level l with probability about
            # 1 - l/B, so these are the ones it is least likely to lose, and
            # to have to refill from the buckets it turned away.
            own = keys[member]
            worst = max(mine, key=lambda b: (proposals[b], -own[b]))
            mine.remove(worst)
            free.append(worst)
    owners = [""] * bucket_count
    for member, buckets in enumerate(held):
        for bucket in buckets:
            owners[bucket] = nodes[member]
    return tuple(owners)


def capacities(
    members: Iterable[str], bucket_count: int, *, load_factor: float = DEFAULT_LOAD_FACTOR
) -> dict[str, int]:
    """How many buckets each member may hold in ``bounded``; sums to at least B.

    The mean is the larger of the smooth descent under ``floor(lf B/N)`` and
    ``min(lf, 1 + MIN_SPARE) B/N``; it is split in ``floor``/``ceil`` shares,
    the larger ones to the members that come first by ``murmur3(cap/member)``.
    """
    nodes = sorted(set(members))
    if not nodes:
        return {}
    if load_factor < 1:
        raise ValueError(f"load_factor must be at least 1, got {load_factor}")
    n = len(nodes)
    factor = Fraction(load_factor)
    mean = max(_under_bound(n, bucket_count, factor), min(factor, 1 + MIN_SPARE) * bucket_count / n)
    base, extra = divmod(math.ceil(n * mean), n)
    order = sorted(nodes, key=lambda node: (_hash(f"cap/{node}"), node))
    return {node: base + (1 if i < extra else 0) for i, node in enumerate(order)}


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


def _hash(key: str) -> int:
    return int(mmh3.hash(key, 0, signed=False))


def _rank_keys(node: str, bucket_count: int) -> list[int]:
    """Per bucket, ``level << 32 | weight``: the level decides, the raw hash breaks ties."""
    # The rendezvous weight murmur3(bucket-b/member), with the call inlined:
    # hashing is most of the cost of ``bounded``.
    hash32 = mmh3.hash
    weights = [hash32(f"bucket-{bucket}/{node}", 0, False) for bucket in range(bucket_count)]
    keys = [0] * bucket_count
    # Stable sort: equal hashes keep bucket order.
    for level, bucket in enumerate(sorted(range(bucket_count), key=weights.__getitem__)):
        keys[bucket] = level << 32 | weights[bucket]
    return keys


def _bound(n: int, bucket_count: int, factor: Fraction) -> int:
    """The most buckets a member may hold with n members: busiest / mean <= factor."""
    return math.floor(factor * bucket_count / n)


def _under_bound(n: int, bucket_count: int, factor: Fraction) -> Fraction:
    """A mean capacity that falls steadily with n and never exceeds ``_bound``.

    ``_bound`` is a staircase: it holds a value m over a run of sizes and then
    drops. This interpolates linearly between the first size of each run
    (where it equals m) and the first size of the next run, so over a run the
    mean falls from m towards the next value instead of all at once.
    """
    m = _bound(n, bucket_count, factor)
    if m == 0:
        return Fraction(0)
    start = math.floor(factor * bucket_count / (m + 1)) + 1  # first size with bound m
    end = math.floor(factor * bucket_count / m) + 1  # first size with a lower bound
    return m + (_bound(end, bucket_count, factor) - m) * Fraction(n - start, end - start)
