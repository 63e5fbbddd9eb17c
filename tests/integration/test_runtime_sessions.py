"""Sessions on real servers: a session survives many requests, and under two uvicorn workers with owner
routing every request of a session lands on the same worker (the reply says which pid served it), even
when the kernel hands the connection to the other one. A server that cannot share state is refused.

Ports: head 26100, sessions server 26101, stateless server 26102, OTLP receiver 26190.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.server._session_routing import owner_slot
from gym_obs.server.launcher import Launch, LaunchError, launch
from gym_obs.telemetry import names
from tests.integration.otlp_receiver import LAUNCH_ENV, SPAN_KIND_SERVER, OtlpReceiver, otlp_traces_telemetry

pytestmark = pytest.mark.integration

HEAD_PORT = 26100
PORT = 26101
RECEIVER_PORT = 26190
URL = f"http://127.0.0.1:{PORT}/step"
APPS = "tests.integration.runtime_apps"


def _config(entrypoint: str = "SessionCounterServer", port: int = PORT) -> GlobalConfig:
    return parse_global_config(
        {
            "head_server": {"port": HEAD_PORT},
            "telemetry": otlp_traces_telemetry(RECEIVER_PORT),
            "servers": {
                "resources": {
                    "entrypoint": f"{APPS}:{entrypoint}",
                    "server_type": "resources_servers",
                    "port": port,
                    "num_workers": 2,
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
async def fresh_connections(deployment: Launch) -> AsyncIterator[aiohttp.ClientSession]:
    # A new connection per request: the kernel picks the accepting worker again every time.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


async def _step(
    session: aiohttp.ClientSession, **kwargs: Any
) -> tuple[dict[str, Any], aiohttp.ClientResponse]:
    async with session.post(URL, **kwargs) as response:
        assert response.status == 200, await response.text()
        return await response.json(), response


async def test_a_token_session_survives_many_requests_on_one_worker(
    fresh_connections: aiohttp.ClientSession,
) -> None:
    first, response = await _step(fresh_connections, json={})
    token = response.headers[names.SESSION_HEADER]
    assert names.SESSION_COOKIE in response.headers.get("Set-Cookie", "")
    replies = [
        (await _step(fresh_connections, json={}, headers={names.SESSION_HEADER: token}))[0] for _ in range(30)
    ]
    assert [reply["count"] for reply in replies] == list(range(2, 32))  # state never split
    assert {reply["session_id"] for reply in replies} == {first["session_id"]}
    assert {reply["pid"] for reply in replies} == {first["pid"]}


async def test_cookie_sessions_are_kept_apart(deployment: Launch) -> None:
    jars = [aiohttp.CookieJar(unsafe=True) for _ in range(3)]  # unsafe: cookies from an IP host
    seen: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for _ in range(5):
        for index, jar in enumerate(jars):
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector, cookie_jar=jar) as session:
                seen[index].append((await _step(session, json={}))[0])
    for replies in seen.values():
        assert [reply["count"] for reply in replies] == [1, 2, 3, 4, 5]
        assert len({reply["session_id"] for reply in replies}) == 1
        assert len({reply["pid"] for reply in replies}) == 1
    assert len({replies[0]["session_id"] for replies in seen.values()}) == 3


async def test_caller_named_sessions_are_routed_to_their_owner(
    fresh_connections: aiohttp.ClientSession, receiver: OtlpReceiver
) -> None:
    # Episode ids owned by each of the two slots: whichever worker accepts, one of them is not the owner.
    episodes = [f"episode-{i}" for i in range(40)]
    by_slot = {slot: [e for e in episodes if owner_slot(e, 2) == slot][:3] for slot in (0, 1)}
    chosen = [*by_slot[0], *by_slot[1]]
    replies: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for _ in range(6):
        for episode in chosen:
            replies[episode].append((await _step(fresh_connections, json={"episode_id": episode}))[0])
    for episode, got in replies.items():
        assert [reply["count"] for reply in got] == list(range(1, 7)), episode
        assert {reply["session_id"] for reply in got} == {episode}
        assert len({reply["pid"] for reply in got}) == 1, episode
    owners = {slot: {replies[e][0]["pid"] for e in by_slot[slot]} for slot in (0, 1)}
    assert len(owners[0]) == len(owners[1]) == 1 and owners[0] != owners[1]  # two workers, one per slot
    assert any(reply["forwarded"] for got in replies.values() for reply in got)

    # A forwarded request is still one SERVER span (in the owner), joined to the caller's trace.
    trace_id, parent_id = "5bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {names.TRACEPARENT_HEADER: f"00-{trace_id}-{parent_id}-01"}
    forwarded = False
    for episode in chosen:  # until one was forwarded (the accepting worker does not own it)
        reply, _ = await _step(fresh_connections, json={"episode_id": episode}, headers=headers)
        if reply["forwarded"]:
            forwarded = True
            break
        trace_id = f"{int(trace_id, 16) + 1:032x}"
        headers = {names.TRACEPARENT_HEADER: f"00-{trace_id}-{parent_id}-01"}
    assert forwarded
    await receiver.await_for(lambda spans: any(s.trace_id == trace_id for s in spans))
    await asyncio.sleep(0.5)  # time for a second SERVER span to arrive, if there were one
    (server,) = receiver.trace(trace_id)
    assert server.kind == SPAN_KIND_SERVER and server.parent_span_id == parent_id
    assert server.attributes[names.ATTR_SESSION_ID] == episode
    assert server.name == "POST /step"


async def test_a_dead_worker_is_replaced_and_its_slot_owned_again(
    fresh_connections: aiohttp.ClientSession,
) -> None:
    episodes = [f"crash-{i}" for i in range(40)]
    victim_episode = next(e for e in episodes if owner_slot(e, 2) == 0)
    survivor_episode = next(e for e in episodes if owner_slot(e, 2) == 1)
    victim, _ = await _step(fresh_connections, json={"episode_id": victim_episode})
    survivor, _ = await _step(fresh_connections, json={"episode_id": survivor_episode})
    assert victim["pid"] != survivor["pid"]
    os.kill(victim["pid"], signal.SIGKILL)
    # uvicorn starts a new worker; it claims the freed slot. Meanwhile requests for the slot's sessions wait
    # for it (bounded) instead of being served, with half the state, by the surviving worker.
    reply, _ = await _step(fresh_connections, json={"episode_id": victim_episode})
    assert reply["pid"] not in (victim["pid"], survivor["pid"])
    assert reply["count"] == 1  # the state died with its worker; the new owner starts it afresh
    again, _ = await _step(fresh_connections, json={"episode_id": victim_episode})
    assert (again["pid"], again["count"]) == (reply["pid"], 2)
    still, _ = await _step(fresh_connections, json={"episode_id": survivor_episode})
    assert (still["pid"], still["count"]) == (survivor["pid"], 2)


def test_a_server_that_cannot_share_state_is_refused_more_workers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = _config("StatelessCounterServer", port=26102)
    config.head_server.port = HEAD_PORT + 50
    with pytest.raises(LaunchError) as caught, launch(config, log_dir=tmp_path_factory.mktemp("refused")):
        pass
    message = str(caught.value)
    assert "servers.resources.num_workers=2" in message
    assert "step counters live in this process's memory" in message
