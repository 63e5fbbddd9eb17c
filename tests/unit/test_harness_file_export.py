"""File sink: OTLP JSON lines in the collector file exporter's format, bounded, never raising."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExportResult, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanKind

from gym_obs.harness.telemetry_files import iter_spans, read_metric_totals
from gym_obs.telemetry import names
from gym_obs.telemetry.file_export import (
    METRICS_SUFFIX,
    TRACES_SUFFIX,
    OtlpJsonFileSpanExporter,
    export_file_stem,
    file_metric_exporter,
    file_span_exporter,
)

RESOURCE = Resource.create({names.SERVICE_NAME: "gym/model_0"})


def _spans(exporter: OtlpJsonFileSpanExporter, count: int = 3) -> list[tuple[str, str]]:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    ids = []
    for index in range(count):
        with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT, attributes={"i": index}) as span:
            span.add_event(names.SPAN_EVENT_ATTEMPT_FAILED, {names.ATTR_ATTEMPT: 1})
            with tracer.start_as_current_span("inner", kind=SpanKind.SERVER) as inner:
                ctx = inner.get_span_context()
                ids.append((format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")))
    provider.shutdown()
    return ids


def test_spans_are_otlp_json_lines_with_hex_ids(tmp_path: Path) -> None:
    exporter = file_span_exporter(tmp_path, "gym/model_0")
    assert exporter.path.name == export_file_stem("gym/model_0") + TRACES_SUFFIX
    ids = _spans(exporter)
    lines = exporter.path.read_text().splitlines()
    assert len(lines) == 6  # SimpleSpanProcessor: one request per span
    for line in lines:
        assert "\n" not in line and ": " not in line  # compact, one request per line
        doc = json.loads(line)
        assert set(doc) == {"resourceSpans"}
        ParseDict(_base64_ids(doc), ExportTraceServiceRequest())  # a valid ExportTraceServiceRequest
    spans = list(iter_spans(tmp_path))
    servers = [s for s in spans if s["kind"] == 2]
    assert [(s["trace_id"], s["span_id"]) for s in servers] == ids
    clients = {s["span_id"]: s for s in spans if s["kind"] == 3}
    assert all(s["parent_span_id"] in clients for s in servers)
    assert all(s["service"] == "gym/model_0" for s in spans)
    assert clients[servers[0]["parent_span_id"]]["events"][0]["name"] == names.SPAN_EVENT_ATTEMPT_FAILED


def _base64_ids(doc: dict) -> dict:  # type: ignore[type-arg]
    """OTLP/JSON uses hex ids; protobuf's JSON parser expects base64 -- convert back to validate."""
    import base64

    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return doc


def test_metrics_are_cumulative_export_requests(tmp_path: Path) -> None:
    exporter = file_metric_exporter(tmp_path, "gym/agent_0")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader], resource=RESOURCE)
    meter = provider.get_meter("test")
    retries = meter.create_counter(names.METRIC_CLIENT_RETRIES)
    duration = meter.create_histogram(
        names.METRIC_HTTP_CLIENT_REQUEST_DURATION,
        unit="s",
        explicit_bucket_boundaries_advisory=list(names.HTTP_DURATION_BUCKETS_S),
    )
    retries.add(2, {names.ATTR_RETRY_REASON: "server_disconnected"})
    for value in (0.004, 0.02, 0.02, 0.3):
        duration.record(value, {names.ATTR_SERVER_NAME: "model_0"})
    reader.collect()
    retries.add(1, {names.ATTR_RETRY_REASON: "server_disconnected"})
    provider.shutdown()  # final collection
    lines = exporter.path.read_text().splitlines()
    assert exporter.path.name.endswith(METRICS_SUFFIX) and len(lines) >= 2
    for line in lines:
        ParseDict(json.loads(line), ExportMetricsServiceRequest())
    totals = read_metric_totals(tmp_path)
    assert totals.processes == 1
    assert read_metric_totals(tmp_path, run_id="another-run").processes == 0  # reused output directory
    by_reason = totals.sum_by(names.METRIC_CLIENT_RETRIES, lambda a: a.get(names.ATTR_RETRY_REASON))
    assert by_reason == {"server_disconnected": 3.0}  # the last (cumulative) line wins
    hist = totals.histogram_by(names.METRIC_HTTP_CLIENT_REQUEST_DURATION, lambda a: a[names.ATTR_SERVER_NAME])
    summary = hist["model_0"].summary()
    assert summary["count"] == 4
    assert summary["p50"] is not None and 0.01 <= summary["p50"] <= 0.025
    assert summary["max"] == 0.3


