"""The in-flight table and its control route: bounded, oldest first, per-task hops, loopback only."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gym_obs.server.inflight_route import InflightRoute
from gym_obs.telemetry import inflight, names
from gym_obs.telemetry.propagation import rollout_context


@pytest.fixture(autouse=True)
def _tracking() -> Iterator[None]:
    inflight.enable(servers={("127.0.0.1", 9001): "model_0"}, capacity=inflight.DEFAULT_CAPACITY)
    yield
    inflight.enable(False, servers={}, capacity=inflight.DEFAULT_CAPACITY)


def test_off_means_nothing_is_tracked() -> None:
    inflight.enable(False)
    with rollout_context("r1"), inflight.rollout("r1"):
        inflight.hop_attempt("http://127.0.0.1:9001/x", 1)
        assert inflight.snapshot()["in_flight"] == 0
    assert inflight.snapshot()["tracking"] is False


def test_rollouts_are_listed_oldest_first_and_leave_when_done() -> None:
    with inflight.rollout("a"), inflight.rollout("b"):
        with inflight.rollout("a"):  # a re-sent request of the same rollout overlaps the first
            pass
        view = inflight.snapshot()
        assert [row["rollout_id"] for row in view["oldest"]] == ["a", "b"]
        assert view["by_stage"] == {"agent": 2}
    assert inflight.snapshot()["in_flight"] == 0
    with inflight.rollout(None):  # no rollout id: nothing to track
        assert inflight.snapshot()["in_flight"] == 0


def test_a_full_table_keeps_the_oldest_and_counts_the_rest() -> None:
    inflight.enable(capacity=3)
    held = [inflight.rollout(f"r{i}") for i in range(5)]
    for cm in held:
        cm.__enter__()
    view = inflight.snapshot()
    assert view["in_flight"] == 3 and view["evicted"] == 2
    assert [row["rollout_id"] for row in view["oldest"]] == ["r0", "r1", "r2"]
    for cm in reversed(held):
        cm.__exit__(None, None, None)
    assert inflight.snapshot()["in_flight"] == 0


def test_hops_per_task_attempts_stage_and_names() -> None:
    async def hop(url: str, attempts: int, release: asyncio.Event) -> None:
        for attempt in range(1, attempts + 1):
            inflight.hop_attempt(url, attempt)
        await release.wait()
        inflight.hop_done()

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        release = asyncio.Event()
        with rollout_context("r1"), inflight.rollout("r1"):
            inflight.set_stage("verification")
            tasks = [
                asyncio.create_task(hop("http://127.0.0.1:9001/v1/responses", 1, release)),
                asyncio.create_task(hop("http://127.0.0.1:9001/v1/responses", 3, release)),
                asyncio.create_task(hop("https://api.example.invalid/v1?key=s", 1, release)),
            ]
            await asyncio.sleep(0.01)
            during = inflight.snapshot(stall_after_s=3600)
            release.set()
            await asyncio.gather(*tasks)
            after = inflight.snapshot(stall_after_s=3600)
        return during, after

    during, after = asyncio.run(main())
    row = during["oldest"][0]
    assert row["stage"] == "verification" and row["hops_in_flight"] == 3
    assert sorted((h["server"], h["attempt"]) for h in row["hops"]) == [
        ("external", 1), ("model_0", 1), ("model_0", 3)
    ]
    assert row["retries"] == 2 and row["retrying"] is True and row["stalled"] is False
    assert during["hops_by_server"] == {"model_0": 2, "external": 1}
    assert during["retrying_count"] == 1 and [r["rollout_id"] for r in during["retrying"]] == ["r1"]
    assert "key=s" not in json.dumps(during)  # only host and port are ever read from a hop's URL
    assert after["oldest"][0]["hops_in_flight"] == 0 and after["retrying_count"] == 0


def test_stalled_after_no_progress_and_lists_are_capped() -> None:
    held = [inflight.rollout(f"r{i}") for i in range(inflight.MAX_LIMIT + 50)]
    for cm in held:
        cm.__enter__()
    view = inflight.snapshot(limit=10**6, stall_after_s=1e-9)
    assert view["limit"] == inflight.MAX_LIMIT
    assert len(view["oldest"]) == len(view["stalled"]) == inflight.MAX_LIMIT
    assert view["stalled_count"] == inflight.MAX_LIMIT + 50
    assert inflight.snapshot(stall_after_s=3600)["stalled_count"] == 0
    for cm in held:
        cm.__exit__(None, None, None)


async def _call(
    route: InflightRoute, client: tuple[str, int] | None, query: bytes = b"", method: str = "GET"
) -> tuple[int, dict[str, Any]]:
    scope = {"type": "http", "method": method, "path": names.INFLIGHT_ROUTE, "query_string": query,
             "headers": [], "client": client}  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await route(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_route_answers_loopback_and_allowed_networks_only() -> None:
    async def inner(_scope: Any, _receive: Any, _send: Any) -> None:
        raise AssertionError("the route never reaches the app")

    route = InflightRoute(inner, server_name="agent_0", allow=["10.1.0.0/16"])

    async def main() -> None:
        with inflight.rollout("r1"):
            status, body = await _call(route, ("127.0.0.1", 5000), b"limit=5&stall_after=2")
            assert status == 200 and body["server"] == "agent_0" and body["in_flight"] == 1
            assert body["limit"] == 5 and body["stall_after_s"] == 2
            assert (await _call(route, ("::1", 5000)))[0] == 200
            assert (await _call(route, ("10.1.2.3", 5000)))[0] == 200
            assert (await _call(route, ("10.2.0.1", 5000)))[0] == 403
            assert (await _call(route, None))[0] == 403
            assert (await _call(route, ("127.0.0.1", 1), method="POST"))[0] == 405
            assert (await _call(route, ("127.0.0.1", 1), b"limit=-1"))[0] == 422
            assert (await _call(route, ("127.0.0.1", 1), b"stall_after=nan"))[0] == 422
            assert (await _call(route, ("127.0.0.1", 1), b"limit=99999"))[1]["limit"] == inflight.MAX_LIMIT

    asyncio.run(main())


def test_control_allow_ips_must_be_addresses_or_networks() -> None:
    from gym_obs.config import ConfigError, parse_global_config

    def server(allow: object) -> dict[str, object]:
        entry = {"entrypoint": "a.b:C", "server_type": "responses_api_agents", "port": 16799}
        return {"servers": {"agent": {**entry, "control_allow_ips": allow}}}

    config = parse_global_config(server(["10.0.0.0/8", "192.168.1.7", "::1"]))
    assert config.servers["agent"].control_allow_ips == ["10.0.0.0/8", "192.168.1.7", "::1"]
    with pytest.raises(ConfigError, match=r"'example\.com' is not an IP address or CIDR network"):
        parse_global_config(server(["example.com"]))


def test_top_help_states_every_default() -> None:
    from gym_obs.cli import build_parser

    parser = build_parser()
    top = next(
        action.choices["top"] for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    )
    for action in top._actions:
        if action.option_strings and action.dest != "help":
            assert "default" in (action.help or ""), action.option_strings
