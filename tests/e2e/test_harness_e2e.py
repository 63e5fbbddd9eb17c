"""The harness end to end: real server processes, a real OTLP collector (rotel), assertions on what arrived.

Each test runs ``gym-obs harness run`` as a subprocess (the way a user runs it) and asserts on the
collector's recorded input, the run's rows, summary, logs and telemetry files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from gym_obs.failures import FAILURE_KINDS, read_report_from_row
from gym_obs.harness.faults import CANARY_SECRET
from gym_obs.harness.telemetry_files import iter_spans, read_metric_totals
from gym_obs.telemetry import names
from tests.e2e.rotel_collector import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, RotelCollector

pytestmark = pytest.mark.e2e

SERVICES = {"gym/harness", "gym/agent_0", "gym/model_0", "gym/resources_0"}
TURNS, FANOUT = 3, 3
MODEL_CALLS = 5  # 3 turns, the second fans out to 3 parallel calls


def run_harness(out: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    command = [sys.executable, "-m", "gym_obs.cli", "harness", "run", "--out", str(out), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def write_plan(path: Path, *rules: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"faults": list(rules)}))  # JSON is YAML
    return path


def read_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "latest" / "rollouts.jsonl").read_text().splitlines()]


def service_of(span: dict[str, Any]) -> str:
    return str(span["resource"].get(names.SERVICE_NAME))


def check_rollout_trace(trace: list[dict[str, Any]], rollout_id: str) -> None:
    """One trace across the four processes; every SERVER span's parent is a CLIENT span of its caller."""
    assert {service_of(s) for s in trace} == SERVICES
    by_id = {s["span_id"]: s for s in trace}
    roots = [s for s in trace if not s["parent_span_id"]]
    assert [(r["name"], service_of(r)) for r in roots] == [(names.SPAN_HARNESS_ROLLOUT, "gym/harness")]
    assert roots[0]["attributes"][names.ATTR_ROLLOUT_ID] == rollout_id
    # the agent's gym.rollout span: a child of its SERVER span, the parent of every hop the agent makes
    (rollout,) = [s for s in trace if s["name"] == names.SPAN_ROLLOUT]
    assert service_of(rollout).startswith("gym/agent")
    assert by_id[rollout["parent_span_id"]]["kind"] == SPAN_KIND_SERVER
    assert service_of(by_id[rollout["parent_span_id"]]) == service_of(rollout)
    assert rollout["attributes"][names.ATTR_ROLLOUT_ID] == rollout_id
    agent_clients = [
        s for s in trace if s["kind"] == SPAN_KIND_CLIENT and service_of(s) == service_of(rollout)
    ]
    assert agent_clients and all(s["parent_span_id"] == rollout["span_id"] for s in agent_clients)
    for span in trace:
        if span is roots[0]:
            continue
        parent = by_id[span["parent_span_id"]]  # every span's parent is in the same trace
        if span["kind"] == SPAN_KIND_SERVER:
            assert parent["kind"] == SPAN_KIND_CLIENT
            assert service_of(parent) != service_of(span)
            assert parent["attributes"][names.ATTR_SERVER_NAME] == span["resource"][names.ATTR_SERVER_NAME]
            assert span["attributes"].get(names.ATTR_ROLLOUT_ID) == rollout_id
        elif span["kind"] == SPAN_KIND_CLIENT:
            assert service_of(parent) == service_of(span)
    attempts: dict[str, int] = defaultdict(int)
    for span in trace:
        if span["kind"] == SPAN_KIND_SERVER:
            attempts[span["parent_span_id"]] += 1
    clients = [s for s in trace if s["kind"] == SPAN_KIND_CLIENT]
    for client in clients:  # one logical request, one SERVER span per attempt that reached the server
        resends = client["attributes"].get(names.ATTR_HTTP_REQUEST_RESEND_COUNT, 0)
        assert 1 <= attempts[client["span_id"]] <= 1 + resends
    calls = defaultdict(int)
    for client in clients:
        calls[(service_of(client), client["attributes"][names.ATTR_SERVER_NAME])] += 1
    assert calls == {
        ("gym/harness", "agent_0"): 1,
        ("gym/agent_0", "model_0"): MODEL_CALLS,
        ("gym/agent_0", "resources_0"): 1,
    }


