"""The launcher's clear errors (bad proxy allow-list, bad config key, a server that fails to start, a worker
count a server cannot support), ``gym-obs serve`` end to end, and a two-worker server.

Ports 24100-24199.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gym_obs.config import ConfigError, GlobalConfig, parse_global_config
from gym_obs.server.launcher import LaunchError, launch
from gym_obs.server.uvicorn import ServerStartupError
from tests.integration.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration

APPS = "tests.integration.server_apps"
REPO = Path(__file__).resolve().parents[2]


def _config(servers: dict[str, dict[str, Any]], head_port: int) -> GlobalConfig:
    return parse_global_config({"head_server": {"port": head_port}, "servers": servers})


def _child_env() -> dict[str, str]:
    paths = [str(REPO / "src"), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_bad_proxy_allow_list_is_refused_before_anything_starts(tmp_path: Path) -> None:
    config = _config(
        {
            "edge": {
                "entrypoint": f"{APPS}:DemoModelServer",
                "server_type": "responses_api_models",
                "port": 24101,
                "proxy_headers": True,
                "forwarded_allow_ips": ["10.0.0.1", "::ffff:0:0/96"],
            }
        },
        head_port=24100,
    )
    with pytest.raises(ServerStartupError) as caught, launch(config, log_dir=tmp_path):
        pass
    message = str(caught.value)
    assert "servers.edge.forwarded_allow_ips" in message and "'::ffff:0:0/96'" in message
    assert not list(tmp_path.iterdir())  # no process was started, so no log either


def test_server_that_fails_to_start_is_named_with_the_tail_of_its_log(tmp_path: Path) -> None:
    config = _config(
        {
            "model": {
                "entrypoint": f"{APPS}:DemoModelServer",
                "server_type": "responses_api_models",
                "port": 24111,
            },
            "broken": {
                "entrypoint": f"{APPS}:BrokenServer",
                "server_type": "resources_servers",
                "port": 24112,
            },
        },
        head_port=24110,
    )
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught, launch(config, log_dir=tmp_path):
        pass
    message = str(caught.value)
    assert message.startswith("server 'broken' exited with code")
    assert "before becoming ready" in message
    assert "model weights not found at /nonexistent/weights.bin" in message  # the tail of its log
    assert time.monotonic() - started < 30
    with pytest.raises(OSError):  # everything that did start was stopped again
        urllib.request.urlopen("http://127.0.0.1:24111/livez", timeout=1)


def test_a_server_that_cannot_share_state_is_refused_more_workers(tmp_path: Path) -> None:
    config = _config(
        {
            "resources": {
                "entrypoint": f"{APPS}:DemoResourcesServer",
                "server_type": "resources_servers",
                "port": 24121,
                "num_workers": 2,
            }
        },
        head_port=24120,
    )
    with pytest.raises(LaunchError) as caught, launch(config, log_dir=tmp_path):
        pass
    message = str(caught.value)
    assert "servers.resources.num_workers=2" in message
    assert "episode state lives in this process's memory" in message


def test_unknown_entrypoint_module_is_named(tmp_path: Path) -> None:
    config = _config(
        {"model": {"entrypoint": "no_such_package.models:Model", "server_type": "resources_servers",
                   "port": 24131}},
        head_port=24130,
    )
    with (
        pytest.raises(
            LaunchError, match=r"servers\.model\.entrypoint: cannot import module 'no_such_package"
        ),
        launch(config, log_dir=tmp_path),
    ):
        pass


def test_two_workers_serve_one_port(tmp_path: Path) -> None:
    config = _config(
        {
            "model": {
                "entrypoint": f"{APPS}:DemoModelServer",
                "server_type": "responses_api_models",
                "port": 24141,
                "num_workers": 2,
            }
        },
        head_port=24140,
    )
    with launch(config, log_dir=tmp_path) as running:
        pids = set()
        for _ in range(40):
            with urllib.request.urlopen("http://127.0.0.1:24141/livez", timeout=2) as response:
                assert response.status == 200
                pids.add(json.loads(response.read())["pid"])
        assert running.servers["model"].pid not in pids  # answered by the workers, not the supervisor
        assert len(pids) >= 1


@pytest.mark.parametrize(("workers", "port"), [(1, 24181), (2, 24183)])
def test_a_served_process_has_frozen_its_startup_objects(tmp_path: Path, workers: int, port: int) -> None:
    """The serving process (or each worker) froze what it imported before serving, so full collections
    under load do not walk the import graph again."""
    config = _config(
        {
            "frozen": {
                "entrypoint": f"{APPS}:FrozenHeapServer",
                "server_type": "resources_servers",
                "port": port,
                "num_workers": workers,
            }
        },
        head_port=port - 1,
    )
    with launch(config, log_dir=tmp_path) as running:
        seen: dict[int, int] = {}
        for _ in range(20):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/frozen", timeout=2) as response:
                reply = json.loads(response.read())
            seen[reply["pid"]] = reply["frozen"]
    assert seen and all(count > 10_000 for count in seen.values()), seen  # FastAPI + the SDK: far more
    if workers > 1:
        assert running.servers["frozen"].pid not in seen  # a worker answered, and froze its own


def test_bad_config_key_is_a_clear_error_from_the_command(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "servers:\n  policy_model:\n    entrypoint: a.b:C\n"
        "    server_type: responses_api_models\n    port: abc\nbogus_top_level: 1\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "serve", str(path)],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "servers.policy_model.port: Input should be a valid integer" in result.stderr
    assert "bogus_top_level: unknown key" in result.stderr
    with pytest.raises(ConfigError, match=r"servers\.policy_model\.port"):
        from gym_obs.config import load_global_config

        load_global_config(path)


def _serve(config: Path, tmp_path: Path) -> subprocess.Popen[str]:
    """``gym-obs serve CONFIG`` as a child process, output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "gym_obs.cli", "serve", str(config), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_child_env(), "COLUMNS": "200"},
        cwd=REPO,
    )


