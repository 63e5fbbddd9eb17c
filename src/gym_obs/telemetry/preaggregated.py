"""Pre-aggregated instruments: histograms and counters summed in-process, read by the SDK's readers.

The SDK's ``Histogram.record`` costs several microseconds (attribute validation and hashing, exemplar
sampling, the measurement object); a model call records four to six measurements, which alone is more than
the model-call layer's whole budget. These instruments keep one small state per attribute set (bucket counts,
sum, count, min, max) and cost a dict lookup, a lock and a bisect per measurement. At export the meter
provider's readers get them as ordinary SDK metric data (cumulative or delta, as each reader prefers), next
to the SDK's own metrics and under the same resource and instrumentation scope, so every exporter (OTLP,
Prometheus, the file sink, the in-memory reader of tests) sees no difference.

What they do not do: views do not apply to them and they carry no exemplars. Attribute dicts should come
from a :class:`gym_obs.telemetry.metrics.AttributeCache` (one shared dict per label combination): series are
found by the dict's identity first and by its contents otherwise, so fresh dicts work too, only slower.

:func:`attach` installs them on an SDK meter by wrapping each reader's collect callback (``_collect``, the
one SDK-internal hook used); a meter that is not the SDK's gets None and callers use SDK instruments.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)

__all__ = ["PreAggregatedCounter", "PreAggregatedHistogram", "PreAggregation", "attach"]

#: Attribute-dict identities remembered per instrument before the map is rebuilt (series themselves stay).
_MAX_IDENTITIES: Final = 4096
#: Distinct attribute sets per instrument; beyond this a measurement is dropped (labels must be bounded).
MAX_SERIES: Final = 2048

_INF: Final = float("inf")
_CUMULATIVE: Final = AggregationTemporality.CUMULATIVE
_DELTA: Final = AggregationTemporality.DELTA


class _Series:
    """One attribute set's running totals (and, for delta readers, the window since the last export)."""

    __slots__ = ("attributes", "count", "counts", "max", "min", "start_ns", "sum", "window_max", "window_min")

    def __init__(self, attributes: Mapping[str, Any], buckets: int) -> None:
        self.attributes = dict(attributes)
        self.counts = [0] * buckets
        self.count = 0
        self.sum: float = 0
        self.min = float("inf")
        self.max = float("-inf")
        self.window_min = float("inf")
        self.window_max = float("-inf")
        self.start_ns = time.time_ns()


class _Instrument:
    """The series lookup shared by both kinds."""

    __slots__ = ("_buckets", "_by_id", "_by_value", "_lock", "description", "name", "unit")

    def __init__(self, name: str, unit: str, description: str, buckets: int, lock: threading.Lock) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self._buckets = buckets
        self._lock = lock
        # id(attributes dict) -> (the dict, kept alive so the id stays its own, series)
        self._by_id: dict[int, tuple[Mapping[str, Any], _Series]] = {}
        self._by_value: dict[frozenset[tuple[str, Any]], _Series] = {}

    def _series(self, attributes: Mapping[str, Any]) -> _Series | None:
        key = frozenset(attributes.items())
        series = self._by_value.get(key)
        if series is None:
            if len(self._by_value) >= MAX_SERIES:
                return None
            series = self._by_value[key] = _Series(attributes, self._buckets)
        if len(self._by_id) >= _MAX_IDENTITIES:
            self._by_id.clear()
        self._by_id[id(attributes)] = (attributes, series)
        return series

    def snapshot(self) -> list[_Series]:
        return list(self._by_value.values())


