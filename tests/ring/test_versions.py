"""Placement versions: a cluster in the middle of a rolling upgrade agrees."""

from __future__ import annotations

import hashlib

import pytest

from ring import PLACEMENT_VERSION, bounded, in_use, owned_by, parse_version, place
from ring.versions import bounded_v1

B = 256


def members(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


def fingerprint(owners: tuple[str, ...]) -> str:
    return hashlib.sha256("|".join(owners).encode()).hexdigest()[:16]


# Version 1 as released (the placement of commit 6147b36), recorded once: a
# released version must never change, or nodes still running it disagree.
V1_FINGERPRINTS = {
    1: "267e1b0dfb426b88",
    2: "e5489d328e431c64",
    5: "eed9424f84515703",
    8: "bf60b43f4d6d47cb",
    33: "89cfb0dad4f1dabd",
}


@pytest.mark.parametrize(("n", "expected"), sorted(V1_FINGERPRINTS.items()))
def test_version_1_is_frozen(n: int, expected: str) -> None:
    assert fingerprint(bounded_v1(members(n), B)) == expected


def test_the_current_version_differs_from_version_1() -> None:
    # Otherwise there would be no need for a new version number.
    assert bounded(members(8), B) != bounded_v1(members(8), B)


def test_a_view_on_one_version_uses_it() -> None:
    view = dict.fromkeys(members(5), PLACEMENT_VERSION)
    assert in_use(view) == PLACEMENT_VERSION
    assert place(view, B) == bounded(members(5), B)


def test_one_old_member_holds_the_whole_cluster_to_the_old_version() -> None:
    view = {**dict.fromkeys(members(5), PLACEMENT_VERSION), "node-2": 1}
    assert in_use(view) == 1
    assert place(view, B) == bounded_v1(members(5), B)


def test_a_newer_member_does_not_make_this_node_use_a_version_it_lacks() -> None:
    view = {"node-0": PLACEMENT_VERSION, "node-1": PLACEMENT_VERSION + 1}
    assert in_use(view) == PLACEMENT_VERSION


def test_mid_upgrade_every_bucket_is_wanted_by_exactly_one_node() -> None:
    # Two nodes still run the previous release (no version advertised, they
    # place with version 1 over all members); three run this one.
    old, new = members(2), members(5)[2:]
    advertised = {**{m: parse_version(None) for m in old}, **{m: PLACEMENT_VERSION for m in new}}
    by_old = bounded_v1(old + new, B)
    by_new = place(advertised, B)
    wanted = [owned_by(by_old, m) for m in old] + [owned_by(by_new, m) for m in new]
    assert sum(len(w) for w in wanted) == B
    assert frozenset().union(*wanted) == frozenset(range(B))


@pytest.mark.parametrize(
    ("text", "version"), [(None, 1), ("", 1), ("x", 1), ("0", 1), ("-3", 1), ("1", 1), ("2", 2)]
)
def test_an_advertised_version_is_read_leniently(text: str | None, version: int) -> None:
    assert parse_version(text) == version
