"""The span export chain, per span: OTLP protobuf encoding and everything around it (issue 13 §1, §2).

Cases, interleaved round after round in one process, medians over rounds; CPU time of this thread (the
thread that would be the batch span processor's), so other load on the machine counts less than wall time.
Batches of ``--spans`` harness-shaped spans (``_rollout_spans``: the 16 spans of a rollout, as a run
writes them):

* encoding: the SDK's ``encode_spans(...).SerializePartialToString()`` vs gym's direct protobuf encoder
  (``_otlp_proto``), warm (the exporter's encoder, caches kept across batches) and cold (a new encoder per
  batch); ``proto_encode_direct_vs_sdk`` is warm / SDK
* the export-time scrubber (``ScrubbingSpanExporter`` on a no-op exporter), per span
* the whole chain gym builds for OTLP http/protobuf (``SafeSpanExporter`` -> ``ScrubbingSpanExporter`` ->
  exporter -> HTTP POST to a local sink that reads and drops the body), with the SDK's exporter vs gym's:
  ``otlp_chain_gym_vs_sdk``; and gym's chain with batches of 128 and 2048 spans (requests per span)

Run: ``python3 benchmarks/otlp_encode.py [--rounds 7] [--spans 512] [--port-base 30700]``; the sink
listens on ``--port-base`` (127.0.0.1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "src"))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from _rollout_spans import rollout_spans  # noqa: E402
from gym_obs.telemetry._exporters import SafeSpanExporter, otlp_span_exporter  # noqa: E402
from gym_obs.telemetry._otlp_proto import ProtoEncoder  # noqa: E402
from gym_obs.telemetry.export_scrub import ScrubbingSpanExporter  # noqa: E402
from gym_obs.telemetry.settings import OtlpTarget  # noqa: E402


class _Sink(BaseHTTPRequestHandler):
    """Reads an export request and answers an empty ``ExportTraceServiceResponse``."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


class _Null(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _chain(exporter: SpanExporter) -> SpanExporter:
    """What ``_exporters`` wraps every span exporter in."""
    return SafeSpanExporter(ScrubbingSpanExporter(exporter), "bench")


def _per_span(fn: Callable[[], object], number: int, spans: int) -> float:
    start = time.thread_time()
    for _ in range(number):
        fn()
    return (time.thread_time() - start) / (number * spans)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--spans", type=int, default=512, help="spans per batch (the batch processor's size)")
    parser.add_argument("--port-base", type=int, default=30700, help="the local sink's port")
    args = parser.parse_args(argv)
    spans = rollout_spans(args.spans)
    small, large = rollout_spans(128), rollout_spans(2048)
    n = len(spans)

    server = ThreadingHTTPServer(("127.0.0.1", args.port_base), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = OtlpTarget(protocol="http/protobuf", endpoint=f"http://127.0.0.1:{args.port_base}/v1/traces")
    sdk_chain = _chain(OTLPSpanExporter(endpoint=target.endpoint, timeout=10))
    gym_chain = _chain(otlp_span_exporter(target, 10.0))
    warm = ProtoEncoder()
    scrubber = ScrubbingSpanExporter(_Null())

    cases: list[tuple[str, Callable[[], object], int, int]] = [
        ("encode: SDK (message objects + serialise)", lambda: encode_spans(spans).SerializeToString(), 3, n),
        ("encode: direct protobuf, warm caches", lambda: warm.spans(spans), 20, n),
        ("encode: direct protobuf, new encoder per batch", lambda: ProtoEncoder().spans(spans), 20, n),
        ("export scrubber (no-op exporter behind it)", lambda: scrubber.export(spans), 20, n),
        ("chain to a local sink: SDK OTLP exporter", lambda: sdk_chain.export(spans), 3, n),
        ("chain to a local sink: gym OTLP exporter", lambda: gym_chain.export(spans), 10, n),
        ("gym chain, batches of 128 spans", lambda: gym_chain.export(small), 40, len(small)),
        ("gym chain, batches of 2048 spans", lambda: gym_chain.export(large), 3, len(large)),
    ]  # fmt: skip
    results: dict[str, list[float]] = {name: [] for name, *_ in cases}
    start_load = os.getloadavg()
    for _ in range(args.rounds):
        for name, fn, number, units in cases:
            results[name].append(_per_span(fn, number, units))
    end_load = os.getloadavg()
    server.shutdown()
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(
        f"Python {sys.version.split()[0]}, {args.rounds} rounds, {n} harness-shaped spans per batch, median "
        f"CPU time per span; load average {start_load[0]:.2f} at start, {end_load[0]:.2f} at end"
    )
    print(f"| {'case':<48} | {'median':>9} | {'min':>9} | {'max':>9} |")
    print(f"|{'-' * 50}|{'-' * 10}:|{'-' * 10}:|{'-' * 10}:|")
    for name, values in results.items():
        print(
            f"| {name:<48} | {medians[name] * 1e6:>6.2f} µs | {min(values) * 1e6:>6.2f} µs "
            f"| {max(values) * 1e6:>6.2f} µs |"
        )
    names = [name for name, *_ in cases]
    print(f"proto_encode_direct_vs_sdk={medians[names[1]] / medians[names[0]]:.3f}")
    print(f"otlp_chain_gym_vs_sdk={medians[names[5]] / medians[names[4]]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
