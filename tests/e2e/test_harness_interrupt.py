"""Ctrl-C during a real ``gym-obs harness run``: rows kept, a partial summary printed and written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PORT_BASE = 29660


def _rows_file(out: Path) -> Path | None:
    found = sorted(out.glob("*/rollouts.jsonl")) if out.is_dir() else []
    return found[0] if found else None


def _row_count(path: Path | None) -> int:
    return 0 if path is None else sum(1 for line in path.read_text().splitlines() if line.strip())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_keeps_rows_and_writes_partial_summary(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    command = [
        sys.executable, "-m", "gym_obs.cli", "harness", "run", "--out", str(out), "--rollouts", "100000",
        "--concurrency", "4", "--model-latency-ms", "30", "--port-base", str(PORT_BASE), "--no-report",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while _row_count(_rows_file(out)) < 5:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no rows were written"
            time.sleep(0.2)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr
    rows_path = _rows_file(out)
    assert rows_path is not None
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]  # every line whole
    summary = json.loads((rows_path.parent / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary["rollouts"] == len(rows) >= 5
    assert summary["interrupted"]["rollouts_planned"] == 100000
    assert 0 <= summary["interrupted"]["cancelled_in_flight"] <= 4
    assert sum(summary["outcomes"].values()) == len(rows)
    assert "PARTIAL" in stdout and f"{len(rows)} of 100000" in stdout
    assert "interrupted; partial summary in" in stderr
