"""Nothing lost when the harness crashes or a peer misbehaves: real ``gym-obs harness run`` processes.

Ports 32000-32099 (head server at the base, then agent, model, resources). Rows are compared with what the
run itself reported (its progress lines in ``logs/harness.log``), with the servers' control routes and with
the agent's own spans; nothing here is timed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from gym_obs.failures import read_report_from_row
from gym_obs.harness.fault_middleware import MALFORMED_BODIES
from gym_obs.harness.stats import QuantileSketch, quantile
from gym_obs.harness.telemetry_files import iter_spans
from gym_obs.telemetry import names
from tests.processes import alive, descendants, wait_until

pytestmark = pytest.mark.e2e

_DONE = re.compile(r"rollouts done: (\d+)/(\d+)")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _command(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--out", str(out), *args]


def _plan(tmp_path: Path, *faults: dict[str, Any]) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"faults": list(faults)}))
    return path


def _run(tmp_path: Path, *args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = tmp_path / "out"
    done = subprocess.run(_command(out, *args), capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    summary = json.loads((out / "latest" / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "latest" / "rollouts.jsonl").read_text().splitlines()]
    return summary, rows


def _reported_done(log: Path) -> list[int]:
    if not log.exists():
        return []
    counts = []
    for line in log.read_text().splitlines():
        match = _DONE.search(line)
        if match:
            counts.append(int(match.group(1)))
    return counts


def _injected(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_gym/faults", timeout=5) as response:
        body: dict[str, Any] = json.loads(response.read())
    return {str(k): int(v) for k, v in body["injected"].items()}


def test_sigkill_keeps_every_row_the_run_reported_finished(tmp_path: Path) -> None:
    """Some rollouts hang until all four workers are stuck: the run is quiescent, its progress line says
    how many finished, and after SIGKILL exactly that many complete rows are on disk."""
    out = tmp_path / "out"
    plan = _plan(tmp_path, {"server": "agent", "route": "/run", "rate": 0.05, "action": "hang"})
    args = ["--rollouts", "2000", "--concurrency", "4", "--port-base", "32000", "--faults", str(plan)]
    args += ["--request-timeout", "120", "--seed", "7", "--no-telemetry"]
    process = subprocess.Popen(
        _command(out, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env()
    )
    children: set[int] = set()
    try:
        log = out / "latest" / "logs" / "harness.log"
        wait_until(lambda: bool(_reported_done(log)), 120, "the first progress line")
        children = descendants(process.pid)
        wait_until(lambda: _injected(32001).get("hang", 0) >= 4, 120, "every worker stuck on a hang")
        # two progress lines after the last worker got stuck: nothing can finish any more
        seen = len(_reported_done(log))
        wait_until(lambda: len(_reported_done(log)) >= seen + 2, 30, "two more progress lines")
        reported = _reported_done(log)
        assert reported[-1] == reported[-2]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in children:
            if alive(pid):
                wait_until(lambda pid=pid: not alive(pid), 30, f"child {pid} to die with the harness")
    lines = (out / "latest" / "rollouts.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""  # no partial line
    rows = [json.loads(line) for line in lines[:-1]]
    assert len(rows) == reported[-1] > 0
    assert len({row["index"] for row in rows}) == len(rows)


def test_malformed_agent_bodies_fail_their_rollouts_and_the_run_goes_on(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"server": "agent", "route": "/run", "rate": 0.25, "action": "malformed_body"})
    summary, rows = _run(
        tmp_path, "--rollouts", "48", "--concurrency", "6", "--port-base", "32010", "--faults", str(plan),
        "--seed", "3", "--no-telemetry",
    )
    injected = summary["faults_injected"]["agent_0"]["malformed_body"]
    assert injected >= len(MALFORMED_BODIES)  # every kind of bad body was served at least once
    assert len(rows) == summary["rollouts"] == 48
    bad = [r for r in rows if r["outcome"] == names.ROLLOUT_OUTCOME_FAILED]
    assert len(bad) == injected == summary["outcomes"]["failed"]
    for row in bad:
        assert row["root_cause"]["kind"] == "protocol_violation"
        assert row["root_cause"]["boundary"] == "harness"
        assert "agent_0: the HTTP 200 reply" in row["error"]
        report = read_report_from_row(row)
        assert report is not None and report.final_record is not None
        assert report.final_record["http_status"] == 200
    problems = {re.sub(r".*the HTTP 200 reply ", "", r["error"]) for r in bad}
    assert any("is not JSON" in p for p in problems) and any("array, not an object" in p for p in problems)
    assert any("'reward'" in p for p in problems) and any("'hops'" in p for p in problems)
    groups = summary["failures_by_root_cause"]
    assert {g["root_kind"] for g in groups} == {"protocol_violation"}
    assert sum(g["count"] for g in groups) == injected


def test_success_rows_record_the_failures_their_agent_recovered_from(tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"server": "model", "route": "/v1/responses", "rate": 0.2, "action": "disconnect"})
    summary, rows = _run(
        tmp_path, "--rollouts", "40", "--concurrency", "4", "--port-base", "32020", "--faults", str(plan),
        "--seed", "5",
    )
    injected = summary["faults_injected"]["model_0"]["disconnect"]
    successes = [r for r in rows if r["outcome"] == names.ROLLOUT_OUTCOME_COMPLETED]
    assert injected > 0 and successes
    # the agent's own CLIENT spans: one failed-attempt event per dropped model call, by rollout
    attempts: Counter[str] = Counter()
    for span in iter_spans(tmp_path / "out" / "latest" / "telemetry"):
        rollout = span["attributes"].get(names.ATTR_ROLLOUT_ID)
        if span["service"] == names.SERVICE_NAME_PREFIX + "agent_0" and rollout:
            attempts[rollout] += sum(e["name"] == names.SPAN_EVENT_ATTEMPT_FAILED for e in span["events"])
    recovered_total = 0
    for row in successes:
        report = read_report_from_row(row)
        count = attempts[row["rollout_id"]]
        if count == 0:
            assert report is None and "recovered_failures" not in row
            continue
        assert report is not None and report.failure_id is None  # recovered: no final failure
        gym_events = [e for e in report.events.values() if e["failure_kind"] is not None]
        assert row["recovered_failures"] == len(gym_events) == count
        assert {(e["failure_kind"], e["boundary"]) for e in gym_events} == {("transport_peer_drop", "model")}
        assert {e["rollout_id"] for e in gym_events} == {row["rollout_id"]}
        recovered_total += count
    assert recovered_total > 0 and summary["recovered_failures"] == recovered_total
    # consistent with what the agent counted (metrics) and what the model server injected
    counted = summary["failure_events"]["transport_peer_drop/model/agent"]
    assert recovered_total <= counted == injected
    if summary["outcomes"]["failed"] == 0:
        assert recovered_total == injected


def test_streamed_summary_matches_the_rows_within_its_stated_precision(tmp_path: Path) -> None:
    """More rollouts than the sketch keeps exactly: the summary's quantiles are within its stated relative
    error of the exact quantiles of the rows' durations."""
    summary, rows = _run(
        tmp_path, "--rollouts", "1500", "--concurrency", "32", "--port-base", "32030", "--turns", "1",
        "--fanout", "1", "--model-latency-ms", "2", "--latency-distribution", "exponential", "--no-telemetry",
    )
    precision = summary["quantile_precision"]
    assert precision == {"exact_up_to": QuantileSketch.EXACT_LIMIT, "relative_error": 0.01}
    assert len(rows) == 1500 > precision["exact_up_to"]
    durations = sorted(r["duration_s"] for r in rows)  # rounded to 1 us on the row
    latency = summary["rollout_latency_s"]
    assert latency["count"] == 1500 and latency["max"] == pytest.approx(durations[-1], abs=1e-6)
    for key, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        exact = quantile(durations, q)
        assert exact is not None
        assert abs(latency[key] - exact) <= precision["relative_error"] * exact + 1e-6, key
    hop = summary["hops_in_band"]["agent -> model"]
    assert hop["count"] == 1500
