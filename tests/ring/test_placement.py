"""ring.placement: deterministic, capped, and moving little on a view change."""

from __future__ import annotations

import math
import random
from collections import Counter
from functools import cache

import pytest

from ring import balance, bounded, diff, ketama, moved, owned_by
from ring.placement import capacities

B = 256
# The aims up to 32 members: the busiest member within 1.25x the mean, and a
# join moving at most 1.5x the ideal 1/(N+1) of the buckets.
BALANCE_AIM = 1.25
JOIN_AIM = 1.5
# Joins that miss JOIN_AIM with these member names, and by how much at most.
# At B = 256 a join near N = 30 may move about 12 buckets, and a newcomer with
# many first choices takes up to 1.25x its share, so a shed or two on top is
# enough (see ring/placement.py; over other member names about one join in
# ten up to 32 members misses). At 26 -> 27 the newcomer takes 11 buckets, 2
# members shed one as their capacity drops from 12 to 11, and 2 the newcomer
# took from take one back from the overflow: 15 of 256, 1.58x.
JOIN_AIM_MISSES = {26: 1.6}


def members(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


@cache
def placed(n: int) -> tuple[str, ...]:
    return bounded(members(n), B)


def join_x(n: int) -> float:
    """Buckets moved when node-n joins node-0..node-(n-1), over the ideal 1/(n+1)."""
    return moved(placed(n), placed(n + 1)) * (n + 1)


def test_empty_and_single_views() -> None:
    assert bounded([], B) == ()
    assert ketama([], B) == ()
    assert set(bounded(["solo"], B)) == {"solo"}
    assert set(ketama(["solo"], B)) == {"solo"}


@pytest.mark.parametrize("n", [2, 3, 7, 16, 26, 33, 64, 97])
def test_same_view_same_placement_in_any_order(n: int) -> None:
    view = members(n)
    shuffled = view[:]
    random.Random(n).shuffle(shuffled)
    assert bounded(view, B) == bounded(shuffled, B) == bounded([*view, view[0]], B)
    assert bounded(view, B) == bounded(reversed(view), B) == bounded(iter(shuffled), B)
    assert capacities(view, B) == capacities(shuffled, B)
    assert ketama(view, B) == ketama(shuffled, B)


@pytest.mark.parametrize("n", range(2, 101))
def test_every_bucket_has_an_owner_from_the_view_and_loads_are_capped(n: int) -> None:
    owners = placed(n)
    assert len(owners) == B
    assert set(owners) <= set(members(n))
    capacity = capacities(members(n), B)
    assert sum(capacity.values()) >= B
    assert all(count <= capacity[m] for m, count in Counter(owners).items())
    # No member may hold more than 1.25 B/N, unless that leaves under 15%
    # spare capacity: then capacities rise to 1.15 B/N, rounded up.
    bound = math.floor(1.25 * B / n)
    assert max(capacity.values()) <= max(bound, math.ceil(1.15 * B / n))
    if n * bound >= 1.15 * B:
        assert max(capacity.values()) <= bound
    # Capacities differ by at most one: as N grows they drop a few members at
    # a time, not all at once.
    assert max(capacity.values()) - min(capacity.values()) <= 1


@pytest.mark.parametrize("n", range(2, 33))
def test_busiest_member_holds_at_most_1_25_times_the_mean(n: int) -> None:
    assert balance(placed(n)) <= BALANCE_AIM


def test_plain_ketama_is_lumpy_which_is_why_the_cap_exists() -> None:
    assert balance(ketama(members(32), B)) > 1.5


@pytest.mark.parametrize("n", range(2, 33))
def test_a_join_moves_at_most_1_5_over_n_plus_1_of_the_buckets(n: int) -> None:
    assert join_x(n) <= JOIN_AIM_MISSES.get(n, JOIN_AIM)
    # ... and the newcomer got work.
    assert owned_by(placed(n + 1), f"node-{n}")


def test_the_joins_that_miss_the_aim_are_exactly_the_known_ones() -> None:
    # A placement change that fixes or adds a miss must update the list (and
    # the figures in docs/performance.md), so it cannot drift unnoticed either way.
    assert [n for n in range(2, 33) if join_x(n) > JOIN_AIM] == sorted(JOIN_AIM_MISSES)


@pytest.mark.parametrize("n", range(33, 100))
def test_past_32_members_no_join_moves_more_than_5_times_the_ideal(n: int) -> None:
    # With one cap for every member, the cap dropping by one as N grew made a
    # join move 8.4x the ideal at 64 members and 13x at 85.
    assert join_x(n) <= 5


@pytest.mark.parametrize("n", [33, 64, 100, 127])
def test_with_about_20_buckets_a_member_every_aim_holds_past_32_members(n: int) -> None:
    # What the manual's sizing advice rests on (python -m bench ring checks
    # every N from 2 to 128; at B = 256, 64, 100 and 127 miss).
    big = 4096
    now = bounded(members(n), big)
    assert max(Counter(now).values()) <= math.floor(BALANCE_AIM * big / n)
    assert moved(now, bounded(members(n + 1), big)) * (n + 1) <= JOIN_AIM
    for leaver in (members(n)[0], members(n)[n // 2], members(n)[-1]):
        rest = [m for m in members(n) if m != leaver]
        assert moved(now, bounded(rest, big)) * n <= JOIN_AIM


def test_diff_names_what_a_member_gains_and_loses() -> None:
    before, after = bounded(members(4), B), bounded(members(5), B)
    for member in members(4):
        change = diff(before, after, member)
        assert change.gained == owned_by(after, member) - owned_by(before, member)
        assert change.lost == owned_by(before, member) - owned_by(after, member)
        assert not change.gained & change.lost
    joined = diff(before, after, "node-4")
    assert joined.lost == frozenset()
    assert joined.gained == owned_by(after, "node-4")


def test_a_leave_hands_the_leaver_buckets_to_the_others() -> None:
    before = bounded(members(6), B)
    after = bounded(members(6)[:-1], B)
    assert "node-5" not in after
    leaver = owned_by(before, "node-5")
    assert all(after[b] != "node-5" for b in leaver)


def test_load_factor_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="load_factor"):
        bounded(members(3), B, load_factor=0.9)
