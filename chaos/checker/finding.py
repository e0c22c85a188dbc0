"""What one invariant found, as a run's result reports it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The ids of a finding's units listed in a result: the first few to look up.
SHOWN = 20


@dataclass(frozen=True)
class Finding:
    """``name``: what was judged; ``ids``: the units that break it, in
    order (None: a tally, which names no units); ``figures``: what it
    reports beside them, by their keys in the result."""

    name: str
    ids: tuple[str, ...] | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)

    def result(self) -> dict[str, Any]:
        """Its keys in a run's result: how many (``<name>``) and the first
        ids (``<name>_ids``), then its figures."""
        if self.ids is None:
            return dict(self.figures)
        return {
            self.name: len(self.ids),
            f"{self.name}_ids": list(self.ids[:SHOWN]),
            **self.figures,
        }
