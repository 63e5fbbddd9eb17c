"""The direct OTLP/JSON encoder against the official one (protobuf -> MessageToDict), field by field.

Every line the direct encoder writes is parsed with protobuf's ``json_format.Parse`` into the OTLP request
message and compared with what the official encoder builds from the same SDK objects; the JSON documents
are compared too (the file format: hex ids, string int64s, camelCase keys, enum integers).
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import Parse
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import AlwaysOnExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext

from gym_obs.harness.telemetry_files import iter_spans, read_metric_totals
from gym_obs.telemetry._otlp_json import metrics_json_line, spans_json_line
from gym_obs.telemetry.file_export import (
    OtlpJsonFileSpanExporter,
    encode_spans_line,
    file_span_exporter,
    otlp_json_line,
)
from tests.unit.otlp_spans import ATTRIBUTE_VALUES, RESOURCE, every_field_spans, hand_built_spans


def _ids_to_base64(doc: Any) -> Any:
    """OTLP/JSON writes ids as hex; protobuf's JSON parser wants base64 for ``bytes``."""
    if isinstance(doc, dict):
        return {
            key: (
                base64.b64encode(bytes.fromhex(value)).decode()
                if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str)
                else _ids_to_base64(value)
            )
            for key, value in doc.items()
        }
    if isinstance(doc, list):
        return [_ids_to_base64(item) for item in doc]
    return doc


def _assert_same_trace_line(spans: list[ReadableSpan]) -> None:
    line = spans_json_line(spans)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    parsed = Parse(json.dumps(_ids_to_base64(json.loads(line))), ExportTraceServiceRequest())
    expected = encode_spans(spans)
    # bytes, not ==: a NaN attribute never equals itself
    assert parsed.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
    assert json.loads(line) == json.loads(otlp_json_line(expected))


def _assert_same_metrics_line(data: MetricsData) -> None:
    line = metrics_json_line(data)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    parsed = Parse(json.dumps(_ids_to_base64(json.loads(line))), ExportMetricsServiceRequest())
    expected = encode_metrics(data)
    assert parsed.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
    assert json.loads(line) == json.loads(otlp_json_line(expected))


def test_spans_with_every_field_match_the_official_encoder() -> None:
    spans = every_field_spans()
    _assert_same_trace_line(spans)
    for span in spans:
        _assert_same_trace_line([span])


def test_hand_built_spans_with_values_the_sdk_would_not_make_match_too() -> None:
    """(A string that is not UTF-8 fails orjson's whole line: see the fallback test below.)"""
    _assert_same_trace_line(hand_built_spans(not_utf8=False))


def _metrics(provider: MeterProvider, tracer: trace.Tracer) -> None:
    meter = provider.get_meter("gym_obs", "0.1", schema_url="https://metrics-scope")
    duration = meter.create_histogram(
        "http.server.request.duration",
        unit="s",
        description="Duration.",
        explicit_bucket_boundaries_advisory=[0.005, 0.1, 1.0],
    )
    ints = meter.create_histogram("ints", explicit_bucket_boundaries_advisory=[1, 10])
    exponential = meter.create_histogram("exponential")
    counter = meter.create_counter("gym.rollouts", unit="{rollout}")
    updown = meter.create_up_down_counter("gym.client.pool.pending_requests")
    gauge = meter.create_gauge("temperature")
    with tracer.start_as_current_span("measured"):
        duration.record(
            0.02, {"http.request.method": "GET", "http.response.status_code": 200, "drop.me": "x"}
        )
        counter.add(3, {"gym.rollout.outcome": "completed"})
        updown.add(-2.5, {"gym.server.name": "model"})
        gauge.set(7, {"hw.id": "0"})
        exponential.record(0.3)
        exponential.record(-0.0)
        exponential.record(12.0)
    duration.record(0.5, {"http.request.method": "GET", "http.response.status_code": 200})
    duration.record(3.0, {"http.request.method": "POST", "http.response.status_code": 500})
    ints.record(2)
    ints.record(20)
    counter.add(1, {"gym.rollout.outcome": "failed"})

    def observe(_options: CallbackOptions) -> list[Observation]:
        return [Observation(1.5, {"memory.type": "rss"}), Observation(3, {"memory.type": "pss"})]

    meter.create_observable_gauge("process.memory.usage", callbacks=[observe], unit="By")
    meter.create_observable_counter("cpu.time", callbacks=[lambda _o: [Observation(12.5)]])
    meter.create_observable_up_down_counter("fds", callbacks=[lambda _o: [Observation(9)]])
    provider.get_meter("second-scope").create_counter("other").add(1)


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_metrics_of_every_kind_with_exemplars_match_the_official_encoder(
    temporality: AggregationTemporality,
) -> None:
    from opentelemetry.sdk.metrics import Counter, UpDownCounter
    from opentelemetry.sdk.metrics import Histogram as HistogramInstrument

    reader = InMemoryMetricReader(
        preferred_temporality={
            Counter: temporality,
            HistogramInstrument: temporality,
            UpDownCounter: AggregationTemporality.CUMULATIVE,
        }
    )
    views = [
        View(instrument_name="exponential", aggregation=ExponentialBucketHistogramAggregation(max_size=20)),
        # filtered attributes: the measurement's extra keys travel on the exemplar only
        View(
            instrument_name="http.server.request.duration",
            attribute_keys={"http.request.method", "http.response.status_code"},
        ),
        View(instrument_name="*"),
    ]
    provider = MeterProvider(
        metric_readers=[reader], resource=RESOURCE, views=views, exemplar_filter=AlwaysOnExemplarFilter()
    )
    tracers = TracerProvider(resource=RESOURCE)
    _metrics(provider, tracers.get_tracer("t"))
    first = reader.get_metrics_data()
    assert first is not None
    line = json.loads(metrics_json_line(first))
    names = {m["name"] for sm in line["resourceMetrics"][0]["scopeMetrics"] for m in sm["metrics"]}
    assert {"exponential", "http.server.request.duration", "process.memory.usage", "other"} <= names
    assert '"filteredAttributes"' in metrics_json_line(first).decode()
    _assert_same_metrics_line(first)
    second = reader.get_metrics_data()  # delta: an empty collection; cumulative: the same points again
    if second is not None:
        _assert_same_metrics_line(second)
    provider.shutdown()
    tracers.shutdown()


