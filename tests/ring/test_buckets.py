"""ring.buckets: the id -> bucket function is a cross-version contract."""

from __future__ import annotations

import collections

import mmh3
import pytest

from ring import MAX_BUCKETS, bucket_for


@pytest.mark.parametrize(
    ("schedule_id", "murmur3"),
    [
        # Published MurmurHash3_x86_32 vectors, seed 0.
        ("", 0x00000000),
        ("hello", 0x248BFA47),
        ("The quick brown fox jumps over the lazy dog", 0x2E4FF723),
    ],
)
def test_bucket_is_murmur3_x86_32_seed_0_mod_b(schedule_id: str, murmur3: int) -> None:
    for count in (1, 7, 256, MAX_BUCKETS):
        assert bucket_for(schedule_id, count) == murmur3 % count


def test_hash_is_over_utf8_bytes() -> None:
    # Other clients (Go, Java) must be able to compute the same bucket: the
    # id is hashed as UTF-8, not as Latin-1 or UTF-16.
    assert bucket_for("é", 2**16) == mmh3.hash(b"\xc3\xa9", 0, signed=False) % 2**16
    assert bucket_for("é", 2**16) != mmh3.hash(b"\xe9", 0, signed=False) % 2**16


def test_ids_spread_evenly_over_buckets() -> None:
    counts = collections.Counter(bucket_for(f"id-{i}", 256) for i in range(256_00))
    assert set(counts) == set(range(256))
    # 100 expected per bucket; a fair hash stays well inside +-50%.
    assert max(counts.values()) < 150
    assert min(counts.values()) > 50


@pytest.mark.parametrize("count", [0, -1, MAX_BUCKETS + 1])
def test_bucket_count_out_of_range_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="bucket_count"):
        bucket_for("x", count)
