"""Clients gym_obs does not own, against a real model server process exporting OTLP to a receiver:
an httpx client with the rollout hook, and a subprocess agent given only the two environment variables,
both land in the caller's rollout and trace. The same server runs with profiling on and raises its
open-file limit at start-up.

Ports: head 26200, model 26201, OTLP receiver 26290.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gym_obs.client import ServerClient, get_server_url, subprocess_agent_env
from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.server.launcher import Launch, launch
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import async_rollout_prefix_hook, rollout_context, rollout_prefix_hook
from gym_obs.telemetry.spans import client_span, current_ids
from gym_obs.telemetry.testing import Capture
from tests.integration.otlp_receiver import (
    LAUNCH_ENV,
    SPAN_KIND_SERVER,
    OtlpReceiver,
    ReceivedSpan,
    otlp_traces_telemetry,
)

pytestmark = pytest.mark.integration

HEAD_PORT = 26200
MODEL_PORT = 26201
RECEIVER_PORT = 26290
MODEL_URL = f"http://127.0.0.1:{MODEL_PORT}"
APPS = "tests.integration.runtime_apps"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(profiles: Path) -> GlobalConfig:
    return parse_global_config(
        {
            "head_server": {"port": HEAD_PORT},
            "telemetry": otlp_traces_telemetry(RECEIVER_PORT),
            "servers": {
                "model": {
                    "entrypoint": f"{APPS}:RuntimeModelServer",
                    "server_type": "responses_api_models",
                    "port": MODEL_PORT,
                    "profiling_enabled": True,
                    "profiling_results_dirpath": str(profiles),
                },
            },
        }
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver(RECEIVER_PORT) as running:
        yield running


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def deployment(
    receiver: OtlpReceiver, profiles: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Launch]:
    with launch(_config(profiles), log_dir=tmp_path_factory.mktemp("logs"), env=LAUNCH_ENV) as running:
        yield running


async def _model_server_span(receiver: OtlpReceiver, trace_id: str) -> ReceivedSpan:
    def arrived(spans: list[ReceivedSpan]) -> bool:
        return any(s.trace_id == trace_id and s.service_name == "gym/model" for s in spans)

    await receiver.await_for(arrived)
    (server,) = [s for s in receiver.trace(trace_id) if s.service_name == "gym/model"]
    return server


async def test_httpx_client_with_the_hook_reaches_the_model_in_the_rollout_and_trace(
    deployment: Launch, receiver: OtlpReceiver, telemetry: Capture
) -> None:
    hook = async_rollout_prefix_hook([MODEL_URL])
    async with httpx.AsyncClient(event_hooks={"request": [hook]}, trust_env=False) as client:
        with rollout_context("rollout-hook"), client_span("agent turn"):
            trace_id, span_id = current_ids()
            response = await client.post(f"{MODEL_URL}/v1/responses", json={"input": "hi"})
        assert response.status_code == 200, response.text
    assert response.json() == {"output": "echo hi", "rollout_id": "rollout-hook"}
    prefix = f"{MODEL_URL}/ng-rollout/rollout-hook/ng-trace/00-{trace_id}-"
    assert str(response.request.url).startswith(prefix)
    assert trace_id is not None
    server = await _model_server_span(receiver, trace_id)
    assert server.kind == SPAN_KIND_SERVER
    assert server.parent_span_id == span_id
    assert server.name == "POST /v1/responses"  # routed on the stripped path
    assert server.attributes[names.ATTR_ROLLOUT_ID] == "rollout-hook"


async def test_sync_hook_through_to_thread(deployment: Launch, telemetry: Capture) -> None:
    client = httpx.Client(event_hooks={"request": [rollout_prefix_hook(MODEL_URL)]}, trust_env=False)
    with client, rollout_context("rollout-sync"):
        response = await asyncio.to_thread(client.post, f"{MODEL_URL}/v1/responses", json={"input": "x"})
    assert response.json()["rollout_id"] == "rollout-sync"


async def test_subprocess_agent_given_only_two_variables_reaches_the_model(
    deployment: Launch, receiver: OtlpReceiver, telemetry: Capture
) -> None:
    server_client = ServerClient(deployment.config)
    base_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT / "src")}
    with rollout_context("rollout-sub"), client_span("spawn agent"):
        trace_id, span_id = current_ids()
        env = subprocess_agent_env("model", base_env=base_env, server_client=server_client)
    assert set(env) == {"PATH", "PYTHONPATH", names.ENV_MODEL_SERVER_NAME, names.ENV_MODEL_SERVER_BASE_URL}
    assert env[names.ENV_MODEL_SERVER_BASE_URL].startswith(f"{MODEL_URL}/ng-rollout/rollout-sub/ng-trace/")
    agent = textwrap.dedent(
        """
        import json, os, urllib.request
        from gym_obs.client import get_server_url
        assert "GYM_OBS_GLOBAL_CONFIG" not in os.environ
        url = get_server_url("model") + "/v1/responses"
        body = json.dumps({"input": "from child"}).encode()
        request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=30) as response:
            print(json.dumps({"url": url, "reply": json.loads(response.read())}))
        """
    )
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", agent], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["reply"] == {"output": "echo from child", "rollout_id": "rollout-sub"}
    assert trace_id is not None
    server = await _model_server_span(receiver, trace_id)
    assert server.parent_span_id == span_id
    assert server.attributes[names.ATTR_ROLLOUT_ID] == "rollout-sub"


def test_get_server_url_prefers_the_environment(monkeypatch: pytest.MonkeyPatch, deployment: Launch) -> None:
    server_client = ServerClient(deployment.config)
    assert get_server_url("model", server_client=server_client) == MODEL_URL  # outside a rollout
    with rollout_context("r-9"):
        assert get_server_url("model", server_client=server_client) == f"{MODEL_URL}/ng-rollout/r-9"
        assert get_server_url("model", server_client=server_client, rollout_prefix=False) == MODEL_URL
    monkeypatch.setenv(names.ENV_MODEL_SERVER_NAME, "model")
    monkeypatch.setenv(names.ENV_MODEL_SERVER_BASE_URL, "http://elsewhere:1/ng-rollout/r-1/")
    assert get_server_url("model", server_client=server_client) == "http://elsewhere:1/ng-rollout/r-1"
    assert get_server_url("model") == "http://elsewhere:1/ng-rollout/r-1"  # no config needed at all
    with rollout_context("r-2"):
        env = subprocess_agent_env("model", base_env={})
    assert env[names.ENV_MODEL_SERVER_BASE_URL] == "http://elsewhere:1/ng-rollout/r-1"  # kept as given


def test_profiling_writes_a_report_on_stats(deployment: Launch, profiles: Path) -> None:
    with httpx.Client(base_url=MODEL_URL, trust_env=False) as client:
        for _ in range(5):
            assert client.get("/burn").status_code == 200
        stats = client.get("/stats").json()
    profile = stats["profile"]
    assert stats["pid"] == deployment.servers["model"].pid
    text = Path(profile["text_path"]).read_text(encoding="utf-8")
    assert Path(profile["text_path"]).parent == profiles
    assert profile["samples"] > 0 and profile["cpu_s"] > 0
    assert "_burn_cpu" in text
    assert Path(profile["html_path"]).stat().st_size > 1000


def test_server_raised_its_open_file_limit_at_start_up(deployment: Launch) -> None:
    log = deployment.servers["model"].log_path.read_text(encoding="utf-8")
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    (limit,) = [record for record in records if record["event"] == "open-file limit"]
    assert {"before", "after", "hard", "changed", "reason"} <= set(limit)
    assert limit["after"] >= limit["before"]
    assert limit["changed"] or "meets" in limit["reason"] or "hard limit" in limit["reason"]


def test_echoed_output_is_prefixed_and_the_profile_is_written_on_shutdown(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path / "profiles")
    config.head_server.port = 26300
    config.servers["model"].port = 26301
    config.telemetry.enabled = False
    with launch(config, log_dir=tmp_path / "logs", echo_output=True) as running:
        with httpx.Client(base_url="http://127.0.0.1:26301", trust_env=False) as client:
            assert client.get("/burn").status_code == 200
        pid = running.servers["model"].pid
    out = capfd.readouterr().out
    model_lines = [line for line in out.splitlines() if line.startswith("(model) ")]
    head_lines = [line for line in out.splitlines() if line.startswith("(head_server) ")]
    assert model_lines and head_lines
    assert any("profile written" in line for line in model_lines)
    log = (tmp_path / "logs" / "model.log").read_text(encoding="utf-8")
    assert "(model)" not in log and "profile written" in log  # the log file keeps the raw lines
    text = (tmp_path / "profiles" / f"model-{pid}.txt").read_text(encoding="utf-8")
    assert "_burn_cpu" in text
