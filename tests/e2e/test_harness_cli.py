"""``gym-obs harness run`` says clearly, with a non-zero exit, when the harness itself cannot run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _run(tmp_path: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    argv = ["harness", "run", "--out", str(tmp_path / "out"), "--rollouts", "4", *args]
    if code is None:
        command = [sys.executable, "-m", "gym_obs.cli", *argv]
    else:
        command = [
            sys.executable,
            "-c",
            f"{code}\nfrom gym_obs.cli import main\nraise SystemExit(main({argv!r}))",
        ]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, env=env)


def test_bad_plan_names_the_key(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - server: model\n    route: /v1/responses\n    actoin: raise\n")
    done = _run(tmp_path, "--faults", str(plan), "--port-base", "25500")
    assert done.returncode == 2
    assert "faults[0].actoin" in done.stderr and str(plan) in done.stderr
    assert "Traceback" not in done.stderr


def test_plan_for_an_unknown_server(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {server: modle, route: /v1/responses, action: disconnect}\n")
    done = _run(tmp_path, "--faults", str(plan), "--port-base", "25500")
    assert done.returncode == 2
    assert "faults[0].server" in done.stderr and "'modle'" in done.stderr


def test_busy_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 25502))
        sock.listen()
        done = _run(tmp_path, "--port-base", "25500")
    assert done.returncode == 2
    assert "port 25502" in done.stderr and "servers.model_0" in done.stderr and "in use" in done.stderr


def test_server_that_fails_to_start(tmp_path: Path) -> None:
    broken = (
        "from gym_obs.harness.servers import ENTRYPOINTS\n"
        "ENTRYPOINTS['resources'] = 'gym_obs.harness.servers.resources:NoSuchServer'"
    )
    done = _run(tmp_path, "--port-base", "25510", code=broken)
    assert done.returncode == 2
    assert "did not start" in done.stderr and "resources_0" in done.stderr
    assert "NoSuchServer" in done.stderr  # the tail of the server's log says why
    with socket.socket() as sock:  # everything that started was stopped again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 25511))
