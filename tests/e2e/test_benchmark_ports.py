"""``benchmarks/harness_throughput.py`` and ``benchmarks/server_overhead.py`` take ``--port-base``: a tiny
real run of each on this file's own ports (only this test range's ports are ever touched)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HARNESS_BASE = 29610  # 29610-29613 and the collector at 29630-29631
SERVER_BASE = 14600  # 14600-14605 (six variants; 29693+ would reach test_export_warnings's dead port)


def _bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip


def test_server_overhead_takes_port_base() -> None:
    assert "--port-base" in _bench("server_overhead.py", "--help").stdout
    done = _bench("server_overhead.py", "--requests", "200", "--rounds", "1", "--port-base", str(SERVER_BASE))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "simple_off_vs_bare=" in done.stdout and "native_vs_contrib=" in done.stdout


def test_harness_throughput_takes_port_base() -> None:
    pytest.importorskip("rotel")
    assert "--port-base" in _bench("harness_throughput.py", "--help").stdout
    done = _bench(
        "harness_throughput.py", "--rounds", "1", "--rollouts", "4", "--port-base", str(HARNESS_BASE)
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert "| telemetry off" in done.stdout and "| OTLP to rotel" in done.stdout
    for name in ("file_cpu_ratio=", "file_p50_ratio=", "otlp_cpu_ratio=", "otlp_p50_ratio="):
        assert name in done.stdout
    assert "load average at start:" in done.stdout and "load average at end:" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("telemetry_cost_ratio=")
