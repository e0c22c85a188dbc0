"""What crosses the store's edge: how durably it writes, and what its
failures become for the rest of the node.

Above the store nobody sees pymongo. A driver error (the server gone, a
step-down, a timeout, a write refused) leaves the outcome of the operation
unknown to the caller, and the caller's only sensible answer is to retry
later: so every public store method raises ``StoreUnavailable``
(``retriable``) in its place, with the driver's error as its cause. Errors a
store method expects (a duplicate key on insert, a lease won by another node)
it handles itself before they reach this edge.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from pymongo import WriteConcern
from pymongo.errors import PyMongoError

from node.errors import StoreUnavailable

# Journaled on a majority: an acknowledged write survives a crash of the
# database. Found by the store-crash chaos scenario, which lost a schedule
# acknowledged just before a SIGKILL of the embedded server under w:1. The
# server waits for the majority at most WRITE_TIMEOUT_MS (then the write is
# an error to the caller, who retries: an insert under the same id, a cancel
# again); the client's own deadline (STORE_TIMEOUT) bounds the whole call.
WRITE_TIMEOUT_MS = 5000
DURABLE = WriteConcern("majority", j=True, wtimeout=WRITE_TIMEOUT_MS)
# MongoDB's error code for a duplicate key (E11000).
DUPLICATE_KEY = 11000

P = ParamSpec("P")
R = TypeVar("R")


def store_call(
    method: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Translate the driver's errors escaping ``method`` into ``StoreUnavailable``."""

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except PyMongoError as exc:
            # Retry-After 1: a client's retry loop then spans a store's blip
            # (or reaches another node) instead of spending its tries at once.
            raise StoreUnavailable(
                "the schedule store is unreachable; retry", retry_after=1
            ) from exc

    return call
