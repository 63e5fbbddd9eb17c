"""Pre-aggregated instruments give readers what the SDK's own instruments give: points, exemplars, views.

Real SDK providers and in-memory readers only. The same measurements go into an SDK instrument and into its
pre-aggregated twin on one meter provider; the two points a reader collects must match field for field
(except the timestamps: each series starts when it is first measured, each collection reads its own clock).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    Counter,
    ExemplarFilter,
    Histogram,
    MeterProvider,
    TraceBasedExemplarFilter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import DropAggregation, View
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from gym_obs.telemetry import names
from gym_obs.telemetry._exemplars import RecordedSpanExemplarFilter
from gym_obs.telemetry.metrics import AttributeCache, Instruments
from gym_obs.telemetry.preaggregated import (
    PreAggregatedCounter,
    PreAggregatedHistogram,
    PreAggregatedUpDownCounter,
    attach,
)

CUMULATIVE, DELTA = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA
BOUNDS = (0.1, 1.0, 10.0)
REMOTE = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
TRACER = TracerProvider().get_tracer("t")


def _reader(temporality: AggregationTemporality) -> InMemoryMetricReader:
    kinds = (Counter, UpDownCounter, Histogram)
    return InMemoryMetricReader(preferred_temporality=dict.fromkeys(kinds, temporality))


def _metrics(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    found: dict[str, Any] = {}
    for resource_metrics in data.resource_metrics if data is not None else ():
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = metric
    return found


def _comparable(point: Any) -> dict[str, Any]:
    fields = dict(vars(point))
    fields.pop("start_time_unix_nano")
    fields.pop("time_unix_nano")  # each collection's own clock reading
    fields["attributes"] = dict(point.attributes)
    if "sum" in fields:  # a delta histogram's sum is a difference of running sums: equal up to rounding
        fields["sum"] = pytest.approx(fields["sum"], rel=1e-12)
    exemplars = [(e.value, e.span_id, e.trace_id, dict(e.filtered_attributes or {})) for e in point.exemplars]
    # A histogram keeps the last eligible measurement per bucket, exactly as the SDK's aligned reservoir;
    # a sum keeps one eligible measurement (the SDK picks it at random, gym the last): compare how many.
    fields["exemplars"] = exemplars if "bucket_counts" in fields else len(exemplars)
    for key in ("bucket_counts", "explicit_bounds"):
        if key in fields:
            fields[key] = list(fields[key])
    return fields


def _twins(
    exemplar_filter: ExemplarFilter, temporality: AggregationTemporality
) -> tuple[InMemoryMetricReader, dict[str, tuple[Any, Any]]]:
    """SDK instruments and their pre-aggregated twins (``pre.`` + name) on one provider."""
    reader = _reader(temporality)
    meter = MeterProvider(metric_readers=[reader], exemplar_filter=exemplar_filter).get_meter("gym_obs")
    pre = attach(meter)
    assert pre is not None
    twins = {
        "h": (
            meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=list(BOUNDS)),
            pre.histogram("pre.h", "s", "", BOUNDS),
        ),
        "c": (meter.create_counter("c", unit="1"), pre.counter("pre.c", "1", "")),
        "u": (meter.create_up_down_counter("u", unit="1"), pre.up_down_counter("pre.u", "1", "")),
    }
    return reader, twins


def _measure_both(twins: dict[str, tuple[Any, Any]], steps: list[tuple[str, float, str | None]]) -> None:
    attributes = AttributeCache("k")
    local = TRACER.start_span("local")
    places: dict[str | None, Any] = {
        None: None,
        "local": trace.set_span_in_context(local),
        "remote": trace.set_span_in_context(NonRecordingSpan(REMOTE)),
    }
    for kind, value, where in steps:
        token = context.attach(places[where]) if where is not None else None
        try:
            sdk, twin = twins[kind]
            for instrument in (sdk, twin):
                measure: Callable[..., None] = instrument.record if kind == "h" else instrument.add
                measure(value, attributes.get("a" if value < 5 else "b"))
        finally:
            if token is not None:
                context.detach(token)
    local.end()


STEPS: list[tuple[str, float, str | None]] = [
    ("h", 0.05, "local"),
    ("h", 0.5, None),
    ("h", 0.07, "remote"),
    ("h", 7.0, "local"),
    ("h", 0.1, "local"),  # upper-inclusive: the first bucket
    ("h", -1.0, "local"),  # dropped by both
    ("c", 2, "local"),
    ("c", 3, "remote"),
    ("c", -1, "local"),  # dropped by both
    ("u", 4, None),
    ("u", -6, "local"),
]


@pytest.mark.parametrize("temporality", [CUMULATIVE, DELTA])
@pytest.mark.parametrize(
    "exemplar_filter",
    [
        RecordedSpanExemplarFilter(),
        TraceBasedExemplarFilter(),
        AlwaysOnExemplarFilter(),
        AlwaysOffExemplarFilter(),
    ],
    ids=["recorded_span", "trace_based", "always_on", "always_off"],
)
def test_readers_get_the_sdks_points_and_exemplars(
    exemplar_filter: ExemplarFilter, temporality: AggregationTemporality
) -> None:
    reader, twins = _twins(exemplar_filter, temporality)
    for round_ in range(2):  # the second collection: what changed since (delta), exemplars since
        _measure_both(twins, STEPS if round_ == 0 else STEPS[:2])
        metrics = _metrics(reader)
        for name in twins:
            sdk, pre = metrics.get(name), metrics.get("pre." + name)
            if sdk is None:
                assert pre is None, (name, round_)  # delta, nothing new: no point from either
                continue
            assert pre is not None, (name, round_)
            assert (pre.unit, type(pre.data), pre.data.aggregation_temporality) == (
                sdk.unit,
                type(sdk.data),
                sdk.data.aggregation_temporality,
            )
            assert getattr(pre.data, "is_monotonic", None) == getattr(sdk.data, "is_monotonic", None)

            def key(point: Any) -> str:
                return str(point.attributes["k"])

            sdk_points = sorted(sdk.data.data_points, key=key)
            pre_points = sorted(pre.data.data_points, key=key)
            assert [_comparable(p) for p in pre_points] == [_comparable(p) for p in sdk_points], (
                name,
                round_,
            )


def test_a_bound_series_records_a_calls_points_with_one_exemplar_decision() -> None:
    reader = _reader(CUMULATIVE)
    provider = MeterProvider(metric_readers=[reader], exemplar_filter=RecordedSpanExemplarFilter())
    pre = attach(provider.get_meter("m"))
    assert pre is not None
    duration = pre.histogram("d", "s", "", BOUNDS).bind({"k": "v"})
    finishes = pre.counter("f", "1", "").bind({"k": "v"})
    never = pre.counter("n", "1", "").bind({"k": "v"})
    assert duration is not None and finishes is not None and never is not None
    with TRACER.start_as_current_span("server") as span:
        exemplar = pre.exemplar()
        pre.add_all([(duration, 0.5, exemplar), (finishes, 1, None)])
    assert pre.exemplar() is None  # no span now
    metrics = _metrics(reader)
    (point,) = metrics["d"].data.data_points
    assert (point.count, point.sum, list(point.bucket_counts)) == (1, 0.5, [0, 1, 0, 0])
    (kept,) = point.exemplars
    ids = span.get_span_context()
    assert (kept.span_id, kept.trace_id) == (ids.span_id, ids.trace_id)
    assert metrics["f"].data.data_points[0].exemplars == []
    assert "n" not in metrics  # bound but never measured: not a series yet, as with the SDK


def test_every_reader_gets_the_exemplars_made_since_its_own_last_collection() -> None:
    first, second = _reader(CUMULATIVE), _reader(DELTA)
    meter = MeterProvider(
        metric_readers=[first, second], exemplar_filter=RecordedSpanExemplarFilter()
    ).get_meter("m")
    pre = attach(meter)
    assert pre is not None
    histogram = pre.histogram("h", "s", "", BOUNDS)
    with TRACER.start_as_current_span("server"):
        histogram.record(0.5, {"k": "v"})
        histogram.record(0.6, {"k": "v"})  # same bucket: the last one is kept
    (point,) = _metrics(first)["h"].data.data_points
    assert [e.value for e in point.exemplars] == [0.6]
    (point,) = _metrics(first)["h"].data.data_points  # cumulative: the point again, no new exemplar
    assert point.count == 2 and point.exemplars == []
    (point,) = _metrics(second)["h"].data.data_points  # the other reader has not collected yet
    assert [e.value for e in point.exemplars] == [0.6]


def test_an_instrument_a_view_selects_stays_the_sdks_and_the_view_applies() -> None:
    reader = _reader(CUMULATIVE)
    drop = View(instrument_name=names.METRIC_HTTP_CLIENT_REQUEST_DURATION, aggregation=DropAggregation())
    rename = View(instrument_name=names.METRIC_CLIENT_RETRIES, name="renamed.retries")
    wildcard = View(instrument_name="gym.client.pool.conn*", aggregation=DropAggregation())
    provider = MeterProvider(metric_readers=[reader], views=[drop, rename, wildcard])
    instruments = Instruments(provider.get_meter(names.INSTRUMENTATION_SCOPE))
    assert not isinstance(instruments.client_request_duration, PreAggregatedHistogram)
    assert not isinstance(instruments.client_retries, PreAggregatedCounter)
    assert isinstance(instruments.server_request_duration, PreAggregatedHistogram)
    assert not isinstance(instruments.pool_connections, PreAggregatedUpDownCounter)  # the wildcard view
    assert isinstance(instruments.pool_pending_requests, PreAggregatedUpDownCounter)
    instruments.client_request_duration.record(0.1, {"k": "v"})
    instruments.client_retries.add(1, {"k": "v"})
    instruments.server_request_duration.record(0.1, {"k": "v"})
    metrics = _metrics(reader)
    assert names.METRIC_HTTP_CLIENT_REQUEST_DURATION not in metrics  # dropped by the view
    assert "renamed.retries" in metrics and names.METRIC_CLIENT_RETRIES not in metrics
    assert names.METRIC_HTTP_SERVER_REQUEST_DURATION in metrics
    bounds = metrics[names.METRIC_HTTP_SERVER_REQUEST_DURATION].data.data_points[0].explicit_bounds
    assert tuple(bounds) == names.HTTP_DURATION_BUCKETS_S


def test_whole_number_boundaries_give_the_sdks_buckets() -> None:
    """Token histograms' boundaries are whole numbers, searched as ints: the buckets must not move."""
    reader = _reader(CUMULATIVE)
    meter = MeterProvider(metric_readers=[reader]).get_meter("gym_obs")
    pre = attach(meter)
    assert pre is not None
    bounds = names.GEN_AI_TOKEN_BUCKETS
    sdk = meter.create_histogram("t", unit="1", explicit_bucket_boundaries_advisory=list(bounds))
    twin = pre.histogram("pre.t", "1", "", bounds)
    values = [0, 1, 2, 4, 5, 16, 64, 65, 0.5, 3.999, 4.0, 4.001, 67108864, 67108865, 10**12]
    for value in values:
        sdk.record(value, {"k": "v"})
        twin.record(value, {"k": "v"})
    metrics = _metrics(reader)
    (sdk_point,), (pre_point,) = metrics["t"].data.data_points, metrics["pre.t"].data.data_points
    assert _comparable(pre_point) == _comparable(sdk_point)


