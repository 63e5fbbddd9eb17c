"""Canary cases that need the other parts' fixes of issue 12 as well as the server's (they may fail on the
server branch alone; they must all pass once every branch is merged):

- an exception message's secret on a span event's ``exception.stacktrace`` (12.2: scrubbing every recorded
  exception; the server only makes sure the stack is recorded once);
- every field of a hostile peer's failure report (12.4: remote report validation and scrubbing) reaching
  this server's spans, logs, failure header and reply;
- a harness run (rows, ``summary.json``, span and metric files, every log) with the faults that plant a
  secret in an error and send a hostile failure report.

Ports: head 31200, front 31201, peer 31202, OTLP receiver 31290; the harness run 31300-31310.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_obs.harness.faults import CANARY_SECRET
from gym_obs.server.launcher import launch
from tests.security.canary_apps import CANARY
from tests.security.canary_support import (
    Outputs,
    RawOtlpReceiver,
    canary_config,
    files_under,
    launch_env,
    occurrences,
)

pytestmark = pytest.mark.integration

HEAD_PORT = 31200
FRONT_PORT = 31201
PEER_PORT = 31202
RECEIVER_PORT = 31290
HARNESS_PORT_BASE = 31300
HARNESS_RECEIVER_PORT = 31291
FRONT = f"http://127.0.0.1:{FRONT_PORT}"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outputs]:
    file_dir = tmp_path_factory.mktemp("telemetry")
    config = canary_config(HEAD_PORT, FRONT_PORT, PEER_PORT, RECEIVER_PORT, file_dir)
    logs = tmp_path_factory.mktemp("logs")
    with RawOtlpReceiver(RECEIVER_PORT) as receiver, launch(config, log_dir=logs, env=launch_env()) as run:
        yield Outputs(run, receiver, file_dir)


@pytest.mark.parametrize("variant", ["bad_kind", "valid_kind"])
def test_a_hostile_peer_report_leaves_no_secret_anywhere(outputs: Outputs, variant: str) -> None:
    before = outputs.seen("/peer_report/{variant}")
    status, headers, body = outputs.call(f"{FRONT}/peer_report/{variant}", "POST", body=b"{}")
    assert status == 500 and "x-ng-failure-report" in {name.lower() for name in headers}
    assert b"\x1b" not in body  # no escape bytes passed on either
    outputs.wait_spans("/peer_report/{variant}", before, 1)
    outputs.wait_logged("replying with failure")
    assert all(b"\x1b[2J" not in data for _, data in files_under(outputs.running.log_dir))
    assert outputs.leaks() == []


def test_exception_messages_never_leave_span_events_included(outputs: Outputs) -> None:
    before = outputs.seen("/boom")
    status, _, body = outputs.call(FRONT + "/boom", "POST", body=b"{}")
    assert status == 500 and b"database unreachable" in body
    (span,) = outputs.wait_spans("/boom", before, 1)[before:]
    assert any(name == "exception" for name, _ in span.events)
    outputs.wait_logged("unhandled exception")
    assert outputs.leaks() == []


def test_nothing_leaked_once_everything_stopped(outputs: Outputs) -> None:
    outputs.running.stop()
    assert outputs.leaks() == []


def test_a_harness_run_with_secret_faults_leaves_no_secret(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "faults:\n"
        "  - {server: resources, route: /verify, rate: 0.5, action: secret_in_error}\n"
        "  - {server: model, route: '*', rate: 0.3, action: bad_failure_report}\n"
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    with RawOtlpReceiver(HARNESS_RECEIVER_PORT) as receiver:
        for argv in (
            ["--out", str(out / "files")],
            ["--out", str(out / "otlp"), "--otlp-endpoint", receiver.endpoint],
        ):
            result = subprocess.run(
                [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--rollouts", "30",
                 "--concurrency", "6", "--faults", str(plan), "--port-base", str(HARNESS_PORT_BASE),
                 "--seed", "7", *argv],
                capture_output=True, timeout=240, env=env, cwd=tmp_path, check=False,
            )
            assert result.returncode in (0, 1), result.stderr[-2000:]
            streams = [("stdout", result.stdout), ("stderr", result.stderr)]
            assert occurrences(CANARY_SECRET, streams) == []
        blobs = [*files_under(out), *((f"otlp {path}", body) for path, body in receiver.bodies())]
    assert any(path.endswith("summary.json") for path, _ in blobs)
    assert any(path.endswith("rollouts.jsonl") for path, _ in blobs)  # the rows
    assert occurrences(CANARY_SECRET, blobs) == [] and occurrences(CANARY, blobs) == []
