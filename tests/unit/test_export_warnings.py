"""A dead collector: the SDK's raw per-batch lines (``Transient error ... retrying in``, ``Failed to export
... batch``) are collapsed into gym_obs's one clear line per signal, which names the real cause. A real child
process exporting to a port where nothing listens."""

from __future__ import annotations

import os
import subprocess
import sys

DEAD_PORT = 29698

CHILD = f"""
import time
from gym_obs.config import TelemetryConfig
from gym_obs.telemetry.logging import configure_logging
from gym_obs.telemetry.setup import setup_telemetry

configure_logging()
handle = setup_telemetry("probe", "probe", config=TelemetryConfig(
    enabled=True, otlp_endpoint="http://127.0.0.1:{DEAD_PORT}", export_timeout_ms=1500,
    metric_export_interval_ms=200,
))
tracer = handle.tracer_provider.get_tracer("probe")
counter = handle.meter_provider.get_meter("probe").create_counter("probe.count")
for _round in range(2):
    for _ in range(5):
        with tracer.start_as_current_span("probe"):
            counter.add(1)
    handle.force_flush(3)
    time.sleep(0.5)
handle.shutdown(3)
"""


def test_sdk_retry_lines_collapse_into_one_gym_line_per_signal() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    for raw in ("Transient error", "retrying in", "Failed to export", "batch code"):
        assert not any(raw in line for line in lines), (raw, lines)
    assert "Traceback" not in done.stderr
    spans = [line for line in lines if "span export to" in line and "failed" in line]
    metrics = [line for line in lines if "metric export to" in line and "failed" in line]
    assert len(spans) == 1 and len(metrics) == 1, lines
    for line in (*spans, *metrics):
        assert "Connection refused" in line, line
        assert "[]" not in line and "()" not in line.split("failed", 1)[1][:3]
