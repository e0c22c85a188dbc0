"""Lifeguard suspicion timeout (Dadgar et al. 2017, section 4.2; memberlist
suspicion.go).

A suspicion starts at the maximum timeout and shrinks towards the minimum as
independent members confirm it: ``max - (max - min) * log(c + 1) / log(k + 1)``
after ``c`` of ``k`` expected confirmations. A lone slow prober thus waits
long before declaring death, while a member many peers cannot reach is
declared dead quickly.
"""

from __future__ import annotations

import math


class Suspicion:
    def __init__(
        self, source: str, started: float, expected: int, min_timeout: float, max_timeout: float
    ) -> None:
        self.sources = {source}
        self.started = started
        self.expected = expected
        self.min_timeout = min_timeout
        self.max_timeout = max_timeout

    @property
    def confirmations(self) -> int:
        return len(self.sources) - 1

    def confirm(self, source: str) -> bool:
        """Count ``source``; True when it is a new, independent confirmation."""
        if source in self.sources or self.confirmations >= self.expected:
            return False
        self.sources.add(source)
        return True

    def timeout(self) -> float:
        if self.expected < 1:
            return self.min_timeout
        fraction = math.log(self.confirmations + 1) / math.log(self.expected + 1)
        return max(
            self.min_timeout, self.max_timeout - (self.max_timeout - self.min_timeout) * fraction
        )

    def deadline(self) -> float:
        return self.started + self.timeout()
