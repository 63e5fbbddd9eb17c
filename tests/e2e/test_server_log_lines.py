"""Every line of every server log names its server (head and multi-worker servers included, telemetry
off too) and none carries uvicorn's ``color_message`` with ANSI escape codes. Real ``gym-obs serve``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

HEAD_PORT = 29690
SERVER_PORT = 29691

CONFIG = f"""\
head_server: {{port: {HEAD_PORT}}}
telemetry: {{enabled: false}}
servers:
  model_0:
    entrypoint: gym_obs.harness.servers.model:ModelServer
    server_type: responses_api_models
    port: {SERVER_PORT}
    num_workers: 2
    access_log: true
"""


def test_every_log_line_names_its_server_and_has_no_colour_codes(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "gym_obs.cli", "serve", str(config), "--log-dir", str(logs)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 90
        for line in process.stdout:
            if "All servers are ready" in line:
                break
            assert time.monotonic() < deadline
        for _ in range(6):  # access-log lines from both workers
            with urllib.request.urlopen(f"http://127.0.0.1:{SERVER_PORT}/livez", timeout=10) as reply:
                assert reply.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    by_server = {"head_server": logs / "head_server.log", "model_0": logs / "model_0.log"}
    for name, path in by_server.items():
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        assert len(lines) >= 3, (name, lines)
        for line in lines:
            assert f"server_name={name}" in line, (name, line)
            assert "color_message" not in line and "\x1b" not in line, line
    worker_lines = (logs / "model_0.log").read_text()
    assert worker_lines.count("Started server process") >= 2  # the two workers' own lines
