"""The process-wide sessions: one set per event loop, closed on their loop, configured once (no network)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import aiohttp
import pytest
import structlog

from gym_obs.client._sessions import configure, current_config
from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    configure_global_aiohttp_client,
    get_global_aiohttp_client,
    get_global_aiohttp_control_client,
    is_global_aiohttp_client_setup,
    set_global_aiohttp_client,
)
from gym_obs.telemetry.testing import telemetry_state

STATE = telemetry_state()


@pytest.fixture(autouse=True)
def _default_config() -> Iterator[None]:
    yield
    configure(GlobalAIOHTTPAsyncClientConfig())


async def test_sessions_are_created_once_per_loop_and_closed_on_it() -> None:
    assert not is_global_aiohttp_client_setup()
    data = get_global_aiohttp_client()
    assert get_global_aiohttp_client() is data
    assert is_global_aiohttp_client_setup()
    control = get_global_aiohttp_control_client()
    assert control is not data and control.connector is not data.connector
    assert isinstance(control.timeout.total, float)  # the control pool has a finite timeout
    assert data.timeout.total is None  # data calls (generations) may take minutes
    await close_global_aiohttp_client()
    assert data.closed and control.closed
    assert data.connector is None or data.connector.closed
    assert not is_global_aiohttp_client_setup()
    fresh = get_global_aiohttp_client()  # the config survives a close; sessions are rebuilt
    assert fresh is not data and not fresh.closed
    await close_global_aiohttp_client()


async def test_set_uses_the_config_and_refuses_a_second_set_on_the_same_loop() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=10, global_aiohttp_connector_limit_per_host=4
    )
    session = set_global_aiohttp_client(cfg, workers=2)
    connector = session.connector
    assert isinstance(connector, aiohttp.TCPConnector)
    assert (connector.limit, connector.limit_per_host) == (5, 2)
    with pytest.raises(RuntimeError, match="already set up"):
        set_global_aiohttp_client(cfg)
    await close_global_aiohttp_client()
    set_global_aiohttp_client(cfg)  # fine after a close
    await close_global_aiohttp_client()


async def test_plain_and_traced_sessions_share_one_pool() -> None:
    plain = get_global_aiohttp_client()
    assert not STATE.enabled and plain.trace_configs == []
    saved = STATE.snapshot()
    try:
        STATE.enabled = True
        traced = get_global_aiohttp_client()
        assert traced is not plain and len(traced.trace_configs) == 1
        assert traced.connector is plain.connector
    finally:
        STATE.restore(saved)
    await close_global_aiohttp_client()


def test_another_loop_gets_its_own_sessions() -> None:
    seen: dict[str, object] = {}

    async def in_thread() -> None:
        seen["session"] = get_global_aiohttp_client()
        seen["loop"] = asyncio.get_running_loop()
        await close_global_aiohttp_client()

    async def main() -> None:
        mine = get_global_aiohttp_client()
        thread = threading.Thread(target=lambda: asyncio.run(in_thread()))
        thread.start()
        await asyncio.to_thread(thread.join)
        assert seen["session"] is not mine
        assert seen["loop"] is not asyncio.get_running_loop()
        assert not mine.closed
        await close_global_aiohttp_client()
        assert mine.closed

    asyncio.run(main())


def test_sessions_of_a_finished_loop_are_forgotten() -> None:
    async def leave_open() -> aiohttp.ClientSession:
        return get_global_aiohttp_client()

    stale = asyncio.run(leave_open())  # that loop is closed now; its session can never be used again

    async def main() -> None:
        fresh = get_global_aiohttp_client()
        assert fresh is not stale
        await close_global_aiohttp_client()

    asyncio.run(main())


def test_configure_needs_no_loop_and_logs_the_capacity_report() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=64, global_aiohttp_intended_concurrency=1000
    )
    with structlog.testing.capture_logs() as logs:
        report = configure_global_aiohttp_client(cfg, workers=1)
    assert report.warnings
    events = [(entry["log_level"], entry["event"]) for entry in logs]
    assert ("info", "client_capacity") in events
    assert ("warning", "client_capacity_warning") in events
    (line,) = [e["report"] for e in logs if e["event"] == "client_capacity"]
    assert line == report.line and "data limit=64" in line


def test_get_outside_a_loop_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        get_global_aiohttp_client()
    assert is_global_aiohttp_client_setup() in (True, False)


@pytest.mark.parametrize(
    ("cfg", "error"),
    [
        (None, TypeError),
        ("global_aiohttp_connector_limit=1", TypeError),
        ({"global_aiohttp_connector_limit": -1}, ValueError),
        ({"global_aiohttp_conector_limit": 1}, ValueError),  # a typo is an error, not ignored
        (GlobalAIOHTTPAsyncClientConfig.model_construct(global_aiohttp_connector_limit=-5), ValueError),
        (GlobalAIOHTTPAsyncClientConfig(global_aiohttp_max_retry_seconds=float("inf")), ValueError),
    ],
    ids=["none", "str", "negative_limit", "unknown_key", "constructed_unvalidated", "infinite_budget"],
)
async def test_set_rejects_a_bad_config_and_keeps_the_old_one(cfg: object, error: type[Exception]) -> None:
    good = GlobalAIOHTTPAsyncClientConfig(global_aiohttp_connector_limit=7)
    configure_global_aiohttp_client(good, workers=1)
    with pytest.raises(error):
        set_global_aiohttp_client(cfg)  # type: ignore[arg-type]
    with pytest.raises(error):
        configure_global_aiohttp_client(cfg)  # type: ignore[arg-type]
    assert not is_global_aiohttp_client_setup()
    assert current_config() == good  # nothing was stored
    session = get_global_aiohttp_client()
    assert isinstance(session.connector, aiohttp.TCPConnector) and session.connector.limit == 7
    await close_global_aiohttp_client()


async def test_set_accepts_a_mapping_of_fields() -> None:
    session = set_global_aiohttp_client({"global_aiohttp_connector_limit": 9}, workers=1)  # type: ignore[arg-type]
    assert isinstance(session.connector, aiohttp.TCPConnector) and session.connector.limit == 9
    await close_global_aiohttp_client()


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_configure_rejects_bad_worker_counts(workers: object) -> None:
    with pytest.raises(ValueError, match="workers"):
        configure_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig(), workers=workers)  # type: ignore[arg-type]
