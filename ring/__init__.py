"""Pure placement logic, no IO and no clocks (DESIGN.md "two layers of sharding"):
which bucket a schedule lives in, and which member owns which bucket.
"""

from ring.buckets import MAX_BUCKETS, bucket_for
from ring.placement import Change, balance, bounded, diff, ketama, moved, owned_by
from ring.versions import PLACEMENT_VERSION, in_use, parse_version, place

__all__ = [
    "MAX_BUCKETS",
    "PLACEMENT_VERSION",
    "Change",
    "balance",
    "bounded",
    "bucket_for",
    "diff",
    "in_use",
    "ketama",
    "moved",
    "owned_by",
    "parse_version",
    "place",
]