def traces_by_id(spans: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        traces[span["trace_id"]].append(span)
    return traces


def assert_no_canary(out: Path, *texts: str) -> None:
    for text in texts:
        assert CANARY_SECRET not in text
    for path in out.rglob("*"):
        if path.is_file():
            assert CANARY_SECRET not in path.read_text(encoding="utf-8", errors="replace"), path


def test_rollouts_through_a_real_collector(tmp_path: Path) -> None:
    plan = write_plan(
        tmp_path / "plan.yaml",
        {
            "server": "resources",
            "route": "/verify",
            "rate": 0.25,
            "action": "raise",
            "exception": "ZeroDivisionError",
        },
        {"server": "model", "route": "/v1/responses", "rate": 0.12, "action": "disconnect"},
        {"server": "model", "route": "/v1/responses", "rate": 0.04, "action": "secret_in_error"},
    )
    out = tmp_path / "out"
    with RotelCollector(tmp_path / "rotel", grpc_port=25101, http_port=25102) as collector:
        done = run_harness(
            out,
            "--rollouts",
            "48",
            "--concurrency",
            "8",
            "--faults",
            str(plan),
            "--seed",
            "11",
            "--otlp-endpoint",
            collector.http_endpoint,
            "--port-base",
            "25300",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        rows = read_rows(out)
        summary = json.loads((out / "latest" / "summary.json").read_text())
        wanted = {r["trace_id"] for r in rows if r["outcome"] == names.ROLLOUT_OUTCOME_COMPLETED}

        def complete(got: list[dict[str, Any]]) -> bool:
            services: dict[str, set[str]] = defaultdict(set)
            for span in got:
                services[span["trace_id"]].add(service_of(span))
            return all(services[trace_id] == SERVICES for trace_id in wanted)

        collector.wait_for_spans(complete)
        time.sleep(0.5)  # let the collector's processor finish any batch it is still writing
        spans = collector.spans()
        metrics = collector.wait_for(
            collector.metrics, lambda got: any(m["name"] == names.METRIC_ROLLOUTS for m in got)
        )
        recorded = collector.raw_text()

    assert len(rows) == 48 and summary["rollouts"] == 48
    injected = summary["faults_injected"]
    successes = [r for r in rows if r["outcome"] == names.ROLLOUT_OUTCOME_COMPLETED]
    assert successes and all(r["trace_id"] for r in rows)

    # every completed rollout is one trace across driver, agent, model and resources
    traces = traces_by_id(spans)
    for row in successes:
        check_rollout_trace(traces[row["trace_id"]], row["rollout_id"])

    # retried requests carry http.request.resend_count, one failed-attempt event per resend
    assert injected["model_0"]["disconnect"] > 0
    resent = [
        s
        for s in spans
        if s["kind"] == SPAN_KIND_CLIENT and s["attributes"].get(names.ATTR_HTTP_REQUEST_RESEND_COUNT)
    ]
    assert resent
    children: dict[str, int] = defaultdict(int)
    for span in spans:
        children[span["parent_span_id"]] += 1
    for span in resent:
        count = span["attributes"][names.ATTR_HTTP_REQUEST_RESEND_COUNT]
        failed = [e for e in span["events"] if e["name"] == names.SPAN_EVENT_ATTEMPT_FAILED]
        # one event per resent attempt; one more only when the last attempt failed too (retries spent),
        # which makes the span an error
        assert len(failed) == count or (len(failed) == count + 1 and span["status_code"] == 2), span
        assert children[span["span_id"]] == count + 1  # every attempt reached the server

    # injected failures reach the rows with the right root cause, boundary and foreign cause
    verifier = [r for r in rows if r.get("root_cause", {}).get("kind") == "verifier_error"]
    assert len(verifier) == injected["resources_0"]["raise"] > 0
    for row in verifier:
        assert row["outcome"] == names.ROLLOUT_OUTCOME_FAILED
        assert row["root_cause"]["boundary"] == "resources_server"
        assert row["root_cause"]["foreign_cause"] == "ZeroDivisionError"
        report = read_report_from_row(row)
        assert report is not None and report.failure_id == row["_ng_failure_id"]
        records = list(report.events.values())
        assert any(r["failure_kind"] is None and r["exception_type"] == "ZeroDivisionError" for r in records)
        assert {r.get("trace_id") for r in records if r["failure_kind"]} == {row["trace_id"]}
    leaked = [r for r in rows if r.get("root_cause", {}).get("kind") == "provider_unavailable"]
    # parallel fan-out calls of one rollout may both be hit; the rollout fails once
    assert 0 < len(leaked) <= injected["model_0"]["secret_in_error"]
    assert all(r["root_cause"]["boundary"] == "model" for r in leaked)

    # the collector also got the metrics, with low-cardinality labels
    outcomes = {
        m["attributes"].get(names.ATTR_ROLLOUT_OUTCOME) for m in metrics if m["name"] == names.METRIC_ROLLOUTS
    }
    assert outcomes == {names.ROLLOUT_OUTCOME_COMPLETED, names.ROLLOUT_OUTCOME_FAILED}
    kinds = {
        m["attributes"].get(names.ATTR_FAILURE_KIND)
        for m in metrics
        if m["name"] == names.METRIC_FAILURE_EVENTS
    }
    assert "verifier_error" in kinds

    # the canary secret appears in no span, metric, log line or row
    assert_no_canary(out, recorded, done.stdout, done.stderr)


def test_collector_outage_completes_the_run(tmp_path: Path) -> None:
    plan = write_plan(
        tmp_path / "plan.yaml",
        {"server": "resources", "route": "/verify", "rate": 0.2, "action": "raise", "exception": "KeyError"},
    )
    out = tmp_path / "out"
    started = time.monotonic()
    done = run_harness(
        out,
        "--rollouts",
        "60",
        "--concurrency",
        "8",
        "--faults",
        str(plan),
        "--seed",
        "5",
        "--otlp-endpoint",
        "http://127.0.0.1:25109",
        "--port-base",
        "25320",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 60
    rows = read_rows(out)
    summary = json.loads((out / "latest" / "summary.json").read_text())
    failed = [r for r in rows if r["outcome"] != names.ROLLOUT_OUTCOME_COMPLETED]
    # every rollout without an injected fault completed
    assert len(rows) == 60
    assert len(failed) == summary["faults_injected"]["resources_0"]["raise"]
    assert all(r["root_cause"]["foreign_cause"] == "KeyError" for r in failed)
    # each process logged the export problem once (per signal), not once per batch
    for process in ("harness", "agent_0", "model_0", "resources_0"):
        log = (out / "latest" / "logs" / f"{process}.log").read_text()
        span_problems = [line for line in log.splitlines() if "span export to" in line and "failed" in line]
        metric_problems = [
            line for line in log.splitlines() if "metric export to" in line and "failed" in line
        ]
        assert len(span_problems) == 1, (process, span_problems)
        assert len(metric_problems) <= 1, (process, metric_problems)
    # and stayed within memory bounds (bounded queues: nothing piles up while the collector is down)
    for process, info in summary["processes"].items():
        assert info["peak_rss_mb"] is not None and info["peak_rss_mb"] < 300, (process, info)


def test_embedded_default_with_every_fault(tmp_path: Path) -> None:
    plan = write_plan(
        tmp_path / "plan.yaml",
        {"server": "model", "route": "/v1/responses", "rate": 0.03, "action": "hang"},
        {"server": "model", "route": "/v1/responses", "rate": 0.03, "action": "huge_body"},
        {"server": "model", "route": "/v1/responses", "rate": 0.03, "action": "bad_failure_report"},
        {"server": "model", "route": "/v1/responses", "rate": 0.05, "action": "disconnect_mid_body"},
        {"server": "model", "route": "/v1/responses", "rate": 0.03, "action": "status", "status": 429},
        {"server": "agent", "route": "/run", "rate": 0.05, "action": "disconnect"},
        {"server": "agent_0", "route": "/run", "rate": 0.1, "action": "delay", "seconds": 0.05},
        {"server": "resources", "route": "/verify", "rate": 0.2, "action": "raise", "exception": "OSError"},
    )
    out = tmp_path / "out"
    done = run_harness(
        out,
        "--rollouts",
        "80",
        "--concurrency",
        "16",
        "--faults",
        str(plan),
        "--seed",
        "3",
        "--request-timeout",
        "0.5",
        "--port-base",
        "25340",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(out)
    summary = json.loads((out / "latest" / "summary.json").read_text())
    assert len(rows) == 80
    injected = summary["faults_injected"]
    assert set(injected["model_0"]) >= {"huge_body", "bad_failure_report", "disconnect_mid_body", "status"}

    # embedded default: every process wrote OTLP JSON lines; the traces are complete
    files = sorted(p.name for p in (out / "latest" / "telemetry").iterdir())
    for service in ("harness", "agent_0", "model_0", "resources_0"):
        assert any(f.startswith(f"gym_{service}-") and f.endswith(".traces.jsonl") for f in files), files
        assert any(f.startswith(f"gym_{service}-") and f.endswith(".metrics.jsonl") for f in files), files
    spans = list(iter_spans(out / "latest" / "telemetry"))
    traces = traces_by_id(spans)
    successes = [r for r in rows if r["outcome"] == names.ROLLOUT_OUTCOME_COMPLETED]
    assert successes
    for row in successes:
        check_rollout_trace(traces[row["trace_id"]], row["rollout_id"])

    # failures are typed, bounded and keep the original HTTP error when a report is bad
    for row in rows:
        if row["outcome"] == names.ROLLOUT_OUTCOME_FAILED:
            assert row["root_cause"]["kind"] in FAILURE_KINDS
            assert len(json.dumps(row)) < 64 * 1024  # a 4 MB error body never reaches a row whole
    kinds = {r["root_cause"]["kind"] for r in rows if "root_cause" in r}
    assert "provider_unavailable" in kinds  # huge body / bad report: the HTTP 500 survives
    assert "provider_quota_exhausted" in kinds  # 429
    assert "verifier_error" in kinds
    retries = summary["retries"]["by_reason"]
    assert retries.get("server_disconnected", 0) >= injected["model_0"]["disconnect_mid_body"]
    if injected["model_0"].get("hang"):
        assert retries.get("timeout", 0) > 0
    # the driver resent /run after the agent dropped the connection
    driver_resends = [
        s
        for s in spans
        if s["kind"] == SPAN_KIND_CLIENT
        and service_of(s) == "gym/harness"
        and s["attributes"].get(names.ATTR_HTTP_REQUEST_RESEND_COUNT)
    ]
    assert len(driver_resends) >= 1 or not injected.get("agent_0", {}).get("disconnect")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return response.read().decode()


def test_prometheus_endpoints_per_process(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    command = [
        sys.executable,
        "-m",
        "gym_obs.cli",
        "harness",
        "run",
        "--out",
        str(out),
        "--rollouts",
        "200",
        "--concurrency",
        "4",
        "--model-latency-ms",
        "25",
        "--latency-distribution",
        "constant",
        "--port-base",
        "25360",
        "--prometheus-port-base",
        "25400",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        targets_path = out / "latest" / "prometheus_targets.json"
        deadline = time.monotonic() + 30
        while not targets_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        targets = json.loads(targets_path.read_text())
        jobs = {group["labels"]["job"]: int(group["targets"][0].rsplit(":", 1)[1]) for group in targets}
        assert set(jobs) == SERVICES
        assert sorted(jobs.values()) == [25400, 25401, 25402, 25403]
        scraped: dict[str, str] = {}
        deadline = time.monotonic() + 30
        while len(scraped) < len(jobs) and time.monotonic() < deadline:
            for job, port in jobs.items():
                try:
                    text = _scrape(port)
                except OSError:
                    continue
                if "http_client_request_duration" in text or "http_server_request_duration" in text:
                    scraped[job] = text
            time.sleep(0.2)
        assert set(scraped) == SERVICES
        for job, text in scraped.items():
            # the resource (service.name) is exposed, so a scrape config can set job = service.name
            assert f'service_name="{job}"' in text, job
        assert "http_client_request_duration_seconds_bucket" in scraped["gym/agent_0"]
        assert "http_server_request_duration_seconds_bucket" in scraped["gym/model_0"]
    finally:
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-3000:]


@pytest.mark.parametrize(("stream", "port_base"), [(False, 16900), (True, 16950)], ids=["json", "sse"])
def test_row_token_totals_are_what_the_model_servers_reported(
    tmp_path: Path, stream: bool, port_base: int
) -> None:
    """The agents' per-rollout tallies (rows, summary, the gym.rollout span), fed by the client's model-call
    observation, add up to the tokens the model servers' model-call layer read off the same replies; each
    model call's CLIENT span carries what its SERVER span got; streamed calls also have first-token times."""
    out = tmp_path / "out"
    args = ["--rollouts", "12", "--concurrency", "4", "--seed", "5", "--port-base", str(port_base)]
    done = run_harness(out, *args, *(["--stream"] if stream else []))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(out)
    summary = json.loads((out / "latest" / "summary.json").read_text())
    assert len(rows) == 12 and all(r["outcome"] == names.ROLLOUT_OUTCOME_COMPLETED for r in rows)
    assert all(r["model_calls"] == MODEL_CALLS for r in rows)
    assert all(r["input_tokens"] > 0 and r["output_tokens"] > 0 for r in rows)
    assert all(0 < r["model_time_s"] <= r["duration_s"] and r["other_time_s"] >= 0 for r in rows)
    if stream:
        assert all(0 < r["ttft_p50_s"] <= r["ttft_p99_s"] <= r["model_time_s"] for r in rows)
    else:
        assert all(r["ttft_p50_s"] is None for r in rows)

    totals = read_metric_totals(out / "latest" / "telemetry")
    reported = {
        token_type: hist.total
        for token_type, hist in totals.histogram_by(
            names.METRIC_GEN_AI_SERVER_TOKEN_USAGE, lambda a: a.get(names.ATTR_GEN_AI_TOKEN_TYPE)
        ).items()
    }
    row_input = sum(r["input_tokens"] for r in rows)
    row_output = sum(r["output_tokens"] for r in rows)
    assert reported[names.GEN_AI_TOKEN_INPUT] == row_input
    assert reported[names.GEN_AI_TOKEN_OUTPUT] == row_output
    model = summary["model_calls"]
    assert (model["input_tokens"], model["output_tokens"]) == (row_input, row_output)
    assert model["model_calls"] == 12 * MODEL_CALLS and model["rollouts_reporting"] == 12
    assert (model["ttft_p50_s"]["count"] > 0) is stream

    # each model call's CLIENT span (the agent's view) carries the usage its model's SERVER span read, and
    # the agent's gen_ai.client.token.usage adds up to the same totals
    every = list(iter_spans(out / "latest" / "telemetry"))
    served = {
        s["parent_span_id"]: s["attributes"]
        for s in every
        if s["kind"] == SPAN_KIND_SERVER and str(s["service"]).startswith("gym/model")
    }
    calls = [
        s
        for s in every
        if s["kind"] == SPAN_KIND_CLIENT and names.ATTR_GEN_AI_OPERATION_NAME in s["attributes"]
    ]
    assert len(calls) == 12 * MODEL_CALLS and all(str(s["service"]).startswith("gym/agent") for s in calls)
    for call in calls:
        mine, theirs = call["attributes"], served[call["span_id"]]
        for key in (
            names.ATTR_GEN_AI_USAGE_INPUT_TOKENS,
            names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS,
            names.ATTR_GEN_AI_RESPONSE_ID,
            names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS,
        ):
            assert mine[key] == theirs[key], key
        assert mine[names.ATTR_GEN_AI_STREAMED] is stream and mine[names.ATTR_GEN_AI_OUTCOME] == "ok"
        first = [e for e in call["events"] if e["name"] == names.SPAN_EVENT_GEN_AI_FIRST_TOKEN]
        assert len(first) == int(stream)
    client_tokens = {
        token_type: hist.total
        for token_type, hist in totals.histogram_by(
            names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE, lambda a: a.get(names.ATTR_GEN_AI_TOKEN_TYPE)
        ).items()
    }
    assert client_tokens == reported

    # the agent's gym.rollout span carries the same totals; the rollouts metric is the agent's, by outcome
    spans = [s for s in every if s["name"] == names.SPAN_ROLLOUT]
    by_rollout = {s["attributes"][names.ATTR_ROLLOUT_ID]: s["attributes"] for s in spans}
    for row in rows:
        attributes = by_rollout[row["rollout_id"]]
        assert attributes[names.ATTR_ROLLOUT_OUTCOME] == names.ROLLOUT_OUTCOME_COMPLETED
        assert attributes[names.ATTR_ROLLOUT_INPUT_TOKENS] == row["input_tokens"]
        assert attributes[names.ATTR_ROLLOUT_OUTPUT_TOKENS] == row["output_tokens"]
        assert attributes[names.ATTR_ROLLOUT_MODEL_CALLS] == MODEL_CALLS
    outcomes = totals.sum_by(names.METRIC_ROLLOUTS, lambda a: a.get(names.ATTR_ROLLOUT_OUTCOME))
    assert outcomes == {names.ROLLOUT_OUTCOME_COMPLETED: 12.0}
    durations = totals.histogram_by(
        names.METRIC_ROLLOUT_DURATION, lambda a: a.get(names.ATTR_ROLLOUT_OUTCOME)
    )
    assert durations[names.ROLLOUT_OUTCOME_COMPLETED].count == 12