class _AskedFilter(ExemplarFilter):
    """A filter gym knows nothing of: asked as the SDK asks it."""

    def should_sample(self, value: float, time_unix_nano: int, attributes: Any, ctx: Any) -> bool:
        return trace.get_current_span(ctx).get_span_context().is_valid


@pytest.mark.parametrize(
    "exemplar_filter",
    [RecordedSpanExemplarFilter(), TraceBasedExemplarFilter(), AlwaysOnExemplarFilter(), _AskedFilter()],
    ids=["recorded_span", "trace_based", "always_on", "custom"],
)
def test_the_exemplar_for_a_held_span_is_the_one_for_the_current_span(
    exemplar_filter: ExemplarFilter,
) -> None:
    """``exemplar_for(span)`` asks about ``span`` directly when it is current, else falls back: either way
    its decision is :meth:`exemplar`'s, whatever span is current."""
    provider = MeterProvider(metric_readers=[_reader(CUMULATIVE)], exemplar_filter=exemplar_filter)
    pre = attach(provider.get_meter("m"))
    assert pre is not None
    held = TRACER.start_span("held")
    unsampled = TracerProvider(sampler=ALWAYS_OFF).get_tracer("t").start_span("unsampled")
    places = {
        "held": trace.set_span_in_context(held),
        "another": trace.set_span_in_context(TRACER.start_span("another")),
        "unsampled": trace.set_span_in_context(unsampled),
        "remote": trace.set_span_in_context(NonRecordingSpan(REMOTE)),
        "none": context.Context(),
    }
    for where, place in places.items():
        token = context.attach(place)
        try:
            for span in (held, unsampled, None):
                mine, theirs = pre.exemplar_for(span), pre.exemplar()
                assert (mine and mine[0]) == (theirs and theirs[0]), (where, span)
        finally:
            context.detach(token)
