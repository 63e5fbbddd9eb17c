"""Issues 11 (keepalive bounds, intended concurrency, capacity report) and 12.10 (retry settings that cannot
back off): refused at config load with a message that names the key, or reported with the real cap."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gym_obs.client.pool import capacity_report
from gym_obs.config import GlobalAIOHTTPAsyncClientConfig, parse_global_config


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("global_aiohttp_tcp_keepalive_idle_seconds", 32768),
        ("global_aiohttp_tcp_keepalive_interval_seconds", 40_000),
        ("global_aiohttp_tcp_keepalive_probes", 128),
        ("global_aiohttp_tcp_keepalive_probes", True),
        ("global_aiohttp_intended_concurrency", 0),
        ("global_aiohttp_intended_concurrency_per_host", 0),
        ("global_aiohttp_intended_concurrency", -3),
        ("global_aiohttp_retry_backoff_base_seconds", 0),
        ("global_aiohttp_retry_backoff_base_seconds", 1e-9),
        ("global_aiohttp_retry_backoff_base_seconds", float("nan")),
        ("global_aiohttp_retry_backoff_cap_seconds", 0),
        ("global_aiohttp_retry_backoff_cap_seconds", float("inf")),
    ],
)
def test_settings_the_kernel_or_a_backoff_cannot_honour_are_refused(key: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        GlobalAIOHTTPAsyncClientConfig(**{key: value})
    assert key in str(info.value)


def test_a_cap_below_the_base_is_refused_with_both_names() -> None:
    with pytest.raises(ValidationError) as info:
        GlobalAIOHTTPAsyncClientConfig(
            global_aiohttp_retry_backoff_base_seconds=1.0, global_aiohttp_retry_backoff_cap_seconds=0.5
        )
    text = str(info.value)
    assert "global_aiohttp_retry_backoff_cap_seconds" in text and "cannot back off" in text


def test_the_kernel_maxima_and_unset_concurrency_are_accepted() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_tcp_keepalive_idle_seconds=32767,
        global_aiohttp_tcp_keepalive_interval_seconds=32767,
        global_aiohttp_tcp_keepalive_probes=127,
        global_aiohttp_intended_concurrency=None,
        global_aiohttp_intended_concurrency_per_host=1,
        global_aiohttp_retry_backoff_base_seconds=0.001,
        global_aiohttp_retry_backoff_cap_seconds=0.001,
    )
    assert cfg.global_aiohttp_tcp_keepalive_probes == 127


def test_a_bad_keepalive_fails_loading_the_global_config() -> None:
    with pytest.raises(ValueError, match="global_aiohttp_tcp_keepalive_idle_seconds"):
        parse_global_config({"client": {"global_aiohttp_tcp_keepalive_idle_seconds": 99_999}}, source="t")


def test_capacity_report_uses_the_real_per_host_cap_when_the_total_limit_is_lower() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=64,
        global_aiohttp_connector_limit_per_host=1024,
        global_aiohttp_intended_concurrency_per_host=1000,
    )
    report = capacity_report(cfg, workers=4, nofile_soft=65536, port_range=(32768, 60999))
    assert report.limits.data.host_cap == 16
    assert "data limit=16 per_host=16 " in report.line
    assert any("per-host limit 64 (16 per worker x 4)" in w for w in report.warnings), report.warnings


def test_capacity_report_warns_when_an_unlimited_per_host_is_capped_by_the_total() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit=8,
        global_aiohttp_connector_limit_per_host=0,
        global_aiohttp_intended_concurrency_per_host=20,
    )
    report = capacity_report(cfg, workers=1, nofile_soft=65536, port_range=(32768, 60999))
    assert "per_host=8 " in report.line
    assert any("per-host concurrency 20 exceeds the per-host limit 8" in w for w in report.warnings)
    assert any("global_aiohttp_connector_limit " in w for w in report.warnings)
