"""ring.placement: deterministic, capped, and moving little on a view change."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from ring import balance, bounded, diff, ketama, moved, owned_by

B = 256


def members(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


def test_empty_and_single_views() -> None:
    assert bounded([], B) == ()
    assert ketama([], B) == ()
    assert set(bounded(["solo"], B)) == {"solo"}
    assert set(ketama(["solo"], B)) == {"solo"}


@pytest.mark.parametrize("n", [2, 3, 7, 16, 33])
def test_same_view_same_placement_in_any_order(n: int) -> None:
    view = members(n)
    shuffled = view[:]
    random.Random(n).shuffle(shuffled)
    assert bounded(view, B) == bounded(shuffled, B) == bounded([*view, view[0]], B)
    assert ketama(view, B) == ketama(shuffled, B)


@pytest.mark.parametrize("n", range(2, 51))
def test_every_bucket_has_an_owner_from_the_view_and_loads_are_capped(n: int) -> None:
    owners = bounded(members(n), B)
    assert len(owners) == B
    assert set(owners) <= set(members(n))
    cap = max(math.ceil(B / n), math.floor(1.25 * B / n))
    assert max(Counter(owners).values()) <= cap


@pytest.mark.parametrize("n", range(2, 33))
def test_busiest_member_holds_at_most_1_25_times_the_mean(n: int) -> None:
    assert balance(bounded(members(n), B)) <= 1.25


def test_plain_ketama_is_lumpy_which_is_why_the_cap_exists() -> None:
    assert balance(ketama(members(32), B)) > 1.5


@pytest.mark.parametrize("n", range(2, 29))
def test_a_join_moves_at_most_1_5_over_n_plus_1_of_the_buckets(n: int) -> None:
    before, after = bounded(members(n), B), bounded(members(n + 1), B)
    assert moved(before, after) <= 1.5 / (n + 1)
    # ... and the newcomer got work without unbalancing anyone.
    assert owned_by(after, f"node-{n}")
    assert balance(after) <= 1.25


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
