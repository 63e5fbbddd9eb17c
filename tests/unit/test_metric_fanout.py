"""One reader, several exporters: grouping by preferences, and no exporter holding up another.

Real SDK readers and exporters throughout: the OTLP exporter talks to a loopback socket that accepts and
never answers (a hung collector), the file exporters write real files.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from gym_obs.telemetry._exporters import SafeMetricExporter
from gym_obs.telemetry._fanout import FanOutMetricExporter, fan_in
from gym_obs.telemetry.file_export import OtlpJsonFileMetricExporter, file_metric_exporter

HUNG_PORT = 16020
RESOURCE = Resource({"service.name": "gym/fanout"})


@pytest.fixture
def hung_collector() -> Iterator[str]:
    """A socket that accepts connections and never answers."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", HUNG_PORT))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{HUNG_PORT}/v1/metrics"
    stop.set()
    thread.join(2)
    for conn in accepted:
        conn.close()
    server.close()


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _wait_for_lines(path: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while len(lines := _lines(path)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return lines


def test_exporters_that_want_the_same_data_share_one_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    otlp = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{HUNG_PORT}/v1/metrics")
    files = file_metric_exporter(tmp_path, "gym/a")
    (shared,) = fan_in([SafeMetricExporter(otlp, "otlp"), SafeMetricExporter(files, "file")])
    assert isinstance(shared, FanOutMetricExporter) and len(shared.exporters) == 2
    assert fan_in([files]) == [files]  # a single exporter is used as it is

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "DELTA")
    delta = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{HUNG_PORT}/v1/metrics")
    readers = fan_in([delta, files])  # the file sink stays cumulative: it needs a reader of its own
    assert readers == [delta, files]


def test_a_hung_exporter_neither_blocks_the_reader_nor_the_other_output(
    tmp_path: Path, hung_collector: str, caplog: pytest.LogCaptureFixture
) -> None:
    hung = SafeMetricExporter(OTLPMetricExporter(endpoint=hung_collector, timeout=30), "hung otlp")
    files = file_metric_exporter(tmp_path, "gym/b")
    fanout = FanOutMetricExporter([hung, files])
    reader = PeriodicExportingMetricReader(fanout, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader], resource=RESOURCE)
    counter = provider.get_meter("m").create_counter("c")

    def collect_eight_times() -> None:
        for index in range(8):  # spaced as a reader's interval spaces them: each line is written first
            counter.add(1)
            reader.collect()
            _wait_for_lines(files.path, index + 1)

    collector = threading.Thread(target=collect_eight_times, daemon=True)
    with caplog.at_level(logging.WARNING, logger="gym_obs.telemetry"):
        collector.start()
        collector.join(30)  # a synchronous fan-out would sit in the hung export for 30 s per collection
        assert not collector.is_alive()
    totals = [
        doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["sum"]["dataPoints"][0]["asInt"]  # type: ignore[index]
        for doc in _lines(files.path)
    ]
    assert totals == [str(n) for n in range(1, 9)]  # the file got every collection, in order
    # The hung exporter holds one collection and queues four: the oldest of the rest are dropped, once said.
    assert caplog.text.count("falling behind") == 1

    started = time.monotonic()
    provider.shutdown(timeout_millis=2_000)
    assert time.monotonic() - started < 15  # bounded by the budget, not by the hung exporter's 30 s
    assert len(_lines(files.path)) == 9  # the final collection reached the file before it closed


def test_a_failing_exporter_does_not_stop_the_other(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    failing = SafeMetricExporter(OtlpJsonFileMetricExporter(blocked / "x.metrics.jsonl"), "failing file")
    good = file_metric_exporter(tmp_path, "gym/c")
    reader = PeriodicExportingMetricReader(
        FanOutMetricExporter([failing, good]), export_interval_millis=3_600_000
    )
    provider = MeterProvider(metric_readers=[reader], resource=RESOURCE)
    provider.get_meter("m").create_counter("c").add(7)
    provider.force_flush(5_000)
    assert len(_wait_for_lines(good.path, 1)) == 1
    provider.shutdown(timeout_millis=5_000)
    assert len(_lines(good.path)) == 2
    assert not (blocked / "x.metrics.jsonl").exists()
