"""Connector factory, per-worker limits, keepalive socket options and the start-up capacity report."""

from __future__ import annotations

import socket

import pytest

from gym_obs.client.pool import (
    UVICORN_DEFAULT_KEEPALIVE_SECONDS,
    WORKERS_ENV,
    GlobalAIOHTTPAsyncClientConfig,
    capacity_report,
    effective_limits,
    ephemeral_port_range,
    keepalive_socket_factory,
    make_connector,
    nofile_soft_limit,
    worker_count,
)


def test_config_is_the_one_from_gym_obs_config() -> None:
    from gym_obs import config

    assert GlobalAIOHTTPAsyncClientConfig is config.GlobalAIOHTTPAsyncClientConfig
    cfg = GlobalAIOHTTPAsyncClientConfig()
    assert cfg.global_aiohttp_control_connector_limit == 256
    assert cfg.global_aiohttp_control_connector_limit_per_host == 64
    assert cfg.global_aiohttp_keepalive_timeout_seconds < UVICORN_DEFAULT_KEEPALIVE_SECONDS
    assert cfg.global_aiohttp_max_retry_seconds < float("inf")


def test_worker_count_prefers_argument_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert worker_count() == 1
    monkeypatch.setenv(WORKERS_ENV, "4")
    assert worker_count() == 4
    assert worker_count(2) == 2
    monkeypatch.setenv(WORKERS_ENV, "not-a-number")
    assert worker_count() == 1
    monkeypatch.setenv(WORKERS_ENV, "0")
    assert worker_count() == 1


def test_limits_are_divided_among_workers_and_never_become_unlimited() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=1000,
        global_aiohttp_connector_limit_per_host=10,
        global_aiohttp_control_connector_limit=0,
        global_aiohttp_control_connector_limit_per_host=3,
    )
    limits = effective_limits(cfg, workers=4)
    assert limits.workers == 4
    assert (limits.data.limit, limits.data.limit_per_host) == (250, 2)
    # 0 stays "unlimited"; 3 // 4 == 0 would silently mean unlimited, so it is clamped to 1.
    assert (limits.control.limit, limits.control.limit_per_host) == (0, 1)
    assert limits.for_pool("control") is limits.control


def test_keepalive_socket_factory_sets_tcp_keepalive_options() -> None:
    factory = keepalive_socket_factory(61, 11, 4)
    sock = factory((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 0)))
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 61
        if hasattr(socket, "TCP_KEEPINTVL"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 11
        if hasattr(socket, "TCP_KEEPCNT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
    finally:
        sock.close()


async def test_make_connector_applies_per_worker_limits_and_short_keepalive() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=100, global_aiohttp_connector_limit_per_host=40
    )
    connector = make_connector(cfg, "data", workers=2)
    control = make_connector(cfg, "control", workers=2)
    try:
        assert (connector.limit, connector.limit_per_host) == (50, 20)
        assert (control.limit, control.limit_per_host) == (128, 32)
        assert connector._keepalive_timeout == cfg.global_aiohttp_keepalive_timeout_seconds
    finally:
        await connector.close()
        await control.close()


def test_capacity_report_line_without_warnings() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=200,
        global_aiohttp_connector_limit_per_host=100,
        global_aiohttp_intended_concurrency=100,
        global_aiohttp_intended_concurrency_per_host=50,
    )
    report = capacity_report(cfg, workers=2, nofile_soft=65536, port_range=(32768, 60999))
    assert report.warnings == ()
    assert "\n" not in report.line
    for fragment in ("workers=2", "data limit=100", "per_host=50", "keepalive=4s", "nofile_soft=65536",
                     "ephemeral_ports=28232", "warnings=0"):
        assert fragment in report.line


def test_capacity_report_warns_when_intended_concurrency_exceeds_limits() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=64,
        global_aiohttp_connector_limit_per_host=8,
        global_aiohttp_intended_concurrency=128,
        global_aiohttp_intended_concurrency_per_host=16,
    )
    report = capacity_report(cfg, workers=1, nofile_soft=65536, port_range=(32768, 60999))
    text = " | ".join(report.warnings)
    assert len(report.warnings) == 2
    assert "intended concurrency 128 exceeds the data pool limit 64" in text
    assert "per-host concurrency 16 exceeds the per-host limit 8" in text
    assert "warnings=2" in report.line


def test_capacity_report_warns_about_file_descriptors_and_ports() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=100_000,
        global_aiohttp_connector_limit_per_host=100_000,
        global_aiohttp_intended_concurrency=50_000,
    )
    report = capacity_report(cfg, workers=1, nofile_soft=1024, port_range=(40000, 40999))
    text = " | ".join(report.warnings)
    assert "file-descriptor soft limit 1024" in text
    assert "ephemeral port range 40000-40999 (1000 ports" in text


def test_capacity_report_warns_when_client_keepalive_is_not_shorter_than_the_server() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(global_aiohttp_keepalive_timeout_seconds=15)
    report = capacity_report(cfg, workers=1, nofile_soft=None, port_range=None)
    assert any("keep-alive 15s is not shorter" in w for w in report.warnings)
    assert "nofile_soft=unknown" in report.line and "ephemeral_ports=unknown" in report.line


def test_machine_limits_are_readable_here() -> None:
    soft = nofile_soft_limit()
    assert soft is None or soft > 0
    ports = ephemeral_port_range()
    assert ports is None or ports[0] <= ports[1]
    assert ephemeral_port_range("/nonexistent/ip_local_port_range") is None
