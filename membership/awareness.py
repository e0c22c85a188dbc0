"""Lifeguard local health awareness (Dadgar et al. 2017, section 4.1;
memberlist awareness.go).

A node that misses acks and nacks, or hears itself suspected, is more likely
slow itself than surrounded by dead peers. Its score rises, and every probe
timeout and interval it uses stretches by (score + 1), so an overloaded node
stops declaring healthy peers dead. Successful probes bring the score down.
"""

from __future__ import annotations


class Awareness:
    def __init__(self, max_score: int) -> None:
        self.max_score = max_score
        self.score = 0

    def apply(self, delta: int) -> None:
        self.score = min(self.max_score, max(0, self.score + delta))

    def scale(self, timeout: float) -> float:
        return timeout * (self.score + 1)
