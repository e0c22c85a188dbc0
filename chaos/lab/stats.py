"""Percentiles for reports (nearest rank), shared by the chaos reports and the benchmarks."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]
