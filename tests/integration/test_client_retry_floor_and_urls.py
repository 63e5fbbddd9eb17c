"""Issue 12.10 (a retry loop always backs off) and issue 11 (ServerClient honours the subprocess agent's
model-server URL), against real loopback processes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from gym_obs.client import _sessions
from gym_obs.client._retry import MIN_RETRY_DELAY_S, RetriesExhaustedError, TransportFailure
from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    configure_global_aiohttp_client,
    request,
)
from gym_obs.telemetry import names
from tests.integration.relay_support import raw_sink, start_script

pytestmark = pytest.mark.integration

REFUSING_PORT = 30510  # nothing listens here
MODEL_PORT = 30511
CONFIG_MODEL_PORT = 30512  # what the global config says: nothing listens (the child cannot reach it)


def test_a_backoff_of_zero_is_refused_by_the_public_api() -> None:
    with pytest.raises(ValueError, match="global_aiohttp_retry_backoff_base_seconds"):
        configure_global_aiohttp_client(
            GlobalAIOHTTPAsyncClientConfig.model_construct(
                **{**GlobalAIOHTTPAsyncClientConfig().model_dump(),
                   "global_aiohttp_retry_backoff_base_seconds": 0.0}
            )
        )


async def test_every_retry_waits_at_least_the_floor_even_with_an_unchecked_zero_backoff() -> None:
    budget_s = 0.3
    # model_construct skips validation: the loop's own floor is what is tested here (the 6,411-attempt storm)
    cfg = GlobalAIOHTTPAsyncClientConfig.model_construct(
        **{**GlobalAIOHTTPAsyncClientConfig().model_dump(),
           "global_aiohttp_retry_backoff_base_seconds": 0.0,
           "global_aiohttp_retry_backoff_cap_seconds": 0.0,
           "global_aiohttp_max_retry_seconds": budget_s}
    )
    _sessions.configure(cfg)
    attempts: list[TransportFailure] = []
    started = time.perf_counter()
    try:
        with pytest.raises(RetriesExhaustedError):
            await request("GET", f"http://127.0.0.1:{REFUSING_PORT}/x", _on_transport_failure=attempts.append)
    finally:
        elapsed = time.perf_counter() - started
        await close_global_aiohttp_client()
        _sessions.configure(GlobalAIOHTTPAsyncClientConfig())
    assert len(attempts) >= 2
    waits = [failure.backoff_s for failure in attempts if failure.will_retry]
    assert all(wait >= MIN_RETRY_DELAY_S for wait in waits[:-1])  # only the last may be cut by the budget
    assert len(attempts) <= elapsed / MIN_RETRY_DELAY_S + 1


_AGENT = """
    import asyncio, json, sys
    from gym_obs.client.server_client import ServerClient

    async def main() -> None:
        client = ServerClient.load_from_global_config()
        response = await client.post("policy_model", "/v1/responses", json={"input": "hi"},
                                     _max_num_tries=2)
        print("STATUS", response.status, flush=True)
        response.release()

    asyncio.run(main())
"""


async def test_server_client_in_a_subprocess_agent_uses_the_parents_model_server_url() -> None:
    config = {
        "servers": {
            "policy_model": {
                "entrypoint": "tests.integration.server_apps:DemoModelServer",
                "server_type": "responses_api_models",
                "port": CONFIG_MODEL_PORT,
            }
        }
    }
    async with raw_sink(MODEL_PORT) as sink:
        proc = await start_script(
            _AGENT,
            {
                names.ENV_GLOBAL_CONFIG: json.dumps(config),
                names.ENV_MODEL_SERVER_NAME: "policy_model",
                names.ENV_MODEL_SERVER_BASE_URL: f"http://127.0.0.1:{MODEL_PORT}/ng-rollout/r-42/",
            },
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert b"STATUS 200" in stdout, stderr.decode(errors="replace")[-2000:]
    assert sink.paths == ["/ng-rollout/r-42/v1/responses"]
    assert json.loads(sink.bodies[0]) == {"input": "hi"}


_SERVE = """
    import sys
    from gym_obs.cli import main
    sys.exit(main(["serve", sys.argv[1]]))
"""


async def test_gym_obs_serve_refuses_settings_the_kernel_or_a_backoff_cannot_honour(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "client:\n"
        "  global_aiohttp_tcp_keepalive_idle_seconds: 40000\n"
        "  global_aiohttp_tcp_keepalive_probes: 128\n"
        "  global_aiohttp_intended_concurrency_per_host: 0\n"
        "  global_aiohttp_retry_backoff_base_seconds: 0\n"
        "servers: {}\n"
    )
    proc = await start_script(_SERVE, {}, str(config))
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    out = (stdout + stderr).decode()
    assert proc.returncode not in (0, None), out
    for key in ("global_aiohttp_tcp_keepalive_idle_seconds", "global_aiohttp_tcp_keepalive_probes",
                "global_aiohttp_intended_concurrency_per_host", "global_aiohttp_retry_backoff_base_seconds"):
        assert key in out
    assert "Traceback" not in out
