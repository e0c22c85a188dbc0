"""Message -> bucket, the first layer of sharding (DESIGN.md).

The function is part of the cluster's on-disk contract: every node, in every
version, must map an id to the same bucket, or schedules would be polled by a
node that does not own them. Hence a fixed hash (MurmurHash3 x86 32-bit,
seed 0, unsigned, over the UTF-8 bytes of the id) and a bucket count that is
pinned in the database when the cluster is first used.
"""

from __future__ import annotations

import mmh3

# Upper bound on B: a lease document per bucket is renewed in one bulk round
# trip, so B is kept to a size one bulk write carries comfortably.
MAX_BUCKETS = 65_536


def bucket_for(schedule_id: str, bucket_count: int) -> int:
    """Return the bucket of ``schedule_id`` among ``bucket_count`` buckets."""
    if not 1 <= bucket_count <= MAX_BUCKETS:
        raise ValueError(f"bucket_count must be in 1..{MAX_BUCKETS}, got {bucket_count}")
    return mmh3.hash(schedule_id, 0, signed=False) % bucket_count
