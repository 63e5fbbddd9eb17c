"""The resource of real gym processes: ``service.version`` and ``gym.run.id`` (config, else the batch
scheduler's job id, else one generated id shared by every process of a launch). Ports 32200-32299."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import gym_obs
from gym_obs.config import parse_global_config
from gym_obs.harness.telemetry_files import attributes_of
from gym_obs.server.launcher import launch
from gym_obs.telemetry import names

pytestmark = pytest.mark.integration

APPS = "tests.integration.server_apps"
REPO = Path(__file__).resolve().parents[2]
_CLEAN = ("OTEL_", "GYM_OBS_", "SLURM_", "PBS_", "LSB_", "JOB_ID")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLEAN)}
    paths = [str(REPO / "src"), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(paths), **extra}


def _resources(directory: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            for key in ("resourceSpans", "resourceMetrics"):
                for item in doc.get(key, ()):
                    found.append(attributes_of(item.get("resource", {}).get("attributes")))
    return found


def _probe(tmp_path: Path, *, config: str = "", **env: str) -> dict[str, Any]:
    out = tmp_path / f"probe-{len(list(tmp_path.iterdir()))}"
    script = textwrap.dedent(
        f"""
        from gym_obs.config import TelemetryConfig
        from gym_obs.telemetry.setup import setup_telemetry
        handle = setup_telemetry("probe", "x", config=TelemetryConfig(
            enabled=True, traces_exporter="file", metrics_exporter="file",
            file_export_dir={str(out)!r}, {config}))
        with handle.tracer_provider.get_tracer("t").start_as_current_span("s"):
            pass
        handle.shutdown(5.0)
        """
    )
    subprocess.run([sys.executable, "-c", script], env=_env(**env), check=True, timeout=60)
    resources = _resources(out)
    assert resources
    assert (
        len({json.dumps(r, sort_keys=True, default=str) for r in resources if "service.instance.id" in r})
        >= 1
    )
    return resources[0]


def test_service_version_is_gym_obs_unless_overridden(tmp_path: Path) -> None:
    assert _probe(tmp_path)[names.SERVICE_VERSION] == gym_obs.__version__
    assert _probe(tmp_path, OTEL_SERVICE_VERSION="9.9.9")[names.SERVICE_VERSION] == "9.9.9"
    via_attributes = _probe(tmp_path, OTEL_RESOURCE_ATTRIBUTES="service.version=1.2.3")
    assert via_attributes[names.SERVICE_VERSION] == "1.2.3"
    configured = _probe(
        tmp_path, config="resource_attributes={'service.version': 'mine'}", OTEL_SERVICE_VERSION="9.9.9"
    )
    assert configured[names.SERVICE_VERSION] == "mine"


def test_run_id_is_config_then_scheduler_job_then_generated(tmp_path: Path) -> None:
    assert _probe(tmp_path, SLURM_JOB_ID="812345")[names.ATTR_RUN_ID] == "812345"
    assert _probe(tmp_path, PBS_JOBID="77.pbs-head")[names.ATTR_RUN_ID] == "77.pbs-head"
    assert _probe(tmp_path, LSB_JOBID="4411")[names.ATTR_RUN_ID] == "4411"
    assert _probe(tmp_path, JOB_ID="99")[names.ATTR_RUN_ID] == "99"
    assert _probe(tmp_path, SLURM_JOB_ID="1", GYM_OBS_RUN_ID="launcher")[names.ATTR_RUN_ID] == "launcher"
    assert _probe(tmp_path, config="run_id='cfg'", SLURM_JOB_ID="1")[names.ATTR_RUN_ID] == "cfg"
    generated = _probe(tmp_path)[names.ATTR_RUN_ID]
    assert generated and generated != _probe(tmp_path)[names.ATTR_RUN_ID]


def _launched_run_ids(tmp_path: Path, env: dict[str, str], port: int) -> list[str]:
    out = tmp_path / f"telemetry-{port}"
    config = parse_global_config(
        {
            "head_server": {"port": port},
            "telemetry": {
                "enabled": True,
                "traces_exporter": "file",
                "metrics_exporter": "file",
                "file_export_dir": str(out),
            },
            "servers": {
                "model": {
                    "entrypoint": f"{APPS}:DemoModelServer",
                    "server_type": "responses_api_models",
                    "port": port + 1,
                    "num_workers": 2,
                },
                "resources": {
                    "entrypoint": f"{APPS}:DemoResourcesServer",
                    "server_type": "resources_servers",
                    "port": port + 2,
                },
            },
        }
    )
    with launch(config, log_dir=tmp_path / f"logs-{port}", env=env):
        for offset, route in (
            (1, "/v1/responses"),
            (1, "/v1/responses"),
            (1, "/v1/responses"),
            (2, "/verify"),
        ):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port + offset}{route}",
                data=b"{}",
                headers={"content-type": "application/json"},
            )
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=5).close()
    instances = {}
    for resource in _resources(out):
        instances[resource[names.SERVICE_INSTANCE_ID]] = resource[names.ATTR_RUN_ID]
    assert len(instances) >= 2  # model (its workers) and resources, each process its own instance
    return list(instances.values())


def test_every_process_of_a_launch_shares_one_run_id(tmp_path: Path) -> None:
    # the test process may carry a run id from an earlier set-up: clear it for the children
    generated = _launched_run_ids(tmp_path, {names.ENV_RUN_ID: "", "SLURM_JOB_ID": ""}, 32200)
    assert len(set(generated)) == 1 and generated[0]
    job = _launched_run_ids(tmp_path, {names.ENV_RUN_ID: "", "SLURM_JOB_ID": "5150"}, 32210)
    assert set(job) == {"5150"}