class PreAggregatedHistogram(_Instrument):
    """A histogram with explicit bucket boundaries, aggregated in-process (``record`` like the SDK's)."""

    __slots__ = ("boundaries",)

    def __init__(
        self, name: str, unit: str, description: str, boundaries: Sequence[float], lock: threading.Lock
    ) -> None:
        super().__init__(name, unit, description, len(boundaries) + 1, lock)
        self.boundaries = tuple(float(b) for b in boundaries)

    def record(self, amount: float, attributes: Mapping[str, Any]) -> None:
        if not 0 <= amount < _INF:  # the SDK drops negative and non-finite values too
            return
        entry = self._by_id.get(id(attributes))
        with self._lock:
            if entry is not None and entry[0] is attributes:
                series: _Series | None = entry[1]
            else:
                series = self._series(attributes)
                if series is None:
                    return
            assert series is not None
            # Prometheus buckets are upper-inclusive ("le"), as the SDK's are.
            series.counts[bisect_left(self.boundaries, amount)] += 1
            series.count += 1
            series.sum += amount
            # only the window's extremes here; they are folded into the running ones at export
            if amount < series.window_min:
                series.window_min = amount
            if amount > series.window_max:
                series.window_max = amount


class PreAggregatedCounter(_Instrument):
    """A monotonic counter aggregated in-process (``add`` like the SDK's)."""

    __slots__ = ()

    def __init__(self, name: str, unit: str, description: str, lock: threading.Lock) -> None:
        super().__init__(name, unit, description, 0, lock)

    def add(self, amount: float, attributes: Mapping[str, Any]) -> None:
        if not 0 <= amount < _INF:
            return
        entry = self._by_id.get(id(attributes))
        with self._lock:
            if entry is not None and entry[0] is attributes:
                series: _Series | None = entry[1]
            else:
                series = self._series(attributes)
                if series is None:
                    return
            assert series is not None
            series.count += 1
            series.sum += amount


class _ReaderView:
    """What one reader was last given, so a delta reader gets only what happened since."""

    __slots__ = ("last", "last_ns")

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], tuple[int, float, list[int]]] = {}
        self.last_ns = time.time_ns()


class PreAggregation:
    """The pre-aggregated instruments of one meter and the readers they are exported to."""

    def __init__(self, scope: Any, resource: Any) -> None:
        self._lock = threading.Lock()
        self._scope = scope
        self._resource = resource
        self._instruments: list[PreAggregatedHistogram | PreAggregatedCounter] = []
        self._views: dict[int, _ReaderView] = {}

    def histogram(
        self, name: str, unit: str, description: str, boundaries: Sequence[float]
    ) -> PreAggregatedHistogram:
        instrument = PreAggregatedHistogram(name, unit, description, boundaries, self._lock)
        self._instruments.append(instrument)
        return instrument

    def counter(self, name: str, unit: str, description: str) -> PreAggregatedCounter:
        instrument = PreAggregatedCounter(name, unit, description, self._lock)
        self._instruments.append(instrument)
        return instrument

    def metrics_for(self, reader: Any) -> list[Metric]:
        """Metric data for ``reader`` in the temporality it prefers (per instrument kind)."""
        temporalities = getattr(reader, "_instrument_class_temporality", {})
        view = self._views.setdefault(id(reader), _ReaderView())
        now = time.time_ns()
        metrics: list[Metric] = []
        with self._lock:
            for instrument in self._instruments:
                histogram = isinstance(instrument, PreAggregatedHistogram)
                temporality = _temporality(temporalities, SdkHistogram if histogram else SdkCounter)
                points: list[Any] = []
                if histogram:
                    for series in instrument.snapshot():
                        series.min = min(series.min, series.window_min)
                        series.max = max(series.max, series.window_max)
                for series in instrument.snapshot():
                    point = _point(instrument, series, temporality, view, now)
                    if point is not None:
                        points.append(point)
                if histogram:
                    for series in instrument.snapshot():
                        if temporality == _DELTA:
                            series.window_min, series.window_max = float("inf"), float("-inf")
                if not points:
                    continue
                data: Any = (
                    Histogram(data_points=points, aggregation_temporality=temporality)
                    if histogram
                    else Sum(data_points=points, aggregation_temporality=temporality, is_monotonic=True)
                )
                metrics.append(
                    Metric(
                        name=instrument.name,
                        description=instrument.description,
                        unit=instrument.unit,
                        data=data,
                    )
                )
        view.last_ns = now
        return metrics

    def merge_into(self, data: MetricsData | None, reader: Any) -> MetricsData | None:
        """``data`` (what the SDK collected for ``reader``) with these instruments' metrics added."""
        metrics = self.metrics_for(reader)
        if not metrics:
            return data
        scope = ScopeMetrics(scope=self._scope, metrics=metrics, schema_url="")
        if data is None or not data.resource_metrics:
            return MetricsData(resource_metrics=[ResourceMetrics(self._resource, [scope], "")])
        first, *rest = data.resource_metrics
        merged: list[ScopeMetrics] = []
        added = False
        for existing in first.scope_metrics:
            if not added and existing.scope == self._scope:
                existing = ScopeMetrics(existing.scope, [*existing.metrics, *metrics], existing.schema_url)
                added = True
            merged.append(existing)
        if not added:
            merged.append(scope)
        return MetricsData(
            resource_metrics=[ResourceMetrics(first.resource, merged, first.schema_url), *rest]
        )


