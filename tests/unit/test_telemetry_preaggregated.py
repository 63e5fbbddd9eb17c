"""Pre-aggregated instruments reach real SDK readers as ordinary metric data, cumulative and delta."""

from __future__ import annotations

from typing import Any

from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)

from gym_obs.telemetry.metrics import AttributeCache
from gym_obs.telemetry.preaggregated import PreAggregatedHistogram, attach


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource_metrics in data.resource_metrics if data is not None else ():
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def _provider(temporality: AggregationTemporality) -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality, Counter: temporality})
    return MeterProvider(metric_readers=[reader]), reader


def test_cumulative_histogram_and_counter_next_to_the_sdks_own_metrics() -> None:
    provider, reader = _provider(AggregationTemporality.CUMULATIVE)
    meter = provider.get_meter("gym_obs")
    pre = attach(meter)
    assert pre is not None
    hist = pre.histogram("h", "s", "a histogram", (0.1, 1.0))
    count = pre.counter("c", "{x}", "a counter")
    meter.create_counter("sdk").add(3)
    attrs = AttributeCache("k").get("v")
    for value in (0.05, 0.1, 0.5, 7.0):
        hist.record(value, attrs)
    hist.record(-1.0, attrs)  # dropped, as the SDK drops it
    hist.record(float("nan"), attrs)
    count.add(2, attrs)
    count.add(1, {"k": "v"})  # an equal fresh dict lands in the same series

    points = _points(reader)
    assert [p.value for p in points["sdk"]] == [3]
    (point,) = points["h"]
    assert isinstance(point, HistogramDataPoint)
    assert dict(point.attributes) == {"k": "v"}
    assert (point.count, point.sum, list(point.bucket_counts)) == (4, 7.65, [2, 1, 1])
    assert (point.min, point.max, tuple(point.explicit_bounds)) == (0.05, 7.0, (0.1, 1.0))
    (total,) = points["c"]
    assert isinstance(total, NumberDataPoint) and total.value == 3

    hist.record(0.2, attrs)
    again = _points(reader)
    assert again["h"][0].count == 5 and again["c"][0].value == 3  # cumulative: totals keep growing


def test_delta_readers_get_only_what_happened_since_their_last_collection() -> None:
    provider, reader = _provider(AggregationTemporality.DELTA)
    pre = attach(provider.get_meter("gym_obs"))
    assert pre is not None
    hist = pre.histogram("h", "s", "", (1.0,))
    count = pre.counter("c", "", "")
    attrs = {"k": "v"}
    hist.record(0.5, attrs)
    count.add(1, attrs)
    first = _points(reader)
    assert first["h"][0].count == 1 and first["c"][0].value == 1
    assert _points(reader) == {}  # nothing new: no points at all
    hist.record(3.0, attrs)
    (point,) = _points(reader)["h"]
    assert (point.count, point.sum, list(point.bucket_counts), point.min, point.max) == (
        1,
        3.0,
        [0, 1],
        3.0,
        3.0,
    )


def test_series_are_bounded_and_a_non_sdk_meter_gets_none() -> None:
    provider, reader = _provider(AggregationTemporality.CUMULATIVE)
    pre = attach(provider.get_meter("gym_obs"))
    assert pre is not None
    hist = pre.histogram("h", "s", "", (1.0,))
    assert isinstance(hist, PreAggregatedHistogram)
    for n in range(3000):
        hist.record(0.5, {"k": str(n)})
    assert len(_points(reader)["h"]) == 2048  # labels must be bounded; the rest is dropped, not grown
    assert attach(NoOpMeter("x")) is None
