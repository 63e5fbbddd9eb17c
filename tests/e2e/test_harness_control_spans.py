"""The harness's own control calls (``/_gym/faults``: setting nothing, reading what was injected) make no
SERVER span, so no unnamed, parentless ``GET`` appears in any server's traces; the route still answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gym_obs.harness.fault_middleware import CONTROL_PATH
from gym_obs.harness.telemetry_files import iter_spans

pytestmark = pytest.mark.e2e

PORT_BASE = 29692
SERVER_KIND = 2


def test_control_calls_make_no_server_spans(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "faults:\n  - {server: model, route: /v1/responses, rate: 0.5, action: status, status: 503}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    done = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--rollouts", "8", "--concurrency", "4",
         "--faults", str(plan), "--seed", "3", "--port-base", str(PORT_BASE), "--no-report",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "out" / "latest"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["faults_injected"]["model_0"], summary["faults_injected"]  # read over the control route
    servers = [s for s in iter_spans(run / "telemetry") if s["kind"] == SERVER_KIND]
    assert len(servers) >= 8  # the workload's SERVER spans are all there
    for span in servers:
        assert span["attributes"].get("url.path") != CONTROL_PATH, span
        assert span["name"] not in ("GET", "POST", "PUT", "DELETE"), span  # every SERVER span has its route
        assert span["parent_span_id"], span  # every workload request continues the caller's trace
