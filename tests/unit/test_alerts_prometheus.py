"""A real Prometheus (Debian's 2.42) loads collector/alerts.yml and evaluates every rule without an error
against real gym metrics: a real process exporting every gym instrument through the OpenTelemetry SDK's
Prometheus exporter (tests/e2e/_metrics_emitter.py), scraped every second."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "collector" / "alerts.yml"
PROMETHEUS_PORT = 32650
EMITTER_PORT = 32651


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.load(reply)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: scripts/test.sh installs Debian's prometheus package"
    work = tmp_path_factory.mktemp("alerts-prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "gym",
                "honor_labels": True,
                # as the harness's file_sd targets give it: job = service.name
                "static_configs": [
                    {"targets": [f"127.0.0.1:{EMITTER_PORT}"], "labels": {"job": "gym/agent"}}
                ],
            }
        ],
    }
    (work / "prometheus.yml").write_text(json.dumps(config))
    emitter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.e2e._metrics_emitter",
            "--port",
            str(EMITTER_PORT),
            "--service-name",
            "gym/agent",
        ],
        cwd=REPO,
    )
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{PROMETHEUS_PORT}"
    finally:
        for proc in (server, emitter):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _rules_after_evaluations(url: str, evaluations: int) -> list[dict[str, Any]]:
    """Every alerting rule, once each has been evaluated ``evaluations`` times with data scraped."""
    first: dict[str, str] = {}
    for _ in range(600):  # bounded wait for Prometheus to start, scrape and evaluate
        try:
            groups = _get(f"{url}/api/v1/rules")["data"]["groups"]
            up = _get(f"{url}/api/v1/query?query=up")["data"]["result"]
        except OSError:
            time.sleep(0.1)
            continue
        rules = [rule for group in groups for rule in group["rules"]]
        for rule in rules:
            first.setdefault(rule["name"], rule.get("lastEvaluation", ""))
        scraped = any(r["value"][1] == "1" for r in up)
        evaluated = (
            all(rule.get("lastEvaluation", "") > first[rule["name"]] for rule in rules) and len(rules) > 0
        )
        if scraped and evaluated:
            if evaluations <= 1:
                return rules
            evaluations -= 1
            first = {rule["name"]: rule["lastEvaluation"] for rule in rules}
        time.sleep(0.2)
    raise AssertionError("Prometheus never evaluated the rules")


def test_prometheus_loads_and_evaluates_every_rule_without_error(prometheus: str) -> None:
    rules = _rules_after_evaluations(prometheus, evaluations=3)
    expected = [
        rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]
    assert sorted(rule["name"] for rule in rules) == sorted(expected)
    assert [
        (rule["name"], rule["health"], rule.get("lastError", "")) for rule in rules if rule["health"] != "ok"
    ] == []


def test_the_gym_metrics_the_rules_read_are_really_scraped(prometheus: str) -> None:
    _rules_after_evaluations(prometheus, evaluations=1)
    for series in (
        "gym_client_retries_total",
        "http_client_request_duration_seconds_count",
        "gym_client_pool_wait_duration_seconds_bucket",
        "gym_client_pool_pending_requests",
        "gym_failure_events_total",
        "gym_rollouts_total",
        "http_server_request_duration_seconds_count",
        'target_info{job="gym/agent"}',
    ):
        result = _get(f"{prometheus}/api/v1/query?query={urllib.request.quote(series)}")["data"]["result"]
        assert result, f"no series {series}: an alert on it could never fire"
