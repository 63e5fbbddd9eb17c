"""Issue 16 §6 against real loopback servers: pool waits attributed to the limit that blocked them,
connections opened per destination, and timeouts split by internal and external destinations."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    get_global_aiohttp_client,
    request,
    set_global_aiohttp_client,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture
from tests.integration.client_support import Action, RawServer, ServerFactory, metric_sum

pytestmark = pytest.mark.integration

_PORTS = itertools.count(17600)


def _port() -> int:
    """This module's loopback ports (17600-17799)."""
    port = next(_PORTS)
    assert port < 17800
    return port


Pools = Callable[[int, int], GlobalAIOHTTPAsyncClientConfig]


@pytest.fixture
async def pools() -> AsyncIterator[Pools]:
    """``pools(limit, limit_per_host)``: install a global client with those data and control limits."""

    def install(limit: int, per_host: int) -> GlobalAIOHTTPAsyncClientConfig:
        cfg = GlobalAIOHTTPAsyncClientConfig(
            global_aiohttp_connector_limit=limit,
            global_aiohttp_connector_limit_per_host=per_host,
            global_aiohttp_control_connector_limit=limit,
            global_aiohttp_control_connector_limit_per_host=per_host,
            global_aiohttp_retry_backoff_base_seconds=0.01,
            global_aiohttp_retry_backoff_cap_seconds=0.02,
        )
        set_global_aiohttp_client(cfg, workers=1)
        return cfg

    yield install
    await close_global_aiohttp_client()


def _waits(capture: Capture, **attrs: object) -> int:
    return int(metric_sum(capture, names.METRIC_POOL_WAIT_DURATION, **attrs))


async def _server(raw_server: ServerFactory, action: Action) -> RawServer:
    return await raw_server(lambda _i: action, port=_port())


