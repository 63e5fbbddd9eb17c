"""Issue 12.3: the propagation rule holds on every hop of a redirect chain, per target.

A real gym server (uvicorn, child process) answers ``307`` to a real recording server that is not on the
allow-list; the client calls the gym server as a gym server (trace context, session, rollout id and
credentials all sent on the first hop). Asserted on the headers the recording server actually received.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import AsyncIterator

import orjson
import pytest

from gym_obs.client.http_client import close_global_aiohttp_client, request
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.testing import Capture
from tests.integration.relay_apps import RELAY_SCRIPT
from tests.integration.relay_support import CANARY, RawSink, raw_sink, start_script, wait_listening

pytestmark = pytest.mark.integration

GYM_PORT = 30530
SINK_PORT = 30531
SINK_URL = f"http://localhost:{SINK_PORT}/collect?from=redirect"
_PROPAGATED = ("traceparent", "tracestate", "baggage", "x-ng-session", "x-ng-rollout-id")
_HEADERS = {
    names.SESSION_HEADER: CANARY,
    names.ROLLOUT_ID_HEADER: "rollout-7",
    "tracestate": "vendor=abc",
    "baggage": "user=alice",
    "Authorization": f"Bearer {CANARY}",
    "Cookie": f"session={CANARY}",
    "X-Plain": "kept",
}


@pytest.fixture
async def gym_and_sink() -> AsyncIterator[RawSink]:
    config = {"servers": {"relay": {"entrypoint": "tests.integration.relay_apps:RelayServer",
                                    "server_type": "simple_agents", "port": GYM_PORT,
                                    "upstream_url": "http://127.0.0.1:1/", "redirect_to": SINK_URL}}}
    async with raw_sink(SINK_PORT) as sink:
        proc = await start_script(RELAY_SCRIPT, {}, json.dumps(config))
        try:
            await wait_listening(GYM_PORT)
            yield sink
        finally:
            await close_global_aiohttp_client()
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.communicate(), 30)


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_redirect_to_a_third_party_carries_no_trace_session_or_credentials(
    telemetry: Capture, gym_and_sink: RawSink, method: str
) -> None:
    sink = gym_and_sink
    response = await request(method, f"http://127.0.0.1:{GYM_PORT}/redirect-away", _internal=True,
                             _server_name="relay", headers=dict(_HEADERS), json={"q": 1})
    assert response.status == 200 and len(response.history) == 1 and response.history[0].status == 307
    response.release()
    assert sink.paths == ["/collect?from=redirect"]
    got = sink.headers[0]
    for name in (*_PROPAGATED, "authorization", "cookie"):
        assert name not in got, name
    assert got["x-plain"] == "kept"
    assert json.loads(sink.bodies[0]) == {"q": 1}  # 307 keeps the method and body
    assert CANARY not in repr(got)


async def test_an_allow_listed_redirect_target_gets_trace_context(
    telemetry: Capture, gym_and_sink: RawSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(STATE, "propagation_targets", frozenset({f"localhost:{SINK_PORT}"}))
    response = await request("GET", f"http://127.0.0.1:{GYM_PORT}/redirect-away", _internal=True,
                             headers=dict(_HEADERS))
    response.release()
    got = gym_and_sink.headers[0]
    assert re.fullmatch(names.TRACEPARENT_PATTERN, got["traceparent"])
    assert got["x-ng-rollout-id"] == "rollout-7"
    assert "authorization" not in got and "cookie" not in got  # another origin: credentials never follow


async def test_a_redirect_within_the_gym_server_keeps_everything(
    telemetry: Capture, gym_and_sink: RawSink
) -> None:
    response = await request("GET", f"http://127.0.0.1:{GYM_PORT}/redirect-home", _internal=True,
                             headers=dict(_HEADERS))
    echoed = orjson.loads(await response.read())
    assert response.history and response.history[0].status == 302
    assert re.fullmatch(names.TRACEPARENT_PATTERN, echoed["traceparent"])
    assert echoed["x-ng-session"] == CANARY and echoed["authorization"] == f"Bearer {CANARY}"
    assert gym_and_sink.headers == []


async def test_redirects_are_bounded_and_can_be_turned_off(
    telemetry: Capture, gym_and_sink: RawSink
) -> None:
    response = await request("GET", f"http://127.0.0.1:{GYM_PORT}/redirect-away", allow_redirects=False)
    assert response.status == 307 and gym_and_sink.headers == []
    response.release()
    import aiohttp

    with pytest.raises(aiohttp.TooManyRedirects):
        await request("GET", f"http://127.0.0.1:{GYM_PORT}/redirect-away", max_redirects=1)
    assert gym_and_sink.headers == []