def _temporality(temporalities: Mapping[type, AggregationTemporality], kind: type) -> AggregationTemporality:
    """The reader's temporality for ``kind`` (its keys are private SDK subclasses of the public ones)."""
    for cls, temporality in temporalities.items():
        if isinstance(cls, type) and issubclass(cls, kind):
            return temporality
    return _CUMULATIVE


def _point(
    instrument: PreAggregatedHistogram | PreAggregatedCounter,
    series: _Series,
    temporality: AggregationTemporality,
    view: _ReaderView,
    now: int,
) -> Any:
    key = (instrument.name, id(series))
    delta = temporality == _DELTA
    start = max(view.last_ns, series.start_ns) if delta else series.start_ns
    count, total = series.count, series.sum
    if isinstance(instrument, PreAggregatedCounter):
        if delta:
            previous = view.last.get(key, (0, 0.0, []))
            view.last[key] = (count, total, [])
            if count == previous[0]:
                return None
            total -= previous[1]
        return NumberDataPoint(
            attributes=series.attributes, start_time_unix_nano=start, time_unix_nano=now, value=total
        )
    counts = list(series.counts)
    low, high = series.min, series.max
    if delta:
        previous = view.last.get(key, (0, 0.0, [0] * len(counts)))
        view.last[key] = (count, total, counts)
        if count == previous[0]:
            return None
        count -= previous[0]
        total -= previous[1]
        counts = [a - b for a, b in zip(counts, previous[2], strict=True)]
        low, high = series.window_min, series.window_max
    return HistogramDataPoint(
        attributes=series.attributes,
        start_time_unix_nano=start,
        time_unix_nano=now,
        count=count,
        sum=total,
        bucket_counts=counts,
        explicit_bounds=instrument.boundaries,
        min=low,
        max=high,
    )


_ATTACHED_LOCK: Final = threading.Lock()


def attach(meter: Any) -> PreAggregation | None:
    """A :class:`PreAggregation` exported through ``meter``'s provider's readers; None if ``meter`` is not
    an SDK meter (the caller then records to ordinary instruments)."""
    consumer = getattr(meter, "_measurement_consumer", None)
    storages = getattr(consumer, "_reader_storages", None)
    config = getattr(consumer, "_sdk_config", None)
    scope = getattr(meter, "_instrumentation_scope", None)
    if not isinstance(storages, Mapping) or config is None or scope is None:
        return None
    readers = list(storages)
    if not all(callable(getattr(reader, "_collect", None)) for reader in readers):
        return None
    aggregation = PreAggregation(scope, config.resource)
    with _ATTACHED_LOCK:
        for reader in readers:
            reader._collect = _wrapped(reader._collect, aggregation)
    return aggregation


def _wrapped(
    inner: Callable[..., MetricsData | None], aggregation: PreAggregation
) -> Callable[..., MetricsData | None]:
    def collect(reader: Any, timeout_millis: float = 10_000) -> MetricsData | None:
        data = inner(reader, timeout_millis=timeout_millis)
        try:
            return aggregation.merge_into(data, reader)
        except Exception:  # telemetry never stops the program; the SDK's own metrics still go out
            return data

    return collect
