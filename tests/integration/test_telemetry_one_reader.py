"""Issue 13.2: with OTLP and the file sink both on, one metric reader aggregates every point and feeds both.

The exporting side is a real process with ``setup_telemetry`` (global providers); the OTLP side is the
test ``OtlpReceiver`` on loopback. The process reports how many readers and aggregation storages its meter
provider has; then every export request the receiver got is compared with the file's line for the same
collection: the same points, timestamps included (one collection, two encoders).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict

import gym_obs
from gym_obs.telemetry import names
from gym_obs.telemetry.file_export import METRICS_SUFFIX, otlp_json_line
from tests.integration.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration

RECEIVER_PORT = 16010
_SRC = str(Path(gym_obs.__file__).resolve().parents[1])

_EMIT = """
    import json, sys
    from gym_obs.telemetry import names
    from gym_obs.telemetry.setup import setup_telemetry
    from gym_obs.telemetry.spans import client_span
    from gym_obs.telemetry.testing import telemetry_state

    STATE = telemetry_state()

    from opentelemetry import context, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    handle = setup_telemetry("agent", "agent_server", config=json.loads(sys.argv[1]))
    # As under an incoming sampled traceparent: the remote parent is current, no local span yet.
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    mp = handle.meter_provider
    readers = mp._metric_readers
    storages = mp._measurement_consumer._reader_storages
    for round_ in range(3):
        for status in (200, 500):
            with client_span("GET", **{names.ATTR_URL_FULL: "http://model:1/v1/x"}):
                attributes = {names.ATTR_SERVER_NAME: "model", "http.response.status_code": status}
                STATE.instruments.client_request_duration.record(0.01 * (round_ + 1), attributes)
        STATE.instruments.client_retries.add(1, {names.ATTR_RETRY_REASON: names.RETRY_REASON_TIMEOUT})
        assert handle.force_flush(10.0)  # one collection, handed to both exporters
    print(json.dumps({"readers": len(readers), "storages": len(storages)}), flush=True)
    print("SHUTDOWN", handle.shutdown(timeout_s=10.0), flush=True)
"""


def _run(config: dict[str, object]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EMIT), json.dumps(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _points(doc: dict[str, object]) -> dict[str, list[dict[str, object]]]:
    """metric name -> its data points, from one OTLP/JSON export document."""
    out: dict[str, list[dict[str, object]]] = {}
    for rm in doc["resourceMetrics"]:  # type: ignore[attr-defined]
        for sm in rm["scopeMetrics"]:
            for metric in sm["metrics"]:
                data = next(v for k, v in metric.items() if k in ("sum", "histogram", "gauge"))
                out[metric["name"]] = data["dataPoints"]
    return out


def test_one_reader_feeds_the_receiver_and_the_file_the_same_points(tmp_path: Path) -> None:
    config = {
        "enabled": True,
        "traces_exporter": "file",
        "metrics_exporter": "otlp,file",
        "otlp_endpoint": f"http://127.0.0.1:{RECEIVER_PORT}",
        "otlp_protocol": "http/protobuf",
        "metric_export_interval_ms": 3_600_000,  # only the explicit flushes and the final collection
        "file_export_dir": str(tmp_path),
    }
    with OtlpReceiver(RECEIVER_PORT) as receiver:
        output = _run(config)
        received = receiver.metric_requests()
    assert "SHUTDOWN True" in output
    counts = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    assert counts == {"readers": 1, "storages": 1}  # one aggregation per point, not one per output

    (path,) = tmp_path.glob(f"*{METRICS_SUFFIX}")
    file_docs = [json.loads(line) for line in path.read_bytes().splitlines()]
    otlp_docs = [json.loads(otlp_json_line(request)) for request in received]
    assert len(file_docs) >= 3
    assert otlp_docs == file_docs  # every collection, point for point, timestamps included

    last = _points(file_docs[-1])
    (retries,) = last[names.METRIC_CLIENT_RETRIES]
    assert retries["asInt"] == "3"
    durations = last[names.METRIC_HTTP_CLIENT_REQUEST_DURATION]
    assert sorted(point["count"] for point in durations) == ["3", "3"]
    # Measured inside a span this process records: each point carries an exemplar pointing at that span
    # (exemplars are those of one collection: the first one's).
    first = _points(file_docs[0])
    for point in first[names.METRIC_HTTP_CLIENT_REQUEST_DURATION]:
        (exemplar,) = point["exemplars"]
        assert exemplar["traceId"] == format(0xABC, "032x") and exemplar["spanId"] != format(0xDEF, "016x")
    (first_retries,) = first[names.METRIC_CLIENT_RETRIES]
    assert "exemplars" not in first_retries  # counted under the remote parent only: no exemplar work
    raw = MessageToDict(received[-1])
    assert raw["resourceMetrics"][0]["resource"] == file_docs[-1]["resourceMetrics"][0]["resource"]


def test_without_tracing_no_point_carries_an_exemplar(tmp_path: Path) -> None:
    """The SDK's trace_based default would sample every point here (a sampled remote parent is current)."""
    config = {
        "enabled": True,
        "traces_exporter": "none",
        "metrics_exporter": "file",
        "metric_export_interval_ms": 3_600_000,
        "file_export_dir": str(tmp_path),
    }
    output = _run(config)
    assert "SHUTDOWN True" in output
    (path,) = tmp_path.glob(f"*{METRICS_SUFFIX}")
    docs = [_points(json.loads(line)) for line in path.read_bytes().splitlines()]
    points = [point for doc in docs for point in doc[names.METRIC_HTTP_CLIENT_REQUEST_DURATION]]
    assert len(docs) >= 3 and points
    assert all("exemplars" not in point for point in points)
