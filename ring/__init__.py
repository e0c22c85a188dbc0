"""Pure placement logic, no IO and no clocks (DESIGN.md "two layers of sharding"):
which bucket a schedule lives in, and which member owns which bucket.
"""

from ring.buckets import MAX_BUCKETS, bucket_for
from ring.placement import Change, balance, bounded, diff, ketama, moved, owned_by

__all__ = [
    "MAX_BUCKETS",
    "Change",
    "balance",
    "bounded",
    "bucket_for",
    "diff",
    "ketama",
    "moved",
    "owned_by",
]
