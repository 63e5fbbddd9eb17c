"""Issue 11: a limited pool serves queued requests in arrival order, retries included.

A real loopback HTTP/1.1 server (keep-alive, each reply held briefly) records the order in which requests
reach it. Rollouts each send three requests one after another through a pool of two connections per host:
the task that just got a reply must not re-take its connection ahead of the rollouts already queued (the
aiohttp connector lets it), and a retried request keeps its place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    request,
    set_global_aiohttp_client,
)

pytestmark = pytest.mark.integration

PORT = 30540
ROLLOUTS = 8
STEPS = 3


@dataclass
class Recorder:
    order: list[str] = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)
    drop_once: set[str] = field(default_factory=set)
    max_in_flight: int = 0
    in_flight: int = 0


async def _serve(rec: Recorder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            name = path.strip("/")
            attempt = "#2" if name in rec.dropped else ""
            rec.order.append(name + attempt)
            if name in rec.drop_once and name not in rec.dropped:
                rec.dropped.add(name)
                return  # close without a reply: the client retries
            rec.in_flight += 1
            rec.max_in_flight = max(rec.max_in_flight, rec.in_flight)
            await asyncio.sleep(0.03)
            rec.in_flight -= 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()
    server = await asyncio.start_server(lambda r, w: _serve(rec, r, w), "127.0.0.1", PORT, reuse_address=True)
    set_global_aiohttp_client(
        GlobalAIOHTTPAsyncClientConfig(
            global_aiohttp_connector_limit=64,
            global_aiohttp_connector_limit_per_host=2,
            global_aiohttp_retry_backoff_base_seconds=0.001,
            global_aiohttp_retry_backoff_cap_seconds=0.002,
        ),
        workers=1,
    )
    try:
        yield rec
    finally:
        await close_global_aiohttp_client()
        server.close()
        await server.wait_closed()


async def _rollout(index: int) -> None:
    for step in "abc"[:STEPS]:
        response = await request("GET", f"http://127.0.0.1:{PORT}/r{index}{step}", _internal=True)
        await response.read()


async def _run_rollouts() -> None:
    tasks = []
    for i in range(1, ROLLOUTS + 1):
        tasks.append(asyncio.create_task(_rollout(i)))
        await asyncio.sleep(0)  # start them in order: arrival order is creation order
    await asyncio.gather(*tasks)


async def test_queued_requests_are_served_in_arrival_order(recorder: Recorder) -> None:
    await _run_rollouts()
    order = recorder.order
    assert len(order) == ROLLOUTS * STEPS and recorder.max_in_flight <= 2
    # Every rollout's first request queued before any second request existed: all are served first, then
    # all second requests, then all third ones (a rollout never re-takes its connection ahead of the queue).
    for step, later in (("a", "b"), ("b", "c")):
        last_earlier = max(i for i, name in enumerate(order) if name.endswith(step))
        first_later = min(i for i, name in enumerate(order) if name.endswith(later))
        assert last_earlier < first_later, order
    assert [name for name in order if name.endswith("a")] == [f"r{i}a" for i in range(1, ROLLOUTS + 1)]


async def test_a_retried_request_keeps_its_place_in_the_queue(recorder: Recorder) -> None:
    recorder.drop_once.add("r1a")
    await _run_rollouts()
    order = recorder.order
    assert "r1a#2" in order
    # The retry re-queued while r3a..r8a waited; its arrival number is r1a's, so it is served before the
    # rollouts that arrived after it (at most one of them, r3a, took the slot its dropped connection freed).
    assert order.index("r1a#2") < order.index("r5a"), order
    last_a = max(i for i, name in enumerate(order) if "a" in name.split("#")[0][-1])
    first_b = min(i for i, name in enumerate(order) if name.endswith("b"))
    assert last_a < first_b, order