async def test_each_wait_is_attributed_to_the_limit_that_blocked_it(
    pools: Pools, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools(3, 2)
    a = await _server(raw_server, Action("hang"))
    b = await _server(raw_server, Action("hang"))
    tasks = [asyncio.create_task(request("GET", f"{a.url}/hold/{i}", _server_name="a")) for i in range(2)]
    await asyncio.wait_for(a.wait_for_requests(2), 5)
    # Host a is at its per-host limit, the pool (3) is not: this one waits behind per_host.
    tasks.append(asyncio.create_task(request("GET", f"{a.url}/queued", _server_name="a")))
    await asyncio.sleep(0.05)
    tasks.append(asyncio.create_task(request("GET", f"{b.url}/hold", _server_name="b")))
    await asyncio.wait_for(b.wait_for_requests(1), 5)
    # Now the pool's total limit is used up, host b's is not: this one waits behind total.
    tasks.append(asyncio.create_task(request("GET", f"{b.url}/queued", _server_name="b")))
    await asyncio.sleep(0.05)
    assert metric_sum(telemetry, names.METRIC_POOL_PENDING_REQUESTS) == 2
    for task in tasks:
        task.cancel()
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task

    abandoned = {names.ATTR_POOL_OUTCOME: names.POOL_OUTCOME_ABANDONED, names.ATTR_POOL: names.POOL_DATA}
    assert _waits(telemetry, **abandoned, **{
        names.ATTR_SERVER_NAME: "a", names.ATTR_POOL_CONSTRAINT: names.POOL_CONSTRAINT_PER_HOST}) == 1
    assert _waits(telemetry, **abandoned, **{
        names.ATTR_SERVER_NAME: "b", names.ATTR_POOL_CONSTRAINT: names.POOL_CONSTRAINT_TOTAL}) == 1
    assert _waits(telemetry) == 2
    assert len(a.requests) == 2 and len(b.requests) == 1


@pytest.mark.parametrize(
    ("limit", "per_host", "constraint"),
    [(2, 8, names.POOL_CONSTRAINT_TOTAL), (8, 1, names.POOL_CONSTRAINT_PER_HOST)],
)
async def test_completed_waits_carry_the_binding_limit(
    pools: Pools, raw_server: ServerFactory, telemetry: Capture, limit: int, per_host: int, constraint: str
) -> None:
    pools(limit, per_host)
    server = await _server(raw_server, Action("reply", delay_s=0.02))

    async def one(i: int) -> None:
        response = await request("GET", f"{server.url}/item/{i}", _server_name="model")
        await response.read()

    await asyncio.gather(*(one(i) for i in range(6)))
    assert server.max_in_flight == min(limit, per_host)
    ok = {names.ATTR_POOL_OUTCOME: names.POOL_OUTCOME_OK, names.ATTR_SERVER_NAME: "model"}
    assert _waits(telemetry, **ok, **{names.ATTR_POOL_CONSTRAINT: constraint}) >= 3
    points = telemetry.metric_points(names.METRIC_POOL_WAIT_DURATION)
    assert points and {p.attributes[names.ATTR_POOL_CONSTRAINT] for p in points} == {constraint}


async def test_connections_opened_are_counted_per_destination_and_pool(
    pools: Pools, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools(8, 3)
    model = await _server(raw_server, Action("reply", delay_s=0.02))
    other = await _server(raw_server, Action("reply"))

    async def one(i: int) -> None:
        response = await request("GET", f"{model.url}/item/{i}", _server_name="model", _internal=True)
        await response.read()

    await asyncio.gather(*(one(i) for i in range(10)))
    await one(10)  # a pooled (kept-alive) connection is reused: nothing new is opened
    async with get_global_aiohttp_client().get(f"{other.url}/direct") as response:
        await response.read()
    health = await request("GET", f"{other.url}/health", _control=True, _server_name="head")
    await health.read()

    assert model.connections == 3 and other.connections == 2
    connects = names.METRIC_POOL_CONNECTS
    data, control = names.POOL_DATA, names.POOL_CONTROL
    assert metric_sum(telemetry, connects, **{names.ATTR_SERVER_NAME: "model", names.ATTR_POOL: data}) == 3
    assert metric_sum(telemetry, connects, **{names.ATTR_SERVER_NAME: "external", names.ATTR_POOL: data}) == 1
    assert metric_sum(telemetry, connects, **{names.ATTR_SERVER_NAME: "head", names.ATTR_POOL: control}) == 1
    assert metric_sum(telemetry, connects) == 5
    for point in telemetry.metric_points(connects):
        assert set(point.attributes) == {names.ATTR_SERVER_NAME, names.ATTR_POOL}


async def test_timeouts_are_counted_per_attempt_split_internal_and_external(
    pools: Pools, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools(8, 8)
    hang = await _server(raw_server, Action("hang"))
    drop = await _server(raw_server, Action("drop"))
    read_timeout = aiohttp.ClientTimeout(sock_read=0.1)

    with pytest.raises(aiohttp.ServerTimeoutError):
        await request("GET", f"{hang.url}/gym", _internal=True, _server_name="model", _max_num_tries=1,
                      timeout=read_timeout)
    with pytest.raises(Exception) as raised:
        await request("GET", f"{hang.url}/ext", _max_num_tries=2, timeout=read_timeout)
    assert isinstance(raised.value.__cause__ or raised.value, TimeoutError)
    with pytest.raises(aiohttp.ClientError):  # not a timeout: not counted
        await request("GET", f"{drop.url}/ext", _max_num_tries=1)
    assert len(hang.requests) == 3 and len(drop.requests) == 1

    timeouts = names.METRIC_CLIENT_TIMEOUTS
    internal = {names.ATTR_DESTINATION: names.DESTINATION_INTERNAL, names.ATTR_SERVER_NAME: "model"}
    external = {names.ATTR_DESTINATION: names.DESTINATION_EXTERNAL, names.ATTR_SERVER_NAME: "external"}
    assert metric_sum(telemetry, timeouts, **internal) == 1
    assert metric_sum(telemetry, timeouts, **external) == 2
    assert metric_sum(telemetry, timeouts) == 3
    for point in telemetry.metric_points(timeouts):
        assert set(point.attributes) == {names.ATTR_DESTINATION, names.ATTR_SERVER_NAME}
        assert point.attributes[names.ATTR_DESTINATION] in names.DESTINATIONS