def test_hand_built_points_with_odd_values_match_too() -> None:
    """Non-finite doubles, int sums, no min/max, an empty collection and a repeated resource."""
    scope = InstrumentationScope("hand", "1")
    histogram = Histogram(
        data_points=[
            HistogramDataPoint(
                attributes={"a": "b"},
                start_time_unix_nano=1,
                time_unix_nano=2,
                count=0,
                sum=0,
                bucket_counts=[0, 0],
                explicit_bounds=[1],
                min=float("inf"),
                max=float("-inf"),
                exemplars=[],
            )
        ],
        aggregation_temporality=AggregationTemporality.DELTA,
    )
    gauge = Gauge(data_points=[NumberDataPoint({}, 0, 3, float("nan"), exemplars=[])])
    metrics = [
        Metric("h", None, None, histogram),
        Metric("g", "", "", gauge),
        Metric("empty", "d", "u", Gauge([])),
    ]
    data = MetricsData(
        resource_metrics=[
            ResourceMetrics(RESOURCE, [ScopeMetrics(scope, metrics, "")], ""),
            ResourceMetrics(Resource({}), [ScopeMetrics(scope, [], "https://s")], "https://r"),
        ]
    )
    _assert_same_metrics_line(data)
    _assert_same_metrics_line(MetricsData(resource_metrics=[]))


def test_a_batch_the_direct_encoder_cannot_write_goes_through_the_official_one(tmp_path: Path) -> None:
    """A lone surrogate is not UTF-8: orjson refuses it, the official path writes the batch anyway."""
    context = SpanContext(trace_id=5, span_id=6, is_remote=False)
    good = ReadableSpan(name="good", context=context, resource=RESOURCE, attributes={"k": "v"})
    bad = ReadableSpan(name="bad", context=context, resource=RESOURCE, attributes={"k": "\ud800 lone"})
    with pytest.raises(TypeError):  # orjson.JSONEncodeError
        spans_json_line([bad])
    exporter = OtlpJsonFileSpanExporter(tmp_path / "x.traces.jsonl")
    assert exporter.export([good, bad]) is SpanExportResult.SUCCESS
    names = [span["name"] for span in iter_spans(tmp_path)]
    assert names == ["good", "bad"]
    assert encode_spans_line([good]) == spans_json_line([good])


def test_file_lines_are_encoded_on_the_batch_processors_thread(tmp_path: Path) -> None:
    """Encoding happens where the SDK exports (its worker thread), never in the thread that ends spans."""
    threads: list[str] = []

    class Recording(OtlpJsonFileSpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            threads.append(threading.current_thread().name)
            return super().export(spans)

    exporter = Recording(tmp_path / "gym-1.traces.jsonl")
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=10))
    tracer = provider.get_tracer("t")
    for index in range(20):
        with tracer.start_as_current_span("request", attributes={"i": index}):
            pass
    provider.shutdown()
    assert threads and threading.current_thread().name not in threads
    assert [s["attributes"]["i"] for s in iter_spans(tmp_path)] == list(range(20))


def test_the_readers_of_the_files_read_the_direct_encoders_lines(tmp_path: Path) -> None:
    exporter = file_span_exporter(tmp_path, "gym/agent_0")
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("rollout", attributes=ATTRIBUTE_VALUES) as span:
        span.add_event("e", {"x": 1})
    provider.shutdown()
    (read,) = iter_spans(tmp_path)
    assert read["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert read["attributes"]["strs"] == ["a", ""] and read["attributes"]["big"] == 2**62
    assert read["events"] == [{"name": "e", "attributes": {"x": 1}}]
    assert read_metric_totals(tmp_path).processes == 0
