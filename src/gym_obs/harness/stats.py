"""Quantiles for the progress bar and the summary: exact from samples, estimated from histogram buckets."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["LatencyWindow", "bucket_quantile", "quantile", "quantiles"]


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile of already sorted values (``None`` for no values)."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    position = (len(sorted_values) - 1) * min(max(q, 0.0), 1.0)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction)


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """count, p50, p90, p99 and max of ``values`` (unsorted)."""
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50": quantile(ordered, 0.50),
        "p90": quantile(ordered, 0.90),
        "p99": quantile(ordered, 0.99),
        "max": float(ordered[-1]) if ordered else None,
    }


def bucket_quantile(
    bounds: Sequence[float], counts: Sequence[int], q: float, *, low: float = 0.0, high: float | None = None
) -> float | None:
    """Estimate a quantile from explicit-bucket histogram counts (as Prometheus' histogram_quantile does).

    ``counts`` has ``len(bounds) + 1`` entries; the last bucket is open, so a quantile that falls in it is
    reported as ``high`` (the recorded max) or the last bound.
    """
    total = sum(counts)
    if total <= 0 or len(counts) != len(bounds) + 1:
        return None
    rank = q * total
    seen = 0.0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index == len(bounds):
                return high if high is not None else (bounds[-1] if bounds else None)
            upper = bounds[index]
            lower = bounds[index - 1] if index else low
            if high is not None:
                upper = min(upper, high)
            lower = min(lower, upper)
            return lower + (upper - lower) * ((rank - seen) / count)
        seen += count
    return high


class LatencyWindow:
    """Rollout latencies for the live progress bar; quantiles are recomputed at most once per refresh."""

    def __init__(self) -> None:
        self._values: list[float] = []
        self._sorted = True

    def add(self, value: float) -> None:
        self._values.append(value)
        self._sorted = False

    def __len__(self) -> int:
        return len(self._values)

    def quantile(self, q: float) -> float | None:
        if not self._sorted:
            self._values.sort()
            self._sorted = True
        return quantile(self._values, q)

    def values(self) -> list[float]:
        return list(self._values)