def _read_table(process: subprocess.Popen[str]) -> str:
    """Everything ``serve`` printed up to its "Press Ctrl-C" line (the table of servers and URLs)."""
    assert process.stdout is not None
    lines: list[str] = []
    while not any("Press Ctrl-C" in line for line in lines):
        line = process.stdout.readline()
        assert line, f"serve exited early: {process.stderr.read() if process.stderr else ''}"
        lines.append(line)
    return "".join(lines)


def test_serve_command_prints_the_table_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "head_server: {port: 24150}\nservers:\n"
        f"  model: {{entrypoint: '{APPS}:DemoModelServer', server_type: responses_api_models, port: 24151}}\n"
    )
    process = _serve(path, tmp_path)
    try:
        table = _read_table(process)
        assert "http://127.0.0.1:24151" in table and "http://127.0.0.1:24150" in table
        with urllib.request.urlopen("http://127.0.0.1:24151/readyz", timeout=2) as response:
            assert response.status == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with pytest.raises(OSError):
        urllib.request.urlopen("http://127.0.0.1:24151/livez", timeout=1)


def test_serve_stops_everything_when_one_server_dies(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "head_server: {port: 24160}\nservers:\n"
        f"  model: {{entrypoint: '{APPS}:DemoModelServer', server_type: responses_api_models, port: 24161}}\n"
        f"  resources: {{entrypoint: '{APPS}:DemoResourcesServer', server_type: resources_servers,\n"
        "               port: 24162}\n"
    )
    process = _serve(path, tmp_path)
    try:
        _read_table(process)
        with urllib.request.urlopen("http://127.0.0.1:24160/server_instances", timeout=2) as response:
            pids = {item["name"]: item["pid"] for item in json.loads(response.read())}
        os.kill(pids["model"], signal.SIGKILL)
        assert process.wait(timeout=30) == 1
        assert process.stderr is not None
        assert "server 'model' was killed by SIGKILL" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with pytest.raises(OSError):  # the survivor was stopped too
        urllib.request.urlopen("http://127.0.0.1:24162/livez", timeout=1)


def test_spans_are_flushed_on_shutdown(tmp_path: Path) -> None:
    config = parse_global_config(
        {
            "head_server": {"port": 24170},
            "telemetry": {
                "enabled": True,
                "traces_exporter": "otlp",
                "metrics_exporter": "none",
                "otlp_endpoint": "http://127.0.0.1:24901",
                "otlp_protocol": "http/protobuf",
            },
            "servers": {
                "model": {
                    "entrypoint": f"{APPS}:DemoModelServer",
                    "server_type": "responses_api_models",
                    "port": 24171,
                }
            },
        }
    )
    env = {"OTEL_BSP_SCHEDULE_DELAY": "600000"}  # never by timer: only the shutdown flush can export
    with OtlpReceiver(24901) as receiver:
        with launch(config, log_dir=tmp_path, env=env):
            request = urllib.request.Request(
                "http://127.0.0.1:24171/v1/responses", data=b'{"input": "x"}', method="POST"
            )
            request.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.status == 200
            time.sleep(0.5)
            assert receiver.spans() == []
        spans = receiver.wait_for(lambda spans: bool(spans), timeout_s=10)
    assert [(span.service_name, span.name) for span in spans] == [("gym/model", "POST /v1/responses")]
