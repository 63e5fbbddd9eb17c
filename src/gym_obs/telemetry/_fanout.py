"""One metric reader for several push exporters: every point is aggregated once, however many outputs.

Why: the SDK aggregates each measurement once per reader, so the file sink plus OTLP as two readers doubled
the cost of every point on the request path. :func:`fan_in` gives one exporter per reader: exporters that
want the same temporality and aggregation (the usual case: all cumulative) share one reader through a
:class:`FanOutMetricExporter`; only exporters that want different data get a reader of their own.

The fan-out never blocks the reader and one exporter cannot hold up another: each exporter has its own
worker thread and a bounded queue of collections (the oldest is dropped when an exporter falls behind --
with cumulative data the next collection carries everything). Flush and shutdown wait for the queues to
drain within their timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.sdk.metrics import Histogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import DefaultAggregation, ExplicitBucketHistogramAggregation

__all__ = ["FanOutMetricExporter", "fan_in"]

_LOG: Final = logging.getLogger("gym_obs.telemetry")
DEFAULT_QUEUE_SIZE: Final = 4  # collections come every 10 s: a healthy exporter never has a backlog


def _aggregation_key(kind: type, aggregation: Any) -> str | None:
    """None for what the reader would do anyway; else a description to compare by value."""
    if aggregation is None or isinstance(aggregation, DefaultAggregation):
        return None
    if (
        issubclass(kind, Histogram)
        and type(aggregation) is ExplicitBucketHistogramAggregation
        and getattr(aggregation, "_boundaries", None) is None
        and getattr(aggregation, "_record_min_max", True)
    ):
        return None  # what the default aggregation of a histogram is (advisory boundaries honoured)
    return f"{type(aggregation).__qualname__}{sorted(vars(aggregation).items())!r}"


def preferences(exporter: MetricExporter) -> tuple[tuple[str, str], ...]:
    """What a reader built for ``exporter`` would collect differently from the defaults (cumulative,
    default aggregations); exporters with equal preferences can share one reader."""
    differences: list[tuple[str, str]] = []
    for kind, temporality in (exporter._preferred_temporality or {}).items():
        if temporality is not AggregationTemporality.CUMULATIVE:
            differences.append((f"temporality:{kind.__qualname__}", str(temporality)))
    for kind, aggregation in (exporter._preferred_aggregation or {}).items():
        key = _aggregation_key(kind, aggregation)
        if key is not None:
            differences.append((f"aggregation:{kind.__qualname__}", key))
    return tuple(sorted(differences))


def fan_in(
    exporters: Sequence[MetricExporter], *, queue_size: int = DEFAULT_QUEUE_SIZE
) -> list[MetricExporter]:
    """One exporter per reader to build: exporters with the same preferences behind one fan-out."""
    groups: dict[tuple[tuple[str, str], ...], list[MetricExporter]] = {}
    for exporter in exporters:
        groups.setdefault(preferences(exporter), []).append(exporter)
    return [
        group[0] if len(group) == 1 else FanOutMetricExporter(group, queue_size=queue_size)
        for group in groups.values()
    ]


class _Lane:
    """One exporter's worker thread and bounded queue of collections."""

    def __init__(self, exporter: MetricExporter, queue_size: int) -> None:
        self.exporter = exporter
        self._pending: deque[tuple[MetricsData, float]] = deque()
        self._queue_size = max(queue_size, 1)
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._pid = -1
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def _ensure_worker(self) -> None:
        """Start the worker (again after a fork: the child has no threads). Called with the lock held."""
        if self._pid != os.getpid() or self._thread is None:
            self._pid = os.getpid()
            self._busy = False
            self._thread = threading.Thread(target=self._run, name="gym-obs-metric-fanout", daemon=True)
            self._thread.start()

    def offer(self, data: MetricsData, timeout_millis: float) -> bool:
        with self._cond:
            if self._closed:
                return False
            self._ensure_worker()
            if len(self._pending) >= self._queue_size:
                self._pending.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    _LOG.warning(
                        "a metric exporter is falling behind; older collections are dropped for it "
                        "(the other outputs are unaffected)"
                    )
            self._pending.append((data, timeout_millis))
            self._cond.notify_all()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return  # closed and drained
                data, timeout_millis = self._pending.popleft()
                self._busy = True
            try:
                self.exporter.export(data, timeout_millis=timeout_millis)
            except Exception:  # the exporters are wrapped already; this lane must survive anything
                _LOG.debug("metric export raised", exc_info=True)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def drain(self, deadline: float) -> bool:
        """Wait until every queued collection was handed to the exporter, or ``deadline``."""
        with self._cond:
            while self._pending or self._busy:
                if self._thread is None or self._pid != os.getpid():
                    return not self._pending
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, deadline: float) -> bool:
        drained = self.drain(deadline)
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
            thread = self._thread if self._pid == os.getpid() else None
        if thread is not None:
            thread.join(max(deadline - time.monotonic(), 0.0))
        return drained


class FanOutMetricExporter(MetricExporter):
    """Hands each collection of one reader to several exporters (same preferences; see :func:`fan_in`)."""

    def __init__(self, exporters: Sequence[MetricExporter], *, queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        if not exporters:
            raise ValueError("a fan-out needs at least one exporter")
        first = exporters[0]
        super().__init__(
            preferred_temporality=first._preferred_temporality,
            preferred_aggregation=first._preferred_aggregation,
        )
        self._lanes = [_Lane(exporter, queue_size) for exporter in exporters]

    @property
    def exporters(self) -> list[MetricExporter]:
        return [lane.exporter for lane in self._lanes]

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        accepted = [lane.offer(metrics_data, timeout_millis) for lane in self._lanes]
        return MetricExportResult.SUCCESS if any(accepted) else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        drained = all([lane.drain(deadline) for lane in self._lanes])
        flushed = True
        for lane in self._lanes:
            remaining = max(deadline - time.monotonic(), 0.0) * 1000
            try:
                flushed = bool(lane.exporter.force_flush(timeout_millis=remaining)) and flushed
            except Exception:
                flushed = False
        return drained and flushed

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        # The periodic reader passes its remaining budget as ``timeout`` (milliseconds).
        budget_ms = float(kwargs.get("timeout", timeout_millis))
        deadline = time.monotonic() + max(budget_ms, 0.0) / 1000
        for lane in self._lanes:
            lane.close(deadline)
        for lane in self._lanes:
            remaining = max(deadline - time.monotonic(), 0.0) * 1000
            try:
                lane.exporter.shutdown(timeout_millis=remaining)
            except Exception:
                _LOG.debug("metric exporter shutdown raised", exc_info=True)
