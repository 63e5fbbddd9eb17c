"""Issue 16.1: a span group switched off creates no span of its kind, while its metrics keep flowing.

Real SDK providers (the in-memory capture), a real loopback server for the CLIENT side, and the built gym
app for the SERVER side. Ports 29980-29989.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.trace import SpanKind

from gym_obs.client import request
from gym_obs.server import rollout_scope
from gym_obs.telemetry import names
from gym_obs.telemetry.groups import parse_span_groups
from gym_obs.telemetry.testing import Capture, telemetry_state
from tests.integration.client_support import RawServer
from tests.unit.test_server_app import DemoServer, _config

pytestmark = pytest.mark.integration

PORT = 29980


@pytest.fixture
def groups() -> Iterator[object]:
    state = telemetry_state()
    saved = state.groups
    try:
        yield state
    finally:
        state.groups = saved


def _kinds(capture: Capture) -> list[SpanKind]:
    return [span.kind for span in capture.spans()]


async def test_http_client_off_no_client_span_but_the_duration_metric(
    telemetry: Capture, groups: object
) -> None:
    server = await RawServer(PORT).start()
    try:
        telemetry_state().groups = parse_span_groups("server,rollout")
        async with await request("GET", f"{server.url}/x") as reply:
            assert reply.status == 200
        assert SpanKind.CLIENT not in _kinds(telemetry)
        assert telemetry.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)

        telemetry_state().groups = parse_span_groups("default")  # the control: the span is there when on
        async with await request("GET", f"{server.url}/y") as reply:
            assert reply.status == 200
        assert _kinds(telemetry).count(SpanKind.CLIENT) == 1
    finally:
        await server.stop()


async def test_server_off_no_server_span_but_the_duration_metric(telemetry: Capture, groups: object) -> None:
    app = DemoServer("demo", _config()).build_app()
    telemetry_state().groups = parse_span_groups("http_client")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/items/1")).status_code == 200
    assert SpanKind.SERVER not in _kinds(telemetry)
    (point,) = telemetry.metric_points(names.METRIC_HTTP_SERVER_REQUEST_DURATION)
    assert point.attributes[names.ATTR_HTTP_ROUTE] == "/items/{item_id}"

    telemetry_state().groups = parse_span_groups("all")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/items/2")).status_code == 200
    assert _kinds(telemetry).count(SpanKind.SERVER) == 1


async def test_rollout_off_no_rollout_span_but_the_rollout_count(telemetry: Capture, groups: object) -> None:
    telemetry_state().groups = parse_span_groups("server,http_client")
    with rollout_scope("r-1"):
        pass
    assert not telemetry.spans(names.SPAN_ROLLOUT)
    assert telemetry.metric_points(names.METRIC_ROLLOUTS)


async def test_per_rollout_makes_each_rollout_a_root_linked_to_its_caller(
    telemetry: Capture, groups: object
) -> None:
    telemetry_state().groups = parse_span_groups("per_rollout")
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("caller") as caller, rollout_scope("r-2"):
        pass
    (rollout,) = telemetry.spans(names.SPAN_ROLLOUT)
    assert rollout.parent is None
    assert rollout.context.trace_id != caller.get_span_context().trace_id
    assert [link.context.span_id for link in rollout.links] == [caller.get_span_context().span_id]
