"""Whether a node can work its buckets: it must reach the store and the
broker. A node cut off from MongoDB, or from Kafka, but not from its peers
still answers their probes, so the failure detector keeps it alive and the
placement keeps giving it buckets: cut from the store it cannot lease them,
cut from the broker it holds them and publishes nothing (a 60 s broker cut
of one node of three left its share 60 s late). So a node that has not
reached either server for a while says so in its gossip metadata, every
node (itself too, so it releases them at once) places the buckets without
it once others could do its work for a moment (``Workers``: an outage for
everyone moves nothing), and it comes back into the placement once it has
reached that server steadily again.

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


class Workers:
    """The alive members to place the buckets on: those that reach both
    servers. When none does, those that reach the store (a broker down for
    everyone moves nothing: nobody could publish, and a bucket must stay
    leased by someone who can hold it); when none reaches the store either,
    all of them (a store down for everyone moves nothing, and a node that has
    not yet said so is placed as before).

    A cut is acted on only once it has lasted ``grace`` seconds while some
    other member could do the work. Nodes notice a server gone at different
    moments (each probes on its own phase, then gossips what it found), so
    an outage of the server for everyone would otherwise move buckets twice
    at its start (the first node to notice hands its share to the others,
    which notice next, and everything comes back) and at its end (the first
    node to reach the server again would be handed every bucket). A grace
    as long as that spread moves nothing then; a node cut on its own hands
    its buckets over ``grace`` later than it could.

    Pure bookkeeping: metadata in (``advertised``), a monotonic clock. Ask
    it from one place (the placement): ``pending`` speaks of its last answer.
    """

    def __init__(self, grace: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self.monotonic = monotonic
        # (member, server) -> when this node first saw that member say it is cut.
        self._cut_seen: dict[tuple[str, str], float] = {}
        # Since when some member could do the work a cut member cannot:
        # reach both servers (for a broker cut), the store (for a store cut).
        self._since: dict[str, float | None] = {BROKER: None, STORE: None}
        self._waiting = False

    def __call__(self, alive: Mapping[str, Mapping[str, str]]) -> list[str]:
        now = self.monotonic()
        self._see_cuts(alive, now)
        self._see_others(alive, now)
        placed = [m for m in alive if self._placeable(m, now)]
        self._waiting = any(self._to_be_left_out(m) for m in placed)
        return placed

    def pending(self) -> bool:
        """Whether the last answer placed a member whose cut will leave it out
        once its grace runs out (it may have by now): ask again."""
        return self._waiting

    def _see_cuts(self, alive: Mapping[str, Mapping[str, str]], now: float) -> None:
        """Keep when each cut still advertised was first seen; forget the rest."""
        self._cut_seen = {
            (member, server): self._cut_seen.get((member, server), now)
            for member, meta in alive.items()
            for server in (STORE, BROKER)
            if meta.get(server) == CUT
        }

    def _see_others(self, alive: Mapping[str, Mapping[str, str]], now: float) -> None:
        """Keep since when, per server, some member could do a cut member's work."""
        able = [m for m in alive if not self._is_cut(m, STORE) and not self._is_cut(m, BROKER)]
        leasing = [m for m in alive if not self._is_cut(m, STORE)]
        for server, others in ((BROKER, able), (STORE, leasing)):
            since = self._since[server]
            self._since[server] = (now if since is None else since) if others else None

    def _placeable(self, member: str, now: float) -> bool:
        """Whether no cut leaves the member out of the placement by ``now``."""
        return self._left_out_at(member, STORE) > now and self._left_out_at(member, BROKER) > now

    def _to_be_left_out(self, member: str) -> bool:
        """Whether a cut will leave the member out once its grace runs out."""
        return any(self._left_out_at(member, server) < float("inf") for server in (STORE, BROKER))

    def _is_cut(self, member: str, server: str) -> bool:
        return (member, server) in self._cut_seen

    def _left_out_at(self, member: str, server: str) -> float:
        """When a member's cut from ``server`` leaves it out of the placement
        (infinity: not cut, or nobody else could do the work)."""
        seen, since = self._cut_seen.get((member, server)), self._since[server]
        if seen is None or since is None:
            return float("inf")
        return max(seen, since) + self.grace
