"""Pure placement logic: which bucket a schedule lives in, and (later) which
node owns which bucket. No IO, no clocks; see DESIGN.md "two layers of sharding".
"""

from ring.buckets import MAX_BUCKETS, bucket_for

__all__ = ["MAX_BUCKETS", "bucket_for"]
