"""Dashboards against real data: the harness feeds a real Prometheus, every panel query must have data.

``gym-obs harness run`` (a subprocess, the way a user runs it) starts the rollout system with every process
serving ``/metrics``, injects faults that produce failures, retries and pool waits, and lingers after the
rollouts so the final values stay scrapeable. Debian's ``prometheus`` discovers the processes from the
harness's own ``prometheus_targets.json`` (file_sd, ``job`` = ``service.name``). Then every PromQL
expression of every panel and variable of the committed dashboards goes through Prometheus's HTTP API: it
must succeed, return a finite value, name only metrics Prometheus has, and (stricter than "not empty") show
something other than zero, because this run injected exactly what each panel is there to show.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gym_obs import dashboards
from gym_obs.telemetry import names
from tests.e2e.promql_check import (
    PrometheusAPI,
    QueryWindow,
    check_dashboards,
    load_dashboards,
    metric_names,
    panel_queries,
    run_prometheus,
    substitute,
    variable_values,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PORT_BASE = 27100  # head server; agent, model and resources servers on the next ports
METRICS_PORT_BASE = 27110  # /metrics of the harness driver, then of each server
PROMETHEUS_LISTEN = "127.0.0.1:27190"
SCRAPE_INTERVAL_S = 1.0
SERVICES = {"gym/harness", "gym/agent_0", "gym/model_0", "gym/resources_0"}

ROLLOUTS = 200
# 80 ms model replies keep the run going for well over ten seconds even on a fast machine: Prometheus
# discovers the targets ~5 s after the harness writes them, and rates need scrapes while rollouts run.
RUN_ARGS = (
    f"--rollouts={ROLLOUTS}",
    "--concurrency=8",
    "--model-latency-ms=80",
    "--pool-limit-per-host=4",  # 8 rollouts x 3 fan-out calls through 4 connections: requests queue
    "--seed=7",
    "--stream",  # streamed model replies: the model-calls board's time-to-first-token panel has data
    "--linger=120",  # an upper bound: the test ends the wait with SIGTERM once it has checked
)
FAULTS = [
    # A verifier bug: verifier_error at boundary resources_server, a 500 on /verify, a failed rollout.
    {"server": "resources", "route": "/verify", "rate": 0.3, "action": "raise",
     "exception": "ZeroDivisionError"},
    # Dropped connections: the client retries them (reason server_disconnected), nearly always recovering.
    {"server": "model", "route": "/v1/responses", "rate": 0.1, "action": "disconnect"},
    # An overloaded provider: a 503 is not retried, so the rollout fails with provider_unavailable.
    {"server": "model", "route": "/v1/responses", "rate": 0.05, "action": "status", "status": 503},
]  # fmt: skip


@dataclass
class LiveRun:
    url: str
    started: float  # wall clock when the harness started: the dashboards' time range begins here
    out: Path
    final: dict[str, dict[str, float]]  # Prometheus' final totals, for the cross-check with summary.json

    def window(self) -> QueryWindow:
        return QueryWindow(start=self.started, end=time.time(), scrape_interval_s=SCRAPE_INTERVAL_S)


# --- the harness as a subprocess ----------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the harness's servers run in their own sessions)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _stop_harness(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM ends the linger; the harness stops its servers in order. Kill by pid only as a last resort."""
    if process.poll() is not None:
        return process.returncode
    children = _children(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        for child in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child, signal.SIGKILL)  # each server leads its own process group
        return process.wait(timeout=10)


def _output(out: Path) -> str:
    return "".join(
        f"--- {name}\n{(out.parent / name).read_text(errors='replace')[-3000:]}\n"
        for name in ("harness.stdout", "harness.stderr")
        if (out.parent / name).exists()
    )


# --- waiting on Prometheus (polling; never a blind sleep) ---------------------------------------------------


def _scalar(api: PrometheusAPI, expr: str) -> float | None:
    result = api.query(expr, at=time.time())["result"]
    return float(result[0]["value"][1]) if result else None


def _totals(api: PrometheusAPI, expr: str, *labels: str) -> dict[str, float]:
    totals = {}
    for series in api.query(expr, at=time.time())["result"]:
        key = "/".join(series["metric"].get(label, "") for label in labels)
        totals[key] = float(series["value"][1])
    return totals


