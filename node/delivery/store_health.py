"""Whether this node can work its buckets: it must reach the store. A node
cut off from MongoDB but not from its peers still answers their probes, so
the failure detector keeps it alive and the placement keeps giving it
buckets it cannot lease: nobody would deliver them. So a node that has not
reached the store for a while says so in its gossip metadata, the others
place the buckets without it and take them once its leases expire, and it
comes back into the placement once it has reached the store steadily again.

Both turns wait (hysteresis), so a blip neither moves buckets nor makes
them flap:

* unplaceable after ``cut_after`` seconds without a store call succeeding
  (by then its leases have lapsed anyway: the TTL);
* placeable again after ``back_after`` seconds of store calls succeeding.

Past ``dead_after`` seconds without the store, the node is not healthy
(liveness fails): a pod that cannot reach the store for that long is
better restarted, on another host or with another address.

Pure bookkeeping: results of store calls and monotonic times in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


class StoreHealth:
    def __init__(
        self,
        *,
        cut_after: float,
        back_after: float,
        dead_after: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cut_after = cut_after
        self.back_after = back_after
        self.dead_after = dead_after
        self.monotonic = monotonic
        started = monotonic()
        self._last_ok = started  # the last call that succeeded
        self._ok_since: float | None = started  # succeeding without a failure since
        self.placeable = True

    def succeeded(self) -> bool:
        """A store call succeeded. True when placeability changed."""
        now = self.monotonic()
        self._last_ok = now
        if self._ok_since is None:
            self._ok_since = now
        return self._judge(now)

    def failed(self) -> bool:
        """A store call failed. True when placeability changed."""
        self._ok_since = None
        return self._judge(self.monotonic())

    def tick(self) -> bool:
        """Time passed with no call either way. True when placeability changed."""
        return self._judge(self.monotonic())

    @property
    def healthy(self) -> bool:
        return self.monotonic() - self._last_ok < self.dead_after

    @property
    def unreachable_for(self) -> float:
        """Seconds since a store call last succeeded."""
        return self.monotonic() - self._last_ok

    def _judge(self, now: float) -> bool:
        before = self.placeable
        if self.placeable and now - self._last_ok >= self.cut_after:
            self.placeable = False
        elif (
            not self.placeable
            and self._ok_since is not None
            and now - self._ok_since >= self.back_after
        ):
            self.placeable = True
        return self.placeable != before


# What a node that cannot work advertises in its gossip metadata.
CUT_KEY, CUT_VALUE = "store", "cut"


def advertised(placeable: bool) -> dict[str, str]:
    """The metadata entries that say whether a node can work."""
    return {} if placeable else {CUT_KEY: CUT_VALUE}


def workers(alive: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The alive members (id -> metadata) that can work: those not
    advertising a store cut. All of them when none can: a store down for
    everyone moves nothing (nobody could take the buckets), and a node that
    has not yet said so is placed as before."""
    able = [member for member, meta in alive.items() if meta.get(CUT_KEY) != CUT_VALUE]
    return able or list(alive)