def test_bounded_and_never_raises(tmp_path: Path, caplog: object) -> None:
    exporter = OtlpJsonFileSpanExporter(tmp_path / "small.jsonl", max_bytes=1500)
    provider = TracerProvider(resource=RESOURCE)
    results: list[SpanExportResult] = []

    class _Recording(SimpleSpanProcessor):
        def on_end(self, span) -> None:  # type: ignore[no-untyped-def]
            results.append(exporter.export([span]))

    provider.add_span_processor(_Recording(exporter))
    tracer = provider.get_tracer("test")
    for _ in range(20):
        with tracer.start_as_current_span("x"):
            pass
    assert SpanExportResult.SUCCESS in results and SpanExportResult.FAILURE in results
    assert (tmp_path / "small.jsonl").stat().st_size <= 1500

    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    broken = OtlpJsonFileSpanExporter(blocked / "sub" / "x.jsonl")
    with tracer.start_as_current_span("y") as span:
        pass
    assert broken.export([span]) is SpanExportResult.FAILURE  # type: ignore[list-item]
    assert broken.export([span]) is SpanExportResult.FAILURE  # type: ignore[list-item]
    broken.shutdown()
    metric = file_metric_exporter(blocked / "sub", "gym/x")
    assert metric.export(object()) is MetricExportResult.FAILURE  # type: ignore[arg-type]


def test_thread_safe_whole_lines(tmp_path: Path) -> None:
    exporter = file_span_exporter(tmp_path, "gym/threads")
    provider = TracerProvider(resource=RESOURCE)
    tracer = provider.get_tracer("test")
    spans = []
    for _ in range(50):
        with tracer.start_as_current_span("z", attributes={"pad": "x" * 500}) as span:
            pass
        spans.append(span)

    def work() -> None:
        for _ in range(20):
            exporter.export(spans)  # type: ignore[arg-type]

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    exporter.shutdown()
    lines = exporter.path.read_text().splitlines()
    assert len(lines) == 80
    assert all(len(json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 50 for line in lines)


def test_file_exporter_name_from_the_environment(tmp_path: Path) -> None:
    """``OTEL_TRACES_EXPORTER=file`` and ``OTEL_METRICS_EXPORTER=file`` write under GYM_OBS_TELEMETRY_DIR."""
    import os
    import subprocess
    import sys

    script = (
        "from gym_obs.telemetry.setup import setup_telemetry\n"
        "from gym_obs.telemetry.metrics import instruments_for\n"
        "handle = setup_telemetry('envcheck', 'test')\n"
        "assert handle.enabled, handle.problems\n"
        "with handle.tracer_provider.get_tracer('t').start_as_current_span('s'):\n"
        "    pass\n"
        "instruments = instruments_for(handle.meter_provider.get_meter('m'))\n"
        "instruments.rollouts.add(1, {'gym.rollout.outcome': 'completed'})\n"
        "assert handle.shutdown(5.0)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "GYM_OBS_TELEMETRY": "1",
            "OTEL_TRACES_EXPORTER": "file",
            "OTEL_METRICS_EXPORTER": "file",
            names.ENV_TELEMETRY_DIR: str(tmp_path / "tele"),
        }
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    spans = list(iter_spans(tmp_path / "tele"))
    assert [(s["name"], s["service"]) for s in spans] == [("s", "gym/envcheck")]
    totals = read_metric_totals(tmp_path / "tele")
    outcomes = totals.sum_by(names.METRIC_ROLLOUTS, lambda a: a.get(names.ATTR_ROLLOUT_OUTCOME))
    assert outcomes == {"completed": 1.0}
