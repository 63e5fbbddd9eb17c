"""Children die with their launcher: kill -9 of ``gym-obs serve`` or ``gym-obs harness run`` leaves no server
running (uvicorn workers included), and a relaunch on the same ports works.

Ports 32100-32199. Real processes; leftovers are found through /proc (no psutil).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.processes import alive, descendants, wait_until

pytestmark = pytest.mark.integration

APPS = "tests.integration.server_apps"
REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    paths = [str(REPO / "src"), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, "PYTHONPATH": os.pathsep.join(paths), "COLUMNS": "200"}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())


def _serve(config: Path, logs: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gym_obs.cli", "serve", str(config), "--log-dir", str(logs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
    )


def _wait_for_table(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        assert line, f"serve exited early: {process.stderr.read() if process.stderr else ''}"
        if "Press Ctrl-C" in line:
            return


def _kill_leftovers(pids: set[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "head_server: {port: 32100}\nservers:\n"
        f"  model: {{entrypoint: '{APPS}:DemoModelServer', server_type: responses_api_models, port: 32101,\n"
        "           num_workers: 2}\n"
        f"  resources: {{entrypoint: '{APPS}:DemoResourcesServer', server_type: resources_servers,\n"
        "               port: 32102}\n"
    )
    return path


def test_kill_9_of_serve_takes_every_server_and_worker_with_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    process = _serve(config, tmp_path / "logs")
    children: set[int] = set()
    try:
        _wait_for_table(process)
        children = descendants(process.pid)
        workers = {_get("http://127.0.0.1:32101/livez")["pid"] for _ in range(20)}
        assert workers <= children and len(children) >= 5  # head, model + 2 workers, resources
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        for pid in children:
            wait_until(lambda pid=pid: not alive(pid), 30, f"server process {pid} to die with serve")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _kill_leftovers(children)
    again = _serve(config, tmp_path / "logs-again")  # the same ports are free again
    try:
        _wait_for_table(again)
        assert _get("http://127.0.0.1:32101/livez")["pid"]
        again.send_signal(signal.SIGINT)
        assert again.wait(timeout=60) == 0
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()


def test_kill_9_of_the_harness_takes_every_server_with_it(tmp_path: Path) -> None:
    def harness(out: Path, rollouts: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--out", str(out), "--rollouts",
             str(rollouts), "--concurrency", "4", "--port-base", "32110", "--model-latency-ms", "50"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )

    out = tmp_path / "out"
    process = harness(out, 100_000)
    children: set[int] = set()
    try:
        rows = out / "latest" / "rollouts.jsonl"
        wait_until(lambda: rows.exists() and rows.stat().st_size > 0, 120, "the first rows")
        children = descendants(process.pid)
        assert len(children) >= 4  # head, agent, model, resources
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        for pid in children:
            wait_until(lambda pid=pid: not alive(pid), 30, f"server process {pid} to die with the harness")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _kill_leftovers(children)
    again = harness(tmp_path / "again", 8)
    _, stderr = again.communicate(timeout=180)
    assert again.returncode == 0, stderr[-3000:]
    assert json.loads((tmp_path / "again" / "latest" / "summary.json").read_text())["rollouts"] == 8
