"""File sink and metric path: what the embedded telemetry costs per span and per point (issue 13 §2, §3, §5).

Cases, interleaved round after round in one process, medians over rounds (CPU time of this thread, so other
load on the machine counts less than in wall time):

* span encoding, per span, for a batch of 512 harness-shaped spans (``_rollout_spans``: the 16 spans of
  a rollout as a run writes them): ``old`` = the official encoders (protobuf ->
  ``MessageToDict`` -> orjson, ids patched to hex), ``new`` = the direct encoder; ``new_vs_old`` ratio
  (the issue's budget: new ≤ 25 µs per span)
* metrics encoding, per collection of 40 streams (histograms with exemplars, counters): old vs new
* metric record path, per histogram point with 4 attributes inside a sampled span (exemplars on):
  ``2 readers`` (the old wiring: OTLP and file as two readers) vs ``1 reader`` (the fan-out wiring)
* exemplar filter, per point, under a sampled remote parent with no local span: the SDK's ``trace_based``
  default vs gym_obs's recorded-span filter

Run: ``python3 benchmarks/file_sink.py [--rounds 7] [--spans 512]``. No sockets are opened.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "src"))

from opentelemetry import context, trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider, TraceBasedExemplarFilter  # noqa: E402
from opentelemetry.sdk.metrics.export import (  # noqa: E402
    InMemoryMetricReader,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags  # noqa: E402

from _rollout_spans import rollout_spans  # noqa: E402
from gym_obs.telemetry import names  # noqa: E402
from gym_obs.telemetry._exemplars import RecordedSpanExemplarFilter  # noqa: E402
from gym_obs.telemetry._fanout import FanOutMetricExporter  # noqa: E402
from gym_obs.telemetry._otlp_json import metrics_json_line, spans_json_line  # noqa: E402
from gym_obs.telemetry.file_export import file_metric_exporter, otlp_json_line  # noqa: E402

RESOURCE = Resource.create(
    {names.SERVICE_NAME: "gym/model_0", names.ATTR_SERVER_NAME: "model_0", names.ATTR_RUN_ID: "bench"}
)
HOUR_MS = 3_600_000


def _record_setup(
    readers: list[MetricReader], exemplar_filter: ExemplarFilter | None = None
) -> Callable[[], None]:
    provider = MeterProvider(metric_readers=readers, resource=RESOURCE, exemplar_filter=exemplar_filter)
    histogram = provider.get_meter("bench").create_histogram(
        names.METRIC_HTTP_SERVER_REQUEST_DURATION,
        unit="s",
        explicit_bucket_boundaries_advisory=list(names.HTTP_DURATION_BUCKETS_S),
    )
    attrs = {
        "http.request.method": "POST",
        "http.route": "/v1/responses",
        "http.response.status_code": 200,
        "url.scheme": "http",
    }

    def record() -> None:
        histogram.record(0.012, attrs)

    return record


def _metrics_data(spans_tracer: trace.Tracer) -> MetricsData:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=RESOURCE)
    meter = provider.get_meter("bench")
    histogram = meter.create_histogram(
        "d", unit="s", explicit_bucket_boundaries_advisory=list(names.HTTP_DURATION_BUCKETS_S)
    )
    counter = meter.create_counter("c")
    with spans_tracer.start_as_current_span("x"):
        for stream in range(20):
            histogram.record(0.01 * stream, {"http.route": f"/r{stream}", "http.response.status_code": 200})
            counter.add(stream, {"gym.server.name": f"s{stream}"})
    data = reader.get_metrics_data()
    assert data is not None
    return data


def _per_unit(fn: Callable[[], object], number: int, units: int) -> float:
    start = time.thread_time()
    for _ in range(number):
        fn()
    return (time.thread_time() - start) / (number * units)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--spans", type=int, default=512, help="spans per batch (the batch processor's size)")
    args = parser.parse_args(argv)
    spans = rollout_spans(args.spans)
    tracer = TracerProvider(resource=RESOURCE).get_tracer("bench")
    data = _metrics_data(tracer)
    directory = tempfile.mkdtemp(prefix="gym-bench-sink-")

    def periodic(label: str) -> PeriodicExportingMetricReader:
        return PeriodicExportingMetricReader(
            file_metric_exporter(directory, label), export_interval_millis=HOUR_MS
        )

    two_readers = _record_setup([periodic("a"), periodic("b")])
    fanout = FanOutMetricExporter(
        [file_metric_exporter(directory, "c"), file_metric_exporter(directory, "d")]
    )
    one_reader = _record_setup([PeriodicExportingMetricReader(fanout, export_interval_millis=HOUR_MS)])
    trace_based = _record_setup([periodic("e")], TraceBasedExemplarFilter())
    recorded_only = _record_setup([periodic("f")], RecordedSpanExemplarFilter())
    sampled_remote = trace.set_span_in_context(
        NonRecordingSpan(
            SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        )
    )

    def under_local_span(record: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with tracer.start_as_current_span("request"):
                for _ in range(100):
                    record()

        return run

    def under_remote_parent(record: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            token = context.attach(sampled_remote)
            try:
                for _ in range(100):
                    record()
            finally:
                context.detach(token)

        return run

    n = len(spans)
    cases: list[tuple[str, Callable[[], object], int, int]] = [
        ("span encode: old (protobuf + MessageToDict)", lambda: otlp_json_line(encode_spans(spans)), 3, n),
        ("span encode: new (direct)", lambda: spans_json_line(spans), 20, n),
        ("metrics encode: old, per collection", lambda: otlp_json_line(encode_metrics(data)), 50, 1),
        ("metrics encode: new, per collection", lambda: metrics_json_line(data), 50, 1),
        ("histogram point, 2 readers (old wiring)", under_local_span(two_readers), 100, 100),
        ("histogram point, 1 reader + fan-out (new)", under_local_span(one_reader), 100, 100),
        ("point under remote parent, trace_based filter", under_remote_parent(trace_based), 100, 100),
        ("point under remote parent, recorded-span filter", under_remote_parent(recorded_only), 100, 100),
    ]
    results: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for _ in range(args.rounds):
        for name, fn, number, units in cases:
            results[name].append(_per_unit(fn, number, units))
    medians = {name: statistics.median(values) for name, values in results.items()}
    load = os.getloadavg()
    print(
        f"Python {sys.version.split()[0]}, {args.rounds} rounds, {n} spans per batch, "
        f"median CPU time per unit; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"| {'case':<50} | {'median':>10} | {'min':>10} | {'max':>10} |")
    print(f"|{'-' * 52}|{'-' * 11}:|{'-' * 11}:|{'-' * 11}:|")
    for name, values in results.items():
        print(
            f"| {name:<50} | {medians[name] * 1e6:>7.2f} µs | {min(values) * 1e6:>7.2f} µs "
            f"| {max(values) * 1e6:>7.2f} µs |"
        )
    names_ = [name for name, *_ in cases]
    span_ratio = medians[names_[1]] / medians[names_[0]]
    metrics_ratio = medians[names_[3]] / medians[names_[2]]
    reader_ratio = medians[names_[5]] / medians[names_[4]]
    filter_ratio = medians[names_[7]] / medians[names_[6]]
    new_span_us = medians[names_[1]] * 1e6
    print(f"span_us_new={new_span_us:.2f} (budget 25) span_us_old={medians[names_[0]] * 1e6:.2f}")
    print(f"span_encode_new_vs_old={span_ratio:.3f}")
    print(f"metrics_encode_new_vs_old={metrics_ratio:.3f}")
    print(f"metric_point_1_reader_vs_2={reader_ratio:.3f}")
    print(f"remote_parent_point_recorded_filter_vs_trace_based={filter_ratio:.3f}")
    fanout.shutdown(timeout_millis=1000)
    return 0 if new_span_us <= 25 else 1


if __name__ == "__main__":
    sys.exit(main())
