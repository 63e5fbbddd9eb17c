"""Tables are not cut to 80 columns when stdout is a file or a pipe: ``gym-obs serve > file`` and the
harness's summary keep every path and URL whole on one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

HARNESS_PORT_BASE = 29675
SERVE_PORT = 29680


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "COLUMNS"}


def _long_dir(tmp_path: Path) -> Path:
    path = tmp_path / ("a-folder-with-a-rather-long-name-" * 3) / "and-more"
    assert len(str(path)) > 120
    return path


def test_harness_summary_is_not_cut_when_piped(tmp_path: Path) -> None:
    out = _long_dir(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--rollouts", "3", "--no-report",
         "--port-base", str(HARNESS_PORT_BASE), "--out", str(out)],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = str((out / "latest").resolve())
    assert any(run_dir in line for line in done.stdout.splitlines()), done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) > 80


def test_serve_table_is_not_cut_when_stdout_is_a_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"head_server: {{port: {SERVE_PORT}}}\n")
    logs = _long_dir(tmp_path)
    stdout_path = tmp_path / "serve.out"
    with stdout_path.open("w") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "gym_obs.cli", "serve", str(config), "--log-dir", str(logs)],
            stdout=stdout, stderr=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while "All servers are ready" not in stdout_path.read_text():
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the servers never became ready"
                time.sleep(0.2)
        finally:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=30)
    lines = stdout_path.read_text().splitlines()
    head_log = str(logs / "head_server.log")
    assert any(head_log in line for line in lines), lines
    assert any(f"127.0.0.1:{SERVE_PORT}" in line for line in lines)