def _wait(
    what: str,
    condition: Callable[[], bool],
    process: subprocess.Popen[bytes],
    out: Path,
    timeout_s: float,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the harness exited ({process.returncode}) before {what}\n{_output(out)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout_s} s\n{_output(out)}")
        time.sleep(0.25)


def _wait_for_run(api: PrometheusAPI, process: subprocess.Popen[bytes], out: Path) -> None:
    """Wait until Prometheus saw all rollouts finish, then until every target was scraped after that."""
    rollouts = dashboards.ROLLOUTS.series()
    _wait(
        f"{ROLLOUTS} finished rollouts in Prometheus",
        lambda: (_scalar(api, f"sum({rollouts})") or 0) >= ROLLOUTS,
        process,
        out,
        timeout_s=75,
    )
    done = time.time()
    # The servers' counters were final before the driver counted the last rollout, but their last scrape
    # may predate it: wait until every target was scraped twice after this moment (``timestamp(up)`` is
    # the time of the latest scrape), so that a range query ending now also sees the final values.
    settled = done + 2 * SCRAPE_INTERVAL_S - 0.5
    _wait(
        "two scrapes of every target after the run",
        lambda: (
            _scalar(api, "count(up == 1)") == len(SERVICES)
            and (_scalar(api, "min(timestamp(up))") or 0) > settled
        ),
        process,
        out,
        timeout_s=15,
    )


_OUTCOME = dashboards.prometheus_label(names.ATTR_ROLLOUT_OUTCOME)
_REASON = dashboards.prometheus_label(names.ATTR_RETRY_REASON)
_POOL = dashboards.prometheus_label(names.ATTR_POOL)
_POOL_OUTCOME = dashboards.prometheus_label(names.ATTR_POOL_OUTCOME)
_FAILURE = tuple(
    dashboards.prometheus_label(attr)
    for attr in (names.ATTR_FAILURE_KIND, names.ATTR_FAILURE_BOUNDARY, names.ATTR_FAILURE_STAGE)
)


def _final_totals(api: PrometheusAPI) -> dict[str, dict[str, float]]:
    """What Prometheus holds at the end, grouped the way ``summary.json`` groups the same counters."""

    def by(labels: tuple[str, ...], series: str) -> dict[str, float]:
        return _totals(api, f"sum by ({', '.join(labels)}) ({series})", *labels)

    return {
        "outcomes": by((_OUTCOME,), dashboards.ROLLOUTS.series()),
        "retries": by((_REASON,), dashboards.CLIENT_RETRIES.series()),
        "pool_waits": by((_POOL, _POOL_OUTCOME), dashboards.POOL_WAIT_DURATION.series("_count")),
        "failure_events": by(_FAILURE, dashboards.FAILURE_EVENTS.series()),
    }


def _summary_totals(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {
        # an outcome no rollout had (omitted, here) is 0 in the summary and no series in Prometheus
        "outcomes": {k: float(v) for k, v in summary["outcomes"].items() if v},
        "retries": {k: float(v) for k, v in summary["retries"]["by_reason"].items()},
        "pool_waits": {k: float(v["count"]) for k, v in summary["pool_waits"].items()},
        "failure_events": {k: float(v) for k, v in summary["failure_events"].items()},
    }


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A lingering harness run, fully scraped. On the way out: SIGTERM ends the linger, the harness must
    exit 0, and its summary (built from the file exporter) must agree with what Prometheus scraped."""
    work = tmp_path_factory.mktemp("dashboards-real-data")
    out = work / "run"
    out.mkdir()  # Prometheus watches this directory for the targets file the harness writes into it
    plan = work / "faults.yaml"
    plan.write_text(json.dumps({"faults": FAULTS}))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    command = [
        sys.executable, "-m", "gym_obs.cli", "harness", "run", "--out", str(out), "--faults", str(plan),
        f"--port-base={PORT_BASE}", f"--prometheus-port-base={METRICS_PORT_BASE}", *RUN_ARGS,
    ]  # fmt: skip
    targets = out / "latest" / "prometheus_targets.json"
    with run_prometheus({}, work, listen=PROMETHEUS_LISTEN, file_sd=[targets]) as url:
        api = PrometheusAPI(url)
        started = time.time()
        with (work / "harness.stdout").open("wb") as stdout, (work / "harness.stderr").open("wb") as stderr:
            process = subprocess.Popen(command, cwd=work, env=env, stdout=stdout, stderr=stderr)
        try:
            _wait_for_run(api, process, out)
            final = _final_totals(api)
            yield LiveRun(url=url, started=started, out=out, final=final)
        finally:
            returncode = _stop_harness(process)
    assert returncode == 0, _output(out)
    summary = json.loads((out / "latest" / "summary.json").read_text())
    assert summary["rollouts"] == ROLLOUTS
    assert _summary_totals(summary) == final


@pytest.fixture(scope="module")
def committed() -> dict[str, dict[str, Any]]:
    """The dashboards Grafana loads: the committed JSON (a unit test keeps it equal to the code's output)."""
    boards = load_dashboards(ROOT / "dashboards")
    assert set(boards) == set(dashboards.build_dashboards())
    return boards


# --- the run itself -----------------------------------------------------------------------------------------


def test_prometheus_scrapes_every_process_with_job_as_service_name(live: LiveRun) -> None:
    targets = json.loads((live.out / "latest" / "prometheus_targets.json").read_text())
    assert {group["labels"]["job"] for group in targets} == SERVICES
    active = PrometheusAPI(live.url).call("/api/v1/targets", [("state", "active")], post=False)
    assert {(t["labels"]["job"], t["health"]) for t in active["activeTargets"]} == {
        (job, "up") for job in SERVICES
    }  # the processes are still up after their rollouts: the harness lingers
    assert "every process stays up for 120 s" in (live.out.parent / "harness.stderr").read_text()


def test_rollouts_were_scraped_while_they_ran(live: LiveRun) -> None:
    """Rates need scrapes during the run, not only of the final values: several partial counts were seen."""
    data = PrometheusAPI(live.url).query_range(f"sum({dashboards.ROLLOUTS.series()})", live.window())
    values = [float(value) for _, value in data["result"][0]["values"]]
    partial = sorted({value for value in values if value < ROLLOUTS})
    assert len(partial) >= 3, f"only {partial} before {ROLLOUTS}: the run was too short to be scraped"
    assert max(values) == ROLLOUTS


def test_the_faults_produced_failures_retries_and_pool_waits(live: LiveRun) -> None:
    final = live.final
    assert final["outcomes"].get(names.ROLLOUT_OUTCOME_FAILED, 0) > 0
    assert final["retries"].get(names.RETRY_REASON_SERVER_DISCONNECTED, 0) > 0
    assert final["pool_waits"].get(f"{names.POOL_DATA}/{names.POOL_OUTCOME_OK}", 0) > 0
    kinds = {key.split("/")[0] for key in final["failure_events"]}
    assert {"verifier_error", "provider_unavailable", "transport_peer_drop"} <= kinds


# --- every panel --------------------------------------------------------------------------------------------


def test_every_panel_query_of_every_dashboard_has_data(
    live: LiveRun, committed: dict[str, dict[str, Any]]
) -> None:
    report = check_dashboards(live.url, committed, live.window())
    queries = sum(len(list(panel_queries(board))) for board in committed.values())
    variables = sum(len(board["templating"]["list"]) for board in committed.values())
    assert report.ok, report.summary()
    assert len(report.checked) == queries + variables
    assert queries >= 35 and variables >= 6  # 37 panel queries and 6 variables today


def _nonzero(api: PrometheusAPI, expr: str, window: QueryWindow) -> bool:
    data = api.query_range(expr, window)
    return any(
        math.isfinite(float(value)) and float(value) != 0.0
        for series in data["result"]
        for _, value in series["values"]
    )


def test_every_panel_shows_more_than_zeros(live: LiveRun, committed: dict[str, dict[str, Any]]) -> None:
    """Stricter than "not empty": a failure ratio of constant 0 has data but would hide a broken fault
    path. This run injected what every panel is there to show, so each one draws a non-zero value."""
    api, window = PrometheusAPI(live.url), live.window()
    assert not _nonzero(api, f"sum({dashboards.ROLLOUTS.series()}) * 0", window)  # the check can fail
    flat = []
    for board in committed.values():
        values = variable_values(board)
        for query in panel_queries(board):
            if not _nonzero(api, substitute(query.expr, values, window), window):
                flat.append(query.where)
    assert flat == []


@pytest.mark.parametrize(
    ("board", "job"),
    [
        ("gym-http-client.json", "gym/agent_0"),
        ("gym-servers.json", "gym/model_0"),
        ("gym-failures.json", "gym/agent_0"),
    ],
)
def test_one_service_selected_by_job_has_data(
    live: LiveRun, committed: dict[str, dict[str, Any]], board: str, job: str
) -> None:
    """The ``job`` variable selects one process by the label Prometheus really gave it. (Not the rollouts
    board: rollouts come from the agents, failure events from every server.)"""
    report = check_dashboards(live.url, [committed[board]], live.window(), variables={"job": job})
    assert report.ok, report.summary()


# --- negative controls, against the same live Prometheus ----------------------------------------------------


def _misspell(name: str) -> str:
    """Swap the last two letters: ``gym_rollouts_total`` -> ``gym_rollouts_totla``."""
    return name[:-2] + name[-1] + name[-2]


@pytest.mark.parametrize(
    "file_name",
    [
        "gym-rollouts.json",
        "gym-http-client.json",
        "gym-servers.json",
        "gym-failures.json",
        "gym-processes.json",
        "gym-model-calls.json",
    ],
)
def test_negative_control_misspelled_metric_is_caught(
    live: LiveRun, committed: dict[str, dict[str, Any]], file_name: str
) -> None:
    board = copy.deepcopy(committed[file_name])
    first = next(iter(panel_queries(board)))
    real = sorted(metric_names(first.expr))[0]
    wrong = _misspell(real)
    pattern = re.compile(rf"(?<![\w:]){re.escape(real)}(?![\w:])")
    changed = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            if pattern.search(target["expr"]):
                target["expr"] = pattern.sub(wrong, target["expr"])
                changed.add(f"{board['title']} / {panel['title']} / {target['refId']}")
    assert changed

    report = check_dashboards(live.url, [board], live.window())

    assert not report.ok
    unknown = f"unknown metric(s) {wrong} (not in Prometheus)"
    flagged = {problem.where for problem in report.problems}
    assert flagged == changed, report.summary()  # every changed query is caught, nothing else is flagged
    for where in changed:
        assert (where, unknown) in {(p.where, p.message) for p in report.problems}
