"""Pool-wait telemetry and the pools themselves, against real loopback servers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gym_obs.client import sync_pool_connections
from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    get_global_aiohttp_client,
    get_global_aiohttp_control_client,
    request,
    set_global_aiohttp_client,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture, MetricPoint
from tests.integration.client_support import REPLY, Action, ServerFactory

pytestmark = pytest.mark.integration





@pytest.fixture
async def pool_of_one() -> AsyncIterator[GlobalAIOHTTPAsyncClientConfig]:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=1,
        global_aiohttp_connector_limit_per_host=1,
        global_aiohttp_control_connector_limit=1,
        global_aiohttp_control_connector_limit_per_host=1,
        global_aiohttp_retry_backoff_base_seconds=0.01,
        global_aiohttp_retry_backoff_cap_seconds=0.02,
    )
    set_global_aiohttp_client(cfg, workers=1)
    yield cfg
    await close_global_aiohttp_client()


def _points(capture: Capture, metric: str, **attrs: object) -> list[MetricPoint]:
    return [
        p for p in capture.metric_points(metric) if all(p.attributes.get(k) == v for k, v in attrs.items())
    ]


def _sum(capture: Capture, metric: str, **attrs: object) -> float:
    return sum((p.value or 0) for p in _points(capture, metric, **attrs))


async def test_pool_of_one_under_20_concurrent_requests(
    pool_of_one: GlobalAIOHTTPAsyncClientConfig, raw_server: ServerFactory, telemetry: Capture
) -> None:
    server = await raw_server(lambda _i: Action("reply", delay_s=0.01))

    async def one(i: int) -> int:
        response = await request("GET", f"{server.url}/item/{i}", _server_name="model")
        await response.read()
        return response.status

    assert await asyncio.gather(*(one(i) for i in range(20))) == [200] * 20
    assert len(server.requests) == 20
    assert server.max_in_flight == 1 and server.connections == 1

    waits = _points(telemetry, names.METRIC_POOL_WAIT_DURATION, **{
        names.ATTR_SERVER_NAME: "model", names.ATTR_POOL: "data", names.ATTR_POOL_OUTCOME: "ok"})
    assert sum(p.count for p in waits) >= 18  # all but the first (and maybe a lucky second) queued
    assert max(p.max or 0 for p in waits) >= 0.1  # the last one waited for ~19 others of 10 ms
    assert not _points(telemetry, names.METRIC_POOL_WAIT_DURATION, **{names.ATTR_POOL_OUTCOME: "abandoned"})
    pending = _points(telemetry, names.METRIC_POOL_PENDING_REQUESTS)
    assert pending and all(p.attributes[names.ATTR_SERVER_NAME] == "model" for p in pending)
    assert _sum(telemetry, names.METRIC_POOL_PENDING_REQUESTS) == 0

    sync_pool_connections()
    assert _sum(telemetry, names.METRIC_POOL_CONNECTIONS, **{
        names.ATTR_POOL: "data", names.ATTR_HTTP_CONNECTION_STATE: "idle"}) == 1
    assert _sum(telemetry, names.METRIC_POOL_CONNECTIONS, **{
        names.ATTR_POOL: "data", names.ATTR_HTTP_CONNECTION_STATE: "active"}) == 0

    await close_global_aiohttp_client()  # closing reports the connections gone
    assert _sum(telemetry, names.METRIC_POOL_CONNECTIONS) == 0


async def test_a_wait_ended_by_timeout_or_cancellation_is_abandoned_and_pending_returns_to_zero(
    pool_of_one: GlobalAIOHTTPAsyncClientConfig, raw_server: ServerFactory, telemetry: Capture
) -> None:
    server = await raw_server(lambda _i: Action("hang"))
    holder = asyncio.create_task(request("GET", f"{server.url}/hold"))
    await asyncio.wait_for(server.wait_for_requests(1), 5)

    # Timed out in the queue: aiohttp's connect timeout covers the wait for a pooled connection.
    with pytest.raises(aiohttp.ConnectionTimeoutError):
        await request("GET", f"{server.url}/queued", timeout=aiohttp.ClientTimeout(connect=0.1),
                      _max_num_tries=1)
    # Cancelled in the queue, twice over: the sum of waits is recorded once per request.
    queued = asyncio.create_task(request("GET", f"{server.url}/queued"))
    await asyncio.sleep(0.1)
    assert _sum(telemetry, names.METRIC_POOL_PENDING_REQUESTS) == 1
    queued.cancel()
    holder.cancel()
    for task in (queued, holder):
        with pytest.raises(asyncio.CancelledError):
            await task

    abandoned = _points(telemetry, names.METRIC_POOL_WAIT_DURATION, **{names.ATTR_POOL_OUTCOME: "abandoned"})
    assert sum(p.count for p in abandoned) == 2
    assert min(p.min or 0 for p in abandoned) >= 0.09
    assert _sum(telemetry, names.METRIC_POOL_PENDING_REQUESTS) == 0
    assert len(server.requests) == 1


async def test_control_pool_is_separate_from_a_saturated_data_pool(
    pool_of_one: GlobalAIOHTTPAsyncClientConfig, raw_server: ServerFactory, telemetry: Capture
) -> None:
    server = await raw_server(lambda i: Action("hang") if i == 0 else REPLY)
    holder = asyncio.create_task(request("GET", f"{server.url}/generate"))
    await asyncio.wait_for(server.wait_for_requests(1), 5)
    response = await asyncio.wait_for(request("GET", f"{server.url}/health", _control=True), 2)
    assert response.status == 200
    response.release()
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert get_global_aiohttp_client().connector is not get_global_aiohttp_control_client().connector
    assert not _points(telemetry, names.METRIC_POOL_WAIT_DURATION, **{names.ATTR_POOL: "control"})


async def test_pooled_connections_use_tcp_keepalive(
    pool_of_one: GlobalAIOHTTPAsyncClientConfig, raw_server: ServerFactory
) -> None:
    server = await raw_server(lambda _i: Action("reply", body=b"x" * 4_000_000))
    response = await request("GET", f"{server.url}/")
    connection = response.connection
    assert connection is not None and connection.transport is not None
    sock = connection.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
    if hasattr(socket, "TCP_KEEPIDLE"):
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 60
    await response.read()


async def test_direct_session_users_get_pool_waits_labelled_external(
    pool_of_one: GlobalAIOHTTPAsyncClientConfig, raw_server: ServerFactory, telemetry: Capture
) -> None:
    server = await raw_server(lambda _i: Action("reply", delay_s=0.02))
    session = get_global_aiohttp_client()

    async def one() -> None:
        async with session.get(f"{server.url}/direct") as response:
            await response.read()

    await asyncio.gather(one(), one(), one())
    waits = _points(telemetry, names.METRIC_POOL_WAIT_DURATION, **{names.ATTR_SERVER_NAME: "external"})
    assert sum(p.count for p in waits) >= 1
    assert _sum(telemetry, names.METRIC_POOL_PENDING_REQUESTS) == 0


async def test_a_queued_control_request_is_labelled_control(
    pool_of_one: GlobalAIOHTTPAsyncClientConfig, raw_server: ServerFactory, telemetry: Capture
) -> None:
    server = await raw_server(lambda _i: Action("reply", delay_s=0.05))

    async def one() -> None:
        response = await request("GET", f"{server.url}/health", _control=True, _server_name="head")
        await response.read()

    await asyncio.gather(one(), one(), one())
    assert server.max_in_flight == 1
    waits = _points(telemetry, names.METRIC_POOL_WAIT_DURATION, **{names.ATTR_POOL: "control"})
    assert sum(p.count for p in waits) >= 1
    assert all(p.attributes[names.ATTR_SERVER_NAME] == "head" for p in waits)
    assert not _points(telemetry, names.METRIC_POOL_WAIT_DURATION, **{names.ATTR_POOL: "data"})
    assert _sum(telemetry, names.METRIC_POOL_PENDING_REQUESTS, **{names.ATTR_POOL: "control"}) == 0


# Every metric's attribute keys, exactly (DESIGN.md: small fixed value sets; no ids or URLs on metrics).
_METRIC_KEYS = {
    names.METRIC_HTTP_CLIENT_REQUEST_DURATION: {
        frozenset({names.ATTR_HTTP_REQUEST_METHOD, names.ATTR_SERVER_ADDRESS, names.ATTR_SERVER_PORT,
                   names.ATTR_SERVER_NAME, names.ATTR_HTTP_RESPONSE_STATUS_CODE}),
        frozenset({names.ATTR_HTTP_REQUEST_METHOD, names.ATTR_SERVER_ADDRESS, names.ATTR_SERVER_PORT,
                   names.ATTR_SERVER_NAME, names.ATTR_HTTP_RESPONSE_STATUS_CODE, names.ATTR_ERROR_TYPE}),
        frozenset({names.ATTR_HTTP_REQUEST_METHOD, names.ATTR_SERVER_ADDRESS, names.ATTR_SERVER_PORT,
                   names.ATTR_SERVER_NAME, names.ATTR_ERROR_TYPE}),
    },
    names.METRIC_CLIENT_RETRIES: {frozenset({names.ATTR_SERVER_NAME, names.ATTR_RETRY_REASON})},
    names.METRIC_POOL_WAIT_DURATION: {
        frozenset({names.ATTR_SERVER_NAME, names.ATTR_POOL, names.ATTR_POOL_OUTCOME,
                   names.ATTR_POOL_CONSTRAINT})},
    names.METRIC_POOL_PENDING_REQUESTS: {frozenset({names.ATTR_SERVER_NAME, names.ATTR_POOL})},
    names.METRIC_POOL_CONNECTIONS: {frozenset({names.ATTR_POOL, names.ATTR_HTTP_CONNECTION_STATE})},
    names.METRIC_POOL_CONNECTS: {frozenset({names.ATTR_SERVER_NAME, names.ATTR_POOL})},
}


async def test_metric_attribute_sets_are_exactly_the_designed_ones(
    pool_of_one: GlobalAIOHTTPAsyncClientConfig, raw_server: ServerFactory, telemetry: Capture
) -> None:
    from gym_obs.telemetry.propagation import rollout_context

    server = await raw_server(lambda i: Action("drop") if i == 0 else (
        Action("reply", status=500) if i == 5 else Action("reply", delay_s=0.01)))

    async def one(i: int) -> None:
        with rollout_context(f"rollout-{i}"):
            response = await request("POST", f"http://u:p@127.0.0.1:{server.port}/v1/x/{i}?k=v",
                                     json={"i": i}, _server_name="model", _route="/v1/x/{i}")
            await response.read()

    await asyncio.gather(*(one(i) for i in range(6)))
    sync_pool_connections()
    for metric, allowed in _METRIC_KEYS.items():
        points = telemetry.metric_points(metric)
        assert points, metric
        for point in points:
            assert frozenset(point.attributes) in allowed, (metric, dict(point.attributes))
            for key, value in point.attributes.items():
                if key == names.ATTR_SERVER_NAME:
                    assert value == "model"
                text = str(value)
                assert "rollout" not in text and "/" not in text and "k=v" not in text, (metric, key, value)
    assert {p.attributes[names.ATTR_RETRY_REASON]
            for p in telemetry.metric_points(names.METRIC_CLIENT_RETRIES)} <= set(names.RETRY_REASONS)
