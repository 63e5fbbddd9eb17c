"""In-process telemetry capture for tests: real SDK providers, in-memory exporter and reader.

OpenTelemetry lets a process set its global providers once, so the providers are installed once per process
and each capture only resets what it reads: finished spans are cleared on entry, and metrics use DELTA
temporality for synchronous instruments so a capture sees exactly what was recorded while it was active
(reads are accumulated inside the :class:`Capture`, which makes them look cumulative from its start).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    InMemoryMetricReader,
    Sum,
)
from opentelemetry.sdk.metrics.export import (
    Histogram as HistogramData,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

from gym_obs.telemetry import _override, names
from gym_obs.telemetry._state import STATE, TelemetryState
from gym_obs.telemetry.metrics import instruments_for

__all__ = ["Capture", "MetricPoint", "capture_telemetry", "points_by_attributes", "telemetry_state"]

TEST_SERVER_NAME: Final = "test"


@dataclass(frozen=True)
class MetricPoint:
    """One aggregated data point. Sums and gauges fill ``value``; histograms fill the other fields."""

    attributes: dict[str, Any]
    value: int | float | None = None
    count: int = 0
    sum: float = 0.0
    bucket_counts: tuple[int, ...] = ()
    explicit_bounds: tuple[float, ...] = ()
    min: float | None = None
    max: float | None = None
    #: The span id of each exemplar the point carried, in every collection merged into it.
    exemplar_spans: tuple[int | None, ...] = ()


@dataclass
class _Metric:
    unit: str
    points: dict[frozenset[tuple[str, Any]], MetricPoint] = field(default_factory=dict)


@dataclass(frozen=True)
class _Installed:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    span_exporter: InMemorySpanExporter
    metric_reader: InMemoryMetricReader


_LOCK: Final = threading.Lock()
_installed: _Installed | None = None


def _install() -> _Installed:
    """Install (once) the in-memory exporter and reader, reusing SDK providers a test already set."""
    global _installed
    with _LOCK:
        if _installed is not None:
            return _installed
        resource = Resource.create(
            {
                names.SERVICE_NAME: names.SERVICE_NAME_PREFIX + TEST_SERVER_NAME,
                names.SERVICE_INSTANCE_ID: str(uuid.uuid4()),
                names.ATTR_SERVER_NAME: TEST_SERVER_NAME,
            }
        )
        exporter = InMemorySpanExporter()
        current_tp = trace.get_tracer_provider()
        if isinstance(current_tp, TracerProvider):
            tracer_provider = current_tp
        else:
            tracer_provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
            _override.TEST_PROVIDER_IDS.add(id(tracer_provider))
            trace.set_tracer_provider(tracer_provider)
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        delta = AggregationTemporality.DELTA
        reader = InMemoryMetricReader(
            preferred_temporality={Counter: delta, UpDownCounter: delta, Histogram: delta}
        )
        meter_provider = MeterProvider(metric_readers=[reader], resource=resource)
        _override.TEST_PROVIDER_IDS.add(id(meter_provider))
        if not isinstance(otel_metrics.get_meter_provider(), MeterProvider):
            otel_metrics.set_meter_provider(meter_provider)
        _installed = _Installed(tracer_provider, meter_provider, exporter, reader)
        return _installed


class Capture:
    """What telemetry a test produced: finished spans and metric points recorded while it was active."""

    def __init__(self, installed: _Installed) -> None:
        self._installed = installed
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    @property
    def tracer_provider(self) -> TracerProvider:
        return self._installed.tracer_provider

    @property
    def meter_provider(self) -> MeterProvider:
        return self._installed.meter_provider

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Finished spans in end order, optionally only those called ``name``."""
        finished = self._installed.span_exporter.get_finished_spans()
        return [s for s in finished if name is None or s.name == name]

    def metric_points(self, name: str) -> list[MetricPoint]:
        """Points of metric ``name`` recorded since the capture started (or was cleared)."""
        self.collect()
        metric = self._metrics.get(name)
        return list(metric.points.values()) if metric is not None else []

    def metric_unit(self, name: str) -> str | None:
        """The unit metric ``name`` was created with, if it was recorded."""
        self.collect()
        metric = self._metrics.get(name)
        return metric.unit if metric is not None else None

    def metric_names(self) -> set[str]:
        self.collect()
        return set(self._metrics)

    def clear(self) -> None:
        """Forget everything captured so far."""
        with self._lock:
            self._installed.span_exporter.clear()
            self._installed.metric_reader.get_metrics_data()
            self._metrics.clear()

    def collect(self) -> None:
        """Pull new metric data from the reader into this capture."""
        with self._lock:
            data = self._installed.metric_reader.get_metrics_data()
            if data is None:
                return
            for resource_metrics in data.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        stored = self._metrics.setdefault(metric.name, _Metric(unit=metric.unit or ""))
                        _merge(stored, metric.data)


