"""The ``Membership`` service: the state machine, a clock and a transport.

The node starts one, reads the view with ``members()`` and learns of changes
through ``subscribe()``. Everything protocol-shaped lives in ``state.py``;
this file only moves packets and time in and out of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Callable, Sequence
from typing import cast

from membership.address import AddressError, parse_address
from membership.codec import Codec, is_member_id, is_meta
from membership.config import SwimConfig
from membership.messages import Event, MemberView, Packet, State
from membership.state import Swim
from membership.transport import Transport, is_ip, split_address

log = logging.getLogger("membership")

Listener = Callable[[Event], None]
# While no other member is known, try the seeds again this often.
REJOIN_INTERVAL = 2.0
# How long a node with seeds waits to hear from one before it concludes it
# is the first member up.
JOIN_PATIENCE = 5.0
# After an unexpected error in the driver loop, pause this long before the
# next round, so a fault that repeats does not spin the CPU.
ERROR_PAUSE = 0.05
# At stop, the longest wait for the loops to end once cancelled.
STOP_WAIT = 5.0


async def resolve_seeds(seeds: Sequence[str], default_port: int) -> list[str]:
    """HOST:PORT entries, or DNS names resolving to several members (a
    Kubernetes headless Service), as IP:PORT addresses."""
    loop = asyncio.get_running_loop()
    out: list[str] = []
    for seed in seeds:
        try:
            host, port = split_address(seed if ":" in seed else f"{seed}:{default_port}")
        except ValueError as exc:
            log.warning("seed %s is not HOST:PORT: %s", seed, exc)
            continue
        if is_ip(host):
            out.append(f"{host}:{port}")
            continue
        try:
            infos = await loop.getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM
            )
        except OSError as exc:
            log.warning("seed %s does not resolve: %s", seed, exc)
            continue
        # AF_INET answers are (ip, port) pairs of a str and an int.
        out.extend(f"{cast(str, info[4][0])}:{port}" for info in infos)
    return sorted(set(out))


class Membership:
    def __init__(
        self,
        node_id: str,
        *,
        bind: tuple[str, int],
        advertise_host: str,
        config: SwimConfig,
        seeds: Sequence[str] = (),
        keys: Sequence[bytes] = (),
        meta: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        # Peers drop packets whose ids or metadata their codec refuses: fail
        # here, not silently in the cluster.
        if not is_member_id(node_id):
            raise ValueError(f"member id {node_id!r} must be 1-64 letters, digits, '.', '_' or '-'")
        self.node_id = node_id
        self.bind = bind
        self.advertise_host = advertise_host
        self.config = config
        self.seeds = tuple(seeds)
        self.meta = tuple(sorted((meta or {}).items()))
        if not is_meta(self.meta):
            raise ValueError(
                "membership metadata: at most 32 keys shaped like member ids, "
                "values of at most 256 printable ASCII characters"
            )
        self.clock = clock
        self.rng = rng or random.Random()
        self.transport = Transport(Codec(keys, max_bytes=config.max_packet_bytes), self._receive)
        self.swim: Swim | None = None
        self._listeners: list[Listener] = []
        self._wake = asyncio.Event()
        self._left = asyncio.Event()  # set once our Left has been sent enough times
        self._task: asyncio.Task[None] | None = None
        self._join_task: asyncio.Task[None] | None = None
        self.handler_errors = 0
        self._started_at = 0.0

    # -- the node's side -----------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` with every membership event, in order."""
        self._listeners.append(listener)

    def members(self) -> list[MemberView]:
        return self.swim.view() if self.swim is not None else []

    def update_meta(self, meta: dict[str, str]) -> None:
        """Advertise new metadata: peers learn it as they learn a refutation
        (within a few protocol periods); our listeners hear UPDATED at once."""
        items = tuple(sorted(meta.items()))
        if not is_meta(items):
            raise ValueError(
                "membership metadata: at most 32 keys shaped like member ids, "
                "values of at most 256 printable ASCII characters"
            )
        self.meta = items
        if self.swim is not None:
            self.swim.update_meta(items, self.clock())
            self._flush()

    @property
    def joined(self) -> bool:
        """True once another live member has answered a probe of ours, or we
        have no seeds to join through (the first node), or nobody answered
        for a while (``JOIN_PATIENCE``: we are the first of several starting).
        A member we only heard of does not count: anyone can gossip an Alive,
        and a joining node that believed a made-up one would place only
        itself, for a moment, and take every free bucket."""
        if self.swim is None:
            return False
        if not self.seeds or any(
            m.state == State.ALIVE and m.answered and m.id != self.node_id for m in self.swim.view()
        ):
            return True
        return self.clock() - self._started_at >= JOIN_PATIENCE

    @property
    def address(self) -> str:
        return f"{self.advertise_host}:{self.transport.port}"

    async def start(self) -> None:
        await self.transport.start(*self.bind)
        loop = asyncio.get_running_loop()
        host = self.advertise_host
        if not is_ip(host):
            infos = await loop.getaddrinfo(host, None, family=socket.AF_INET)
            self.advertise_host = str(infos[0][4][0])
        try:
            advertised = parse_address(self.address)
        except AddressError as exc:
            await self.transport.stop()
            raise ValueError(f"cannot advertise {self.address}: {exc}") from None
        if advertised.ip is None or advertised.ip.version != 4:
            await self.transport.stop()
            raise ValueError(f"cannot advertise {self.address}: gossip runs over IPv4")
        self.swim = Swim(
            self.node_id,
            self.address,
            self.config,
            now=self.clock(),
            rng=self.rng,
            meta=self.meta,
            # A restarted node starts above its last life's incarnation in
            # most cases, and refutes its way up in the rest.
            incarnation=int(time.time()),
        )
        self._started_at = self.clock()
        self._task = asyncio.create_task(self._drive(), name=f"membership-{self.node_id}")
        self._task.add_done_callback(self._task_ended)
        if self.seeds:
            self._join_task = asyncio.create_task(self._join_seeds())
            self._join_task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # Both loops catch everything but cancellation: this is a bug if it logs.
        if not task.cancelled() and task.exception() is not None:
            log.error("membership: %s ended", task.get_name(), exc_info=task.exception())

    async def _join_seeds(self) -> None:
        """Exchange state with every seed that is not yet a live member.

        Fast (every ``REJOIN_INTERVAL``) while we know nobody, then at the
        push-pull interval. Stopping once *some* member is known is not
        enough: a seed that was not up yet when we joined, and has no seeds
        of its own, would otherwise stay alone forever while the rest of the
        cluster runs without it. With a DNS seed, this also finds new pods.
        """
        delay = REJOIN_INTERVAL
        while self.swim is not None and not self.swim.leaving:
            known: set[str] = set()
            try:
                known = {
                    m.address
                    for m in self.swim.view()
                    if m.state in (State.ALIVE, State.SUSPECT) and m.id != self.node_id
                }
                addresses = [
                    a
                    for a in await resolve_seeds(self.seeds, self.bind[1])
                    if a != self.address and a not in known
                ]
                if addresses:
                    self.swim.join(addresses, self.clock())
                    self._flush()
            except Exception:
                self.handler_errors += 1
                log.exception("membership: error joining through the seeds")
            # Back off while seeds stay unreachable, to the push-pull pace.
            delay = REJOIN_INTERVAL if not known else min(delay * 2, self.config.push_pull_interval)
            await asyncio.sleep(delay)

    async def leave(self, grace: float) -> None:
        """Graceful leave: broadcast our Left, wait (at most ``grace`` s) for it to go out."""
        if self.swim is None:
            return
        self.swim.leave(self.clock())
        self._flush()
        if not any(
            m.state in (State.ALIVE, State.SUSPECT) and m.id != self.node_id
            for m in self.swim.view()
        ):
            return  # nobody to tell
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._left.wait(), timeout=grace)

    async def stop(self) -> None:
        for task in (self._join_task, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    # Bounded: a loop that swallowed its cancellation must not
                    # hold up the node's stop for good.
                    await asyncio.wait_for(asyncio.shield(task), STOP_WAIT)
        await self.transport.stop()

    # -- the loop ------------------------------------------------------------------

    def _receive(self, packet: Packet) -> None:
        if self.swim is None:
            return
        try:
            self.swim.receive(packet, self.clock())
        except Exception:  # a state machine bug must not take the socket down
            self.handler_errors += 1
            log.exception("membership: error handling a packet")
        # Send what was produced, even after an error part way through.
        try:
            self._flush()
        except Exception:
            self.handler_errors += 1
            log.exception("membership: error sending after a packet")

    async def _drive(self) -> None:
        """The timer loop. Nothing but cancellation ends it: an error in one
        round is logged and counted (``handler_errors``), and the next runs."""
        assert self.swim is not None
        while True:
            try:
                delay = max(0.0, self.swim.next_deadline() - self.clock())
                self._wake.clear()
                # asyncio.timeout, not wait_for: on Python 3.11, wait_for can
                # swallow a cancellation that lands as the wake-up does, and
                # this loop would then run on after stop() (a test hung on it).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                try:
                    self.swim.tick(self.clock())
                except Exception:
                    self.handler_errors += 1
                    log.exception("membership: error in a timer")
                self._flush()
            except Exception:
                self.handler_errors += 1
                log.exception("membership: error in the driver loop")
                await asyncio.sleep(ERROR_PAUSE)

    def _flush(self) -> None:
        assert self.swim is not None
        outgoing, events = self.swim.drain()
        for out in outgoing:
            try:  # send never raises; should it, the other packets still go
                self.transport.send(out.address, out.packet, reliable=out.reliable)
            except Exception:
                self.handler_errors += 1
                log.exception("membership: error sending a packet")
        for event in events:
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:
                    log.exception("membership: listener failed")
        if self.swim.leaving and not self.swim.pending_broadcasts():
            self._left.set()
        if outgoing or events:
            # The deadline may have moved (a new suspicion, a gossip due).
            self._wake.set()
