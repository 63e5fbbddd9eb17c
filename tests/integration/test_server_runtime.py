"""Three real server processes started by the launcher (agent -> model, agent -> resources), exporting
OTLP to a receiver in the test: one trace across processes, failures re-raised at the caller with their
original ids and root cause, recovered failures reported on success, disconnects cancelling handlers.

Ports: head 24000, agent 24001, model 24002, resources 24003, OTLP receiver 24900.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from gym_obs.client import HeadServerUnavailableError, ServerClient
from gym_obs.client.boundary import raise_boundary_failure
from gym_obs.client.http_client import close_global_aiohttp_client
from gym_obs.config import GlobalConfig, HeadServerConfig, parse_global_config
from gym_obs.failures import ForeignFailure, NgFailureEvent, decode_failure_report
from gym_obs.server.launcher import Launch, launch
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import rollout_context
from gym_obs.telemetry.testing import Capture
from tests.integration.otlp_receiver import (
    LAUNCH_ENV,
    SPAN_KIND_CLIENT,
    SPAN_KIND_SERVER,
    OtlpReceiver,
    ReceivedSpan,
    otlp_traces_telemetry,
)
from tests.integration.server_apps import SECRET

pytestmark = pytest.mark.integration

RECEIVER_PORT = 24900
HEAD_PORT = 24000
APPS = "tests.integration.server_apps"


def _config() -> GlobalConfig:
    return parse_global_config(
        {
            "head_server": {"host": "127.0.0.1", "port": HEAD_PORT},
            "telemetry": otlp_traces_telemetry(RECEIVER_PORT),
            "servers": {
                "agent": {
                    "entrypoint": f"{APPS}:DemoAgentServer",
                    "server_type": "responses_api_agents",
                    "host": "0.0.0.0",
                    "port": 24001,
                },
                "model": {
                    "entrypoint": f"{APPS}:DemoModelServer",
                    "server_type": "responses_api_models",
                    "port": 24002,
                    "model_name": "demo-model",
                },
                "resources": {
                    "entrypoint": f"{APPS}:DemoResourcesServer",
                    "server_type": "resources_servers",
                    "port": 24003,
                },
            },
        }
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver(RECEIVER_PORT) as running:
        yield running


@pytest.fixture(scope="module")
def deployment(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    with launch(_config(), log_dir=tmp_path_factory.mktemp("logs"), env=LAUNCH_ENV) as running:
        yield running


@pytest.fixture
async def client(deployment: Launch) -> AsyncIterator[ServerClient]:
    yield ServerClient.load_from_global_config(HeadServerConfig(port=HEAD_PORT))
    await close_global_aiohttp_client()


def _one(spans: list[ReceivedSpan], service: str, kind: int) -> ReceivedSpan:
    found = [s for s in spans if s.service_name == f"gym/{service}" and s.kind == kind]
    assert len(found) == 1, [(s.service_name, s.name, s.kind) for s in spans]
    return found[0]


async def test_one_request_is_one_trace_across_three_processes(
    client: ServerClient, receiver: OtlpReceiver, telemetry: Capture
) -> None:
    with rollout_context("rollout-7"):
        response = await client.post("agent", "/run", json={"input": "hi", "key": "trace"}, _route="/run")
        body = await response.json()
    assert response.status == 200, body
    assert body["rollout_id"] == "rollout-7"
    assert body["model"]["rollout_id"] == "rollout-7"  # forwarded by the agent's ServerClient as a header
    (caller,) = [s for s in telemetry.spans() if s.kind.name == "CLIENT"]
    trace_id = format(caller.context.trace_id, "032x")
    caller_id = format(caller.context.span_id, "016x")

    def complete(spans: list[ReceivedSpan]) -> bool:
        return len([s for s in spans if s.trace_id == trace_id]) >= 5

    await receiver.await_for(complete)
    spans = receiver.trace(trace_id)
    agent_server = _one(spans, "agent", SPAN_KIND_SERVER)
    model_server = _one(spans, "model", SPAN_KIND_SERVER)
    resources_server = _one(spans, "resources", SPAN_KIND_SERVER)
    agent_clients = {s.attributes[names.ATTR_SERVER_NAME]: s for s in spans if s.kind == SPAN_KIND_CLIENT}
    assert sorted(agent_clients) == ["model", "resources"]
    assert len(spans) == 5  # no receive/send sub-spans, no second SERVER span from FastAPI itself
    assert agent_server.parent_span_id == caller_id
    assert agent_clients["model"].parent_span_id == agent_server.span_id
    assert agent_clients["resources"].parent_span_id == agent_server.span_id
    assert model_server.parent_span_id == agent_clients["model"].span_id
    assert resources_server.parent_span_id == agent_clients["resources"].span_id
    assert agent_server.name == "POST /run"
    assert caller.name == "POST /run"  # {METHOD} {route template}, never the raw path
    assert agent_clients["model"].name == "POST /v1/responses"
    assert agent_clients["resources"].name == "POST /verify"
    for span in (agent_server, model_server, resources_server, *agent_clients.values()):
        assert span.attributes[names.ATTR_ROLLOUT_ID] == "rollout-7"
    assert agent_server.resource[names.ATTR_SERVER_TYPE] == "responses_api_agents"
    assert caller.attributes[names.ATTR_ROLLOUT_ID] == "rollout-7"


async def test_trace_segment_from_a_plain_client_joins_the_trace(
    deployment: Launch, receiver: OtlpReceiver
) -> None:
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    url = f"http://127.0.0.1:24003/ng-trace/00-{trace_id}-{parent_id}-01/ng-rollout/plain-1/verify"
    async with aiohttp.ClientSession() as session, session.post(url, json={}) as response:
        assert response.status == 200
        assert (await response.json())["rollout_id"] == "plain-1"
    spans = await receiver.await_for(lambda spans: any(s.trace_id == trace_id for s in spans))
    (server,) = [s for s in spans if s.trace_id == trace_id]
    assert server.kind == SPAN_KIND_SERVER
    assert server.parent_span_id == parent_id
    assert server.name == "POST /verify"  # routed on the stripped path
    assert server.attributes[names.ATTR_ROLLOUT_ID] == "plain-1"


async def test_resources_exception_reaches_the_caller_with_its_root_cause(
    client: ServerClient, receiver: OtlpReceiver, telemetry: Capture
) -> None:
    response = await client.post("agent", "/run", json={"input": "x", "key": "boom", "explode": True})
    raw = await response.read()
    assert response.status == 500
    assert b"Traceback" not in raw and SECRET.encode() not in raw
    with pytest.raises(NgFailureEvent) as caught:
        await raise_boundary_failure(response, raw)
    event = caught.value
    assert (event.boundary, event.failure_kind) == ("resources_server", "internal_error")
    assert event.server_name == "resources"
    assert event.http_error is not None and event.http_error.status == 500  # this hop: test -> agent
    root = event.__cause__
    assert isinstance(root, ForeignFailure)
    assert root.exception_type == "ValueError"
    assert "verifier database unreachable" in root.message and SECRET not in root.message
    # The id is the one the resources server created and recorded on its own SERVER span.
    (caller,) = [s for s in telemetry.spans() if s.kind.name == "CLIENT"]
    trace_id = format(caller.context.trace_id, "032x")

    def resources_failed(spans: list[ReceivedSpan]) -> bool:
        return any(s.trace_id == trace_id and s.service_name == "gym/resources" for s in spans)

    spans = await receiver.await_for(resources_failed)
    server = _one([s for s in spans if s.trace_id == trace_id], "resources", SPAN_KIND_SERVER)
    recorded = [
        attrs[names.ATTR_FAILURE_EVENT_ID]
        for _, attrs in server.events
        if names.ATTR_FAILURE_EVENT_ID in attrs
    ]
    assert recorded == [event.event_id]
    assert event.trace_id == trace_id and event.span_id == server.span_id


async def test_model_failure_recovered_by_a_retry_is_reported_on_success(client: ServerClient) -> None:
    response = await client.post("agent", "/run", json={"input": "x", "key": "flaky", "model_fail_times": 1})
    body = await response.json()
    assert response.status == 200
    assert body["model"]["attempt"] == 2
    report = decode_failure_report(response.headers[names.FAILURE_REPORT_HEADER])
    assert report.failure_id is None  # nothing failed in the end
    (record,) = report.events.values()
    assert (record["boundary"], record["failure_kind"], record["http_status"]) == (
        "model",
        "provider_unavailable",
        503,
    )
    assert record["server_name"] == "model"


async def test_client_disconnect_cancels_the_handler(client: ServerClient) -> None:
    payload = orjson.dumps({"key": "gone"})
    reader, writer = await asyncio.open_connection("127.0.0.1", 24003)
    writer.write(
        b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()

    async def status() -> str | None:
        response = await client.get("resources", "/slow_status/gone")
        return (await response.json())["status"]

    for _ in range(100):
        if await status() == "started":
            break
        await asyncio.sleep(0.02)
    writer.close()
    await writer.wait_closed()
    for _ in range(100):
        if await status() == "cancelled":
            break
        await asyncio.sleep(0.02)
    assert await status() == "cancelled"
    assert await reader.read() == b""  # nothing was sent for the abandoned request


async def test_head_server_serves_config_instances_and_readiness(
    deployment: Launch, client: ServerClient
) -> None:
    assert client.global_config == deployment.config
    assert client.base_url("agent") == "http://127.0.0.1:24001"  # 0.0.0.0 bind made connectable
    assert client.server_config("model").own_config() == {"model_name": "demo-model"}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{deployment.head_url}/server_instances") as response:
            instances = {item["name"]: item for item in await response.json()}
        async with session.get(f"{deployment.head_url}/readyz") as response:
            assert response.status == 200
        async with session.get(f"{deployment.head_url}/global_config.yaml") as response:
            assert "model_name: demo-model" in await response.text()
    assert {name: item["status"] for name, item in instances.items()} == dict.fromkeys(
        ["agent", "model", "resources"], "ready"
    )
    assert instances["model"]["pid"] == deployment.servers["model"].pid
    assert await client.poll_for_status("model") == "success"


async def test_poll_for_status_reports_a_server_that_is_not_there() -> None:
    config = parse_global_config(
        {"servers": {"ghost": {"entrypoint": "a.b:C", "server_type": "resources_servers", "port": 24099}}}
    )
    try:
        assert await ServerClient(config).poll_for_status("ghost", timeout_seconds=2) == "connection_error"
    finally:
        await close_global_aiohttp_client()


def test_loading_the_config_without_a_head_server_says_where_it_looked() -> None:
    with pytest.raises(HeadServerUnavailableError, match=r"http://127\.0\.0\.1:24098/global_config"):
        ServerClient.load_from_global_config(HeadServerConfig(port=24098))


def test_log_lines_carry_server_name_trace_id_and_rollout_id(
    deployment: Launch, client: ServerClient
) -> None:
    del client  # the earlier tests made requests; their lines are in the logs
    lines = [
        json.loads(line)
        for line in Path(deployment.servers["agent"].log_path).read_text().splitlines()
        if line.startswith("{")
    ]
    running = [line for line in lines if line.get("event") == "running"]
    assert running, lines[-5:]
    assert all(line["server_name"] == "agent" and len(line["trace_id"]) == 32 for line in running)
    assert any(line.get("rollout_id") == "rollout-7" for line in running)


def test_keepalive_is_on_for_server_connections(deployment: Launch) -> None:
    with socket.create_connection(("127.0.0.1", 24002)) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200" in sock.recv(4096)
        local = sock.getsockname()
        # The server's side of this connection, as the kernel reports it (timer:(keepalive,...)). The
        # timer column can briefly show another timer (e.g. a delayed ACK) under load: poll for a second.
        local_hex = f"{socket.inet_aton(local[0])[::-1].hex().upper()}:{local[1]:04X}"
        timers: list[str] = []
        for _ in range(50):
            proc_net = Path("/proc/net/tcp").read_text().splitlines()[1:]
            timers = [row.split()[5] for row in proc_net if row.split()[2] == local_hex]
            if any(timer.startswith("02:") for timer in timers):
                break
            time.sleep(0.02)
        assert timers, "server socket not found in /proc/net/tcp"
        assert any(timer.startswith("02:") for timer in timers), timers  # timer 2 = keepalive armed
