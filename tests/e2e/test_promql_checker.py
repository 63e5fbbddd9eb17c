"""The PromQL checker against a real Prometheus scraping real OpenTelemetry ``/metrics`` endpoints.

Two stand-in gym processes (``_metrics_emitter``) export every gym metric through
opentelemetry-exporter-prometheus; Debian's ``prometheus`` scrapes them with ``job`` = service.name. The
committed dashboards must pass the checker, and the checker must fail on a misspelled metric, on a query
with no data, and on a query Prometheus rejects (the negative controls).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_obs import dashboards
from tests.e2e.promql_check import (
    PrometheusAPI,
    QueryWindow,
    check_dashboards,
    load_dashboards,
    panel_queries,
    run_prometheus,
    wait_for_samples,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_LISTEN = "127.0.0.1:23090"
EMITTERS = {"gym/agent": 23101, "gym/model_server": 23102}
SCRAPE_INTERVAL_S = 1.0


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: emitter exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """(Prometheus base URL, time the emitters started) with every gym series scraped several times."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for service_name, port in EMITTERS.items():
            command = [sys.executable, "-m", "tests.e2e._metrics_emitter", "--port", str(port)]
            process = subprocess.Popen([*command, "--service-name", service_name], cwd=ROOT, env=env)
            processes.append(process)
        for process, port in zip(processes, EMITTERS.values(), strict=True):
            _wait_http(f"http://127.0.0.1:{port}/metrics", process)
        started = time.time()
        targets = {name: [f"127.0.0.1:{port}"] for name, port in EMITTERS.items()}
        work_dir = tmp_path_factory.mktemp("prometheus")
        with run_prometheus(
            targets, work_dir, listen=PROMETHEUS_LISTEN, scrape_interval_s=SCRAPE_INTERVAL_S
        ) as url:
            # The first scrape comes a few seconds after start; rates need several samples per window.
            wait_for_samples(url, dashboards.ROLLOUTS.series(), min_samples=8, timeout_s=60)
            yield url, started
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _window(started: float) -> QueryWindow:
    return QueryWindow(start=started, end=time.time(), scrape_interval_s=SCRAPE_INTERVAL_S)


@pytest.fixture(scope="module")
def committed() -> dict[str, dict[str, Any]]:
    """The dashboards Grafana loads: the committed JSON (a unit test keeps it equal to the code's output)."""
    boards = load_dashboards(ROOT / "dashboards")
    assert set(boards) == set(dashboards.build_dashboards())
    return boards


def test_job_label_is_the_service_name(stack: tuple[str, float]) -> None:
    url, _ = stack
    data = PrometheusAPI(url).query(f"count by (job) ({dashboards.ROLLOUTS.series()})", at=time.time())
    assert {series["metric"]["job"] for series in data["result"]} == set(EMITTERS)


def test_every_panel_of_every_dashboard_has_data(
    stack: tuple[str, float], committed: dict[str, dict[str, Any]]
) -> None:
    url, started = stack
    report = check_dashboards(url, committed, _window(started))
    queries = sum(len(list(panel_queries(board))) for board in committed.values())
    variables = sum(len(board["templating"]["list"]) for board in committed.values())
    assert report.ok, report.summary()
    assert len(report.checked) == queries + variables
    assert queries >= 20


def test_one_service_selected_by_job_still_has_data(
    stack: tuple[str, float], committed: dict[str, dict[str, Any]]
) -> None:
    url, started = stack
    report = check_dashboards(url, committed, _window(started), variables={"job": "gym/agent"})
    assert report.ok, report.summary()


def _replace_in_exprs(board: dict[str, Any], old: str, new: str) -> list[str]:
    changed = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            if old in target["expr"]:
                target["expr"] = target["expr"].replace(old, new)
                changed.append(panel["title"])
    return changed


def test_negative_control_misspelled_metric_fails(
    stack: tuple[str, float], committed: dict[str, dict[str, Any]]
) -> None:
    url, started = stack
    board = copy.deepcopy(committed["gym-http-client.json"])
    real = dashboards.CLIENT_RETRIES.series()
    misspelled = real.replace("retries", "retrys")
    changed = _replace_in_exprs(board, real, misspelled)
    assert changed == ["Retries per second by reason"]

    report = check_dashboards(url, [board], _window(started))

    assert not report.ok
    panel = "gym / HTTP client and pools / Retries per second by reason / A"
    assert [(problem.where, problem.message) for problem in report.problems] == [
        (panel, f"unknown metric(s) {misspelled} (not in Prometheus)"),
        (panel, "empty result"),
    ]  # and nothing else is flagged


def test_negative_control_query_without_data_fails(
    stack: tuple[str, float], committed: dict[str, dict[str, Any]]
) -> None:
    url, started = stack
    board = copy.deepcopy(committed["gym-failures.json"])
    events = dashboards.FAILURE_EVENTS.series()
    _replace_in_exprs(board, events + "{", events + '{gym_failure_kind="no-such-kind",')
    report = check_dashboards(url, [board], _window(started))
    assert not report.ok
    assert {problem.message for problem in report.problems} == {"empty result"}


def test_negative_control_invalid_query_and_variable_fail(
    stack: tuple[str, float], committed: dict[str, dict[str, Any]]
) -> None:
    url, started = stack
    board = json.loads(json.dumps(committed["gym-servers.json"]))
    board["panels"][0]["targets"][0]["expr"] = "sum by (job (" + dashboards.SERVER_REQUEST_DURATION.series(
        "_count"
    )
    board["templating"]["list"][0]["query"]["query"] = "label_values(gym_no_such_metric, job)"
    report = check_dashboards(url, [board], _window(started))
    messages = [problem.message for problem in report.problems]
    assert any(message.startswith("query failed: bad_data") for message in messages), messages
    assert "unknown metric(s) gym_no_such_metric (not in Prometheus)" in messages
    assert "no values for label job" in messages
