"""Membership timing and bounds: immutable, validated, with named presets.

``lan`` takes memberlist's ``DefaultLANConfig`` values (config.go), the
reference the figures in docs/performance.md are compared with. ``fast`` trades more
packets for quicker detection on a small, quiet network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from membership.codec import MAX_MEMBERS


class ConfigError(ValueError):
    """A membership setting is out of range."""


@dataclass(frozen=True, kw_only=True)
class SwimConfig:
    # Each member probes one other member per interval (SWIM's protocol period).
    probe_interval: float = 1.0
    # Wait this long for a direct ack before asking others to probe (ping-req).
    probe_timeout: float = 0.5
    # Members asked to probe indirectly (SWIM's k).
    indirect_checks: int = 3
    # Suspect a member for SuspicionMult * log10(max(n, 1)) * probe_interval at
    # least (memberlist: SuspicionMult 4) ...
    suspicion_mult: float = 4.0
    # ... and at most this many times that while nobody confirms (Lifeguard).
    suspicion_max_mult: float = 6.0
    # Each update is sent RetransmitMult * ceil(log10(n + 1)) times (memberlist: 4).
    retransmit_mult: int = 4
    # Piggyback-only gossip: every gossip_interval, send queued updates to
    # gossip_nodes random members (memberlist: 200 ms, 3 nodes).
    gossip_interval: float = 0.2
    gossip_nodes: int = 3
    # Full state exchange with one random member, scaled up for large clusters.
    push_pull_interval: float = 30.0
    # Lifeguard local health: timeouts stretch by (score + 1), score <= this.
    awareness_max: int = 8
    # Keep dead members this long: push-pull still tries them, which is what
    # heals a partition once it ends.
    dead_retention: float = 3600.0
    # A UDP payload that crosses no fragmentation on common networks.
    max_packet_bytes: int = 1400
    # Members this node keeps in its table (itself and the dead included):
    # far above any cluster we run, it bounds the memory and the length of a
    # probe pass that a flood of made-up members could take. A push-pull of
    # the whole table must fit one stream frame, so at most MAX_MEMBERS
    # (4096, codec.py).
    max_members: int = MAX_MEMBERS
    # Members never heard of that one datagram may add: gossip rarely carries
    # more than a couple (a join, a restart); a forged datagram may carry
    # dozens. A push-pull (a join's full state) may add up to max_members.
    max_new_per_packet: int = 8

    def __post_init__(self) -> None:
        checks = {
            "probe_interval": self.probe_interval > 0,
            "probe_timeout": 0 < self.probe_timeout < self.probe_interval,
            "indirect_checks": self.indirect_checks >= 0,
            "suspicion_mult": self.suspicion_mult >= 1,
            "suspicion_max_mult": self.suspicion_max_mult >= 1,
            "retransmit_mult": self.retransmit_mult >= 1,
            "gossip_interval": self.gossip_interval > 0,
            "gossip_nodes": self.gossip_nodes >= 0,
            "push_pull_interval": self.push_pull_interval > 0,
            "awareness_max": self.awareness_max >= 0,
            "dead_retention": self.dead_retention >= 0,
            "max_packet_bytes": 256 <= self.max_packet_bytes <= 65_000,
            "max_members": 2 <= self.max_members <= MAX_MEMBERS,
            "max_new_per_packet": self.max_new_per_packet >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(
                    f"membership setting {name} is out of range: {getattr(self, name)}"
                )

    def suspicion_timeouts(self, members: int) -> tuple[float, float]:
        """(min, max) suspicion timeout for ``members`` (memberlist suspicionTimeout)."""
        scale = max(1.0, math.log10(max(1.0, float(members))))
        low = self.suspicion_mult * scale * self.probe_interval
        return low, low * self.suspicion_max_mult

    def retransmit_limit(self, members: int) -> int:
        return self.retransmit_mult * math.ceil(math.log10(members + 1))

    def push_pull_period(self, members: int) -> float:
        """memberlist pushPullScale: double the interval per doubling past 32 members."""
        if members <= 32:
            return self.push_pull_interval
        multiplier = math.ceil(math.log2(members) - math.log2(32)) + 1
        return self.push_pull_interval * multiplier


LAN = SwimConfig()

# Small clusters on a quiet LAN: about twice the packets of lan for
# detection in about half the time. Every change from lan, and why:
FAST = replace(
    LAN,
    # Probe twice as often: a crashed member is first missed sooner.
    probe_interval=0.5,
    # Loopback and a quiet LAN answer in well under a millisecond; 200 ms
    # still leaves room for a busy peer.
    probe_timeout=0.2,
    # Suspect for 3 * log10(n) intervals at least instead of 4: with the
    # shorter interval, 1.5 s for up to 10 members.
    suspicion_mult=3.0,
    # Gossip twice as often, so updates spread at the pace of the probes.
    gossip_interval=0.1,
    # Exchange full state twice as often to heal partitions sooner.
    push_pull_interval=15.0,
)

PRESETS = {"lan": LAN, "fast": FAST}


def preset(name: str) -> SwimConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown membership preset {name!r}; use one of {sorted(PRESETS)}"
        ) from None
