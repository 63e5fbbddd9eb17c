"""Every rate window of every generated dashboard spans at least four metric export intervals of a gym
process, so no rate or quantile panel has gaps at the default export interval."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gym_obs.config import TelemetryConfig
from gym_obs.dashboards import DEFAULT_OUT_DIR, build_dashboards, stale_dashboards
from gym_obs.telemetry import names
from gym_obs.telemetry.settings import resolve_settings

_RANGE = re.compile(r"\[([^\[\]]+)\]")
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(text: str) -> float:
    parts = _DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(int(n) * _SECONDS[u] for n, u in parts)


def _panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in model.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def _export_interval_s() -> float:
    return resolve_settings(TelemetryConfig(enabled=True), {}).metric_export_interval_ms / 1000


def test_default_export_interval_is_ten_seconds() -> None:
    assert _export_interval_s() == names.DEFAULT_EXPORT_INTERVAL_S == 10
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "2500"}
    assert resolve_settings(TelemetryConfig(enabled=True), env).metric_export_interval_ms == 2500
    config = TelemetryConfig(enabled=True, metric_export_interval_ms=30_000)
    assert resolve_settings(config, env).metric_export_interval_ms == 30_000


@pytest.mark.parametrize("file_name", sorted(build_dashboards()))
def test_every_rate_window_covers_four_export_intervals(file_name: str) -> None:
    model = json.loads((DEFAULT_OUT_DIR / file_name).read_text())  # what Grafana loads
    minimum = names.RATE_WINDOW_EXPORTS * _export_interval_s()
    windows = 0
    for panel in _panels(model):
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            for window in _RANGE.findall(expr):
                windows += 1
                if window == "$__range":
                    continue  # the dashboard's whole time range (instant totals)
                if window == "$__rate_interval":
                    # Grafana: max($__interval + step, 4 * step) with step = the query's minimum interval
                    step = target.get("interval") or panel.get("interval")
                    assert step, f"{file_name}: {panel['title']!r} uses $__rate_interval without a min step"
                    assert 4 * _seconds(step) >= minimum, (file_name, panel["title"], step)
                else:
                    assert _seconds(window) >= minimum, (file_name, panel["title"], window)
    assert windows > 0


def test_dashboard_files_are_what_the_code_builds() -> None:
    assert stale_dashboards() == []