def _merge(stored: _Metric, data: Any) -> None:
    for point in data.data_points:
        attributes = dict(point.attributes or {})
        key = frozenset(attributes.items())
        old = stored.points.get(key)
        delta = getattr(data, "aggregation_temporality", None) == AggregationTemporality.DELTA
        spans = tuple(exemplar.span_id for exemplar in getattr(point, "exemplars", None) or ())
        if delta and old is not None:
            spans = old.exemplar_spans + spans
        if isinstance(data, HistogramData):
            new = MetricPoint(
                attributes=attributes,
                count=point.count,
                sum=point.sum,
                bucket_counts=tuple(point.bucket_counts),
                explicit_bounds=tuple(point.explicit_bounds),
                min=point.min,
                max=point.max,
                exemplar_spans=spans,
            )
            if delta and old is not None and old.explicit_bounds == new.explicit_bounds:
                new = MetricPoint(
                    attributes=attributes,
                    count=old.count + new.count,
                    sum=old.sum + new.sum,
                    bucket_counts=tuple(
                        a + b for a, b in zip(old.bucket_counts, new.bucket_counts, strict=True)
                    ),
                    explicit_bounds=new.explicit_bounds,
                    min=_pick(min, old.min, new.min),
                    max=_pick(max, old.max, new.max),
                    exemplar_spans=spans,
                )
        elif isinstance(data, Sum | Gauge):
            value = point.value
            if delta and old is not None and old.value is not None:
                value = old.value + value
            new = MetricPoint(attributes=attributes, value=value, exemplar_spans=spans)
        else:  # exponential histograms are not used by gym_obs
            continue
        stored.points[key] = new


def _pick(fn: Any, a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    result: float = fn(a, b)
    return result


@contextmanager
def capture_telemetry() -> Iterator[Capture]:
    """Turn telemetry on for the block, recording into memory; restore ``STATE`` afterwards."""
    installed = _install()
    capture = Capture(installed)
    capture.clear()
    snapshot = STATE.snapshot()
    _override.enter_capture()
    try:
        STATE.tracer = installed.tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE)
        STATE.instruments = instruments_for(installed.meter_provider.get_meter(names.INSTRUMENTATION_SCOPE))
        STATE.server_name = STATE.server_name or TEST_SERVER_NAME
        STATE.traces_enabled = True
        STATE.enabled = True
        yield capture
    finally:
        STATE.restore(snapshot)
        _override.exit_capture()


def points_by_attributes(points: list[MetricPoint]) -> Mapping[frozenset[tuple[str, Any]], MetricPoint]:
    """Index points by their attribute set, for assertions on one label combination."""
    return {frozenset(p.attributes.items()): p for p in points}


def telemetry_state() -> TelemetryState:
    """The process-wide switch every instrumented site checks (``enabled``, ``tracer``, ``instruments``...).

    The public seam for tests that read it, or flip one field for a block and restore it afterwards (a
    ``finally``, or ``snapshot()``/``restore()``); :func:`capture_telemetry` and ``setup_telemetry`` are what
    write it otherwise.
    """
    return STATE
