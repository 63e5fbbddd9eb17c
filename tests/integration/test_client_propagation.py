"""Trace propagation, redaction and JSON bodies, checked on what a real aiohttp.web server received."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web
from opentelemetry.trace import SpanKind, StatusCode

from gym_obs.client import ServerClient
from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    get_global_aiohttp_client,
    request,
    set_global_aiohttp_client,
)
from gym_obs.config import GlobalConfig
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import rollout_context
from gym_obs.telemetry.testing import Capture, telemetry_state
from tests.integration.client_support import next_port

STATE = telemetry_state()

pytestmark = pytest.mark.integration

TRACEPARENT = re.compile(names.TRACEPARENT_PATTERN)


@dataclass
class Seen:
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    raw: list[list[tuple[str, str]]] = field(default_factory=list)  # every field as sent, repeats too


@pytest.fixture
async def web_server() -> AsyncIterator[tuple[str, int, Seen]]:
    seen = Seen()

    async def handle(req: web.Request) -> web.Response:
        seen.headers.append({k.lower(): v for k, v in req.headers.items()})
        seen.bodies.append(await req.read())
        seen.queries.append(req.query_string)
        seen.raw.append([(k.decode().lower(), v.decode()) for k, v in req.raw_headers])
        status = int(req.query.get("status", "200"))
        return web.json_response({"ok": True}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = next_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    yield f"http://127.0.0.1:{port}", port, seen
    await close_global_aiohttp_client()
    await runner.cleanup()


async def test_internal_calls_carry_this_spans_traceparent_in_a_copy_of_the_headers(
    web_server: tuple[str, int, Seen], telemetry: Capture
) -> None:
    base, _port, seen = web_server
    headers = {"X-Caller": "1"}
    with rollout_context("rollout-42"):
        response = await request("POST", f"{base}/v1/responses", json={"q": 1}, headers=headers,
                                 _internal=True, _server_name="policy_model", _route="/v1/responses")
    assert response.status == 200
    response.release()
    assert headers == {"X-Caller": "1"}  # the caller's object is never mutated

    (span,) = [s for s in telemetry.spans() if s.kind == SpanKind.CLIENT]
    assert span.name == "POST /v1/responses"
    sent = seen.headers[0]["traceparent"]
    assert TRACEPARENT.fullmatch(sent)
    ctx = span.get_span_context()
    assert sent.startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    attrs = dict(span.attributes or {})
    assert attrs[names.ATTR_ROLLOUT_ID] == "rollout-42"
    assert attrs[names.ATTR_SERVER_NAME] == "policy_model"
    assert seen.headers[0]["x-caller"] == "1"
    assert seen.headers[0]["content-type"] == "application/json"
    assert orjson.loads(seen.bodies[0]) == {"q": 1}


@pytest.fixture(params=[True, False], ids=["telemetry_on", "telemetry_off"])
def maybe_telemetry(request: pytest.FixtureRequest) -> Capture | None:
    if request.param:
        return request.getfixturevalue("telemetry")  # type: ignore[no-any-return]
    assert not STATE.enabled
    return None


async def test_server_client_sends_the_rollout_id_once_and_never_changes_the_callers_headers(
    web_server: tuple[str, int, Seen], maybe_telemetry: Capture | None
) -> None:
    _base, port, seen = web_server
    config = GlobalConfig.model_validate({"servers": {"model": {
        "entrypoint": "tests.integration.server_apps:DemoModelServer", "server_type": "responses_api_models",
        "port": port,
    }}})
    client = ServerClient(config)
    caller = {"X-Caller": "1"}
    with rollout_context("rollout-7"):
        # a model call (a dialect route on a model server), released on a temporary: nothing left to do
        (await client.post("model", "v1/responses", json={"q": 1}, headers=caller)).release()
        (await client.get("model", "/v1/models", headers={"x-ng-rollout-id": "mine"})).release()
    (await client.request("model", "/v1/x", "PUT", headers=caller)).release()  # outside any rollout
    assert caller == {"X-Caller": "1"}

    def fields(index: int, name: str) -> list[str]:
        return [value for key, value in seen.raw[index] if key == name]

    assert fields(0, "x-ng-rollout-id") == ["rollout-7"] and fields(0, "x-caller") == ["1"]
    assert fields(1, "x-ng-rollout-id") == ["mine"]  # the caller's own value wins, in any case
    assert fields(2, "x-ng-rollout-id") == [] and fields(2, "x-caller") == ["1"]
    for index in range(3):
        assert len(fields(index, "traceparent")) == (maybe_telemetry is not None)
    assert orjson.loads(seen.bodies[0]) == {"q": 1}


async def test_no_traceparent_to_a_host_not_on_the_allow_list(
    web_server: tuple[str, int, Seen], telemetry: Capture
) -> None:
    base, port, seen = web_server
    (await request("GET", f"{base}/external")).release()
    assert "traceparent" not in seen.headers[0]

    STATE.propagation_targets = frozenset({f"127.0.0.1:{port + 1}"})  # another port: still no
    (await request("GET", f"{base}/external")).release()
    assert "traceparent" not in seen.headers[1]

    STATE.propagation_targets = frozenset({f"127.0.0.1:{port}"})
    (await request("GET", f"{base}/allowed")).release()
    assert TRACEPARENT.fullmatch(seen.headers[2]["traceparent"])
    assert len([s for s in telemetry.spans() if s.kind == SpanKind.CLIENT]) == 3


async def test_no_query_string_or_credential_in_any_attribute(
    web_server: tuple[str, int, Seen], telemetry: Capture
) -> None:
    _base, port, seen = web_server
    url = f"http://alice:s3cr3tpass@127.0.0.1:{port}/v1/x?api_key=TOPSECRET&status=503#frag"
    response = await request("GET", url, _max_num_tries=1)
    assert response.status == 503
    response.release()
    assert seen.queries[0].startswith("api_key=TOPSECRET")  # the server did get it

    (span,) = [s for s in telemetry.spans() if s.kind == SpanKind.CLIENT]
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes or {})[names.ATTR_ERROR_TYPE] == "503"
    recorded: list[str] = [str(v) for v in (span.attributes or {}).values()]
    for event in span.events:
        recorded += [str(v) for v in (event.attributes or {}).values()]
    for metric in telemetry.metric_names():
        for point in telemetry.metric_points(metric):
            recorded += [str(v) for v in point.attributes.values()]
    text = " ".join(recorded)
    for secret in ("TOPSECRET", "api_key", "s3cr3tpass", "alice", "frag"):
        assert secret not in text
    assert (span.attributes or {})[names.ATTR_URL_FULL] == f"http://REDACTED:REDACTED@127.0.0.1:{port}/v1/x"


async def test_telemetry_off_sends_nothing_and_uses_a_session_without_trace_configs(
    web_server: tuple[str, int, Seen],
) -> None:
    base, _port, seen = web_server
    assert not STATE.enabled
    response = await request("GET", f"{base}/off", _internal=True)
    assert response.status == 200
    response.release()
    assert "traceparent" not in seen.headers[0]
    assert get_global_aiohttp_client().trace_configs == []


@pytest.mark.parametrize("traces", [True, False], ids=["traces_on", "metrics_only"])
@pytest.mark.parametrize("internal", [True, False], ids=["internal", "external"])
async def test_a_successful_request_reaches_the_server_exactly_once(
    web_server: tuple[str, int, Seen], telemetry: Capture, internal: bool, traces: bool
) -> None:
    """Whatever path the telemetry takes (span opened first or late, or no span at all), one send."""
    base, _, seen = web_server
    saved = STATE.traces_enabled
    STATE.traces_enabled = traces
    try:
        for method in ("GET", "POST"):
            response = await request(method, f"{base}/once", _internal=internal, _server_name="model")
            await response.read()
    finally:
        STATE.traces_enabled = saved
    assert len(seen.headers) == 2
    points = telemetry.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)
    assert sum(p.count or 0 for p in points) == 2
    assert len(telemetry.spans()) == (2 if traces else 0)
