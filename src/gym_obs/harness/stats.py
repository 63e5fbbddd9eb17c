"""Quantiles for the progress bar and the summary: exact from samples, streamed in fixed memory by a
sketch with a stated relative error, or estimated from histogram buckets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

__all__ = [
    "QUANTILE_PRECISION",
    "LatencyWindow",
    "QuantileSketch",
    "bucket_quantile",
    "quantile",
    "quantiles",
]


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


class QuantileSketch:
    """Count, min, max and quantiles of a stream of non-negative values in fixed memory.

    The first ``EXACT_LIMIT`` values are kept as they are, so a short run's quantiles are exact (the same
    linear interpolation as :func:`quantile`). Past that, values go into logarithmic buckets of ratio
    ``gamma = (1 + a) / (1 - a)`` with ``a = RELATIVE_ERROR`` (the DDSketch rule): every order statistic
    is estimated within a relative error of ``a``, and so is any interpolated quantile (a convex
    combination of two of them). Values below ``MIN_POSITIVE`` share one zero bucket (absolute error below
    ``MIN_POSITIVE``), values above ``MAX_VALUE`` share the top bucket, so there are at most ~1,900 buckets
    however long the run. Count, min and max are always exact; non-finite values are ignored and negative
    ones count as 0 (durations).
    """

    EXACT_LIMIT: Final = 1024
    RELATIVE_ERROR: Final = 0.01
    MIN_POSITIVE: Final = 1e-9
    MAX_VALUE: Final = 1e7

    _GAMMA: Final = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
    _LOG_GAMMA: Final = math.log(_GAMMA)

    def __init__(self) -> None:
        self.count = 0
        self.min: float | None = None
        self.max: float | None = None
        self._exact: list[float] | None = []
        self._sorted = True
        self._zeros = 0
        self._buckets: dict[int, int] = {}

    def __len__(self) -> int:
        return self.count

    @property
    def exact(self) -> bool:
        """Whether quantiles are still computed from every value."""
        return self._exact is not None

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            return
        value = max(float(value), 0.0)
        self.count += 1
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)
        if self._exact is None:
            self._bucket(value)
            return
        self._exact.append(value)
        self._sorted = False
        if len(self._exact) > self.EXACT_LIMIT:
            for kept in self._exact:
                self._bucket(kept)
            self._exact = None

    def _bucket(self, value: float) -> None:
        if value < self.MIN_POSITIVE:
            self._zeros += 1
            return
        index = math.ceil(math.log(min(value, self.MAX_VALUE)) / self._LOG_GAMMA)
        self._buckets[index] = self._buckets.get(index, 0) + 1

    def _order_statistics(self, ranks: Sequence[int]) -> list[float]:
        """Estimates of the values at the given 0-based ranks (ascending)."""
        found: list[float] = []
        wanted = iter(ranks)
        rank = next(wanted, None)
        seen = self._zeros
        while rank is not None and rank < seen:
            found.append(0.0)
            rank = next(wanted, None)
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            while rank is not None and rank < seen:
                found.append(2.0 * self._GAMMA**index / (self._GAMMA + 1.0))
                rank = next(wanted, None)
        return found

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (linear interpolation between order statistics), ``None`` for no values."""
        if self._exact is not None:
            if not self._sorted:
                self._exact.sort()
                self._sorted = True
            return quantile(self._exact, q)
        if self.count == 0 or self.min is None or self.max is None:
            return None
        if q <= 0.0 or q >= 1.0:
            return self.min if q <= 0.0 else self.max
        position = (self.count - 1) * min(max(q, 0.0), 1.0)
        low = math.floor(position)
        high = min(low + 1, self.count - 1)
        low_value, high_value = self._order_statistics([low, high])
        estimate = low_value + (high_value - low_value) * (position - low)
        return min(max(estimate, self.min), self.max)

    def summary(self) -> dict[str, float | None]:
        """count, p50, p90, p99 and max, the shape :func:`quantiles` returns."""
        return {
            "count": self.count,
            "p50": self.quantile(0.50),
            "p90": self.quantile(0.90),
            "p99": self.quantile(0.99),
            "max": self.max,
        }


#: What the summary states about its quantiles.
QUANTILE_PRECISION: Final = {
    "exact_up_to": QuantileSketch.EXACT_LIMIT,
    "relative_error": QuantileSketch.RELATIVE_ERROR,
}


class LatencyWindow(QuantileSketch):
    """Rollout latencies for the live progress bar (fixed memory, however long the run)."""
