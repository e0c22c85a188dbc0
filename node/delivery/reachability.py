"""Whether a node can work its buckets: it must reach the store and the
broker. A node cut off from MongoDB, or from Kafka, but not from its peers
still answers their probes, so the failure detector keeps it alive and the
placement keeps giving it buckets: cut from the store it cannot lease them,
cut from the broker it holds them and publishes nothing (a 60 s broker cut
of one node of three left its share 60 s late). So a node that has not
reached either server for a while says so in its gossip metadata, the others
place the buckets without it (and it places without itself, so it releases
them at once), and it comes back into the placement once it has reached
that server steadily again.

Both turns wait (hysteresis), so a blip neither moves buckets nor makes
them flap:

* unplaceable after ``cut_after`` seconds without a call to that server
  succeeding (for the store, by then its leases have lapsed anyway: the TTL);
* placeable again after ``back_after`` seconds of calls succeeding.

Past ``dead_after`` seconds without the store, the node is not healthy
(liveness fails): a pod that cannot reach the store for that long is
better restarted, on another host or with another address.

Pure bookkeeping: results of calls and monotonic times in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


class Reachability:
    """One server, as this node's calls to it have fared."""

    def __init__(
        self,
        *,
        cut_after: float,
        back_after: float,
        dead_after: float = float("inf"),
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
        """A call succeeded. True when placeability changed."""
        now = self.monotonic()
        self._last_ok = now
        if self._ok_since is None:
            self._ok_since = now
        return self._judge(now)

    def failed(self) -> bool:
        """A call failed. True when placeability changed."""
        self._ok_since = None
        return self._judge(self.monotonic())

    def tick(self) -> bool:
        """Time passed with no call either way. True when placeability changed."""
        return self._judge(self.monotonic())

    @property
    def answering(self) -> bool:
        """Whether the last call succeeded (readiness: no call of its own)."""
        return self._ok_since is not None

    @property
    def healthy(self) -> bool:
        return self.monotonic() - self._last_ok < self.dead_after

    @property
    def unreachable_for(self) -> float:
        """Seconds since a call last succeeded."""
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


# What a node that cannot reach a server advertises in its gossip metadata:
# {"store": "cut"}, {"broker": "cut"}, or both.
CUT = "cut"
STORE, BROKER = "store", "broker"


def advertised(*, store: bool, broker: bool) -> dict[str, str]:
    """The metadata entries that say which servers a node cannot reach."""
    return {
        **({} if store else {STORE: CUT}),
        **({} if broker else {BROKER: CUT}),
    }


def workers(alive: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The alive members (id -> metadata) to place the buckets on: those
    that reach both servers. When none does, those that reach the store (a
    broker down for everyone moves nothing: nobody could publish, and a
    bucket must stay leased by someone who can hold it); when none reaches
    the store either, all of them (a store down for everyone moves nothing,
    and a node that has not yet said so is placed as before)."""
    able = [m for m, meta in alive.items() if CUT not in (meta.get(STORE), meta.get(BROKER))]
    leasing = [m for m, meta in alive.items() if meta.get(STORE) != CUT]
    return able or leasing or list(alive)
