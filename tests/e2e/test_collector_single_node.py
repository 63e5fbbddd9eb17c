"""The single-node stack's data path, end to end through the real collector.

Real processes on loopback: ``gym-obs harness run`` exporting OTLP (spans and metrics) to ``otelcol-gym``
running ``collector/otel-collector.yaml`` itself (only addresses moved with ``--set``), Debian's
Prometheus scraping the collector's prometheus exporter with the ``gym-otel-export`` job of
``collector/prometheus.yml`` (``honor_labels``), and Jaeger v2 as the trace store behind the collector's
``otlp/tempo`` exporter. Prometheus is fed ONLY through the collector. Then:

- every panel and variable query of every dashboard (the real-data checker) has finite, non-empty data,
  and ``job`` is ``service.name`` on every gym series;
- a failed rollout's trace (id from ``rollouts.jsonl``) is whole in Jaeger: every process, every parent,
  every CLIENT span with its SERVER child in another process;
- a span from a non-gym client with a query string in ``url.full`` / ``url.query`` arrives without it;
- the exemplars the collector exposes carry trace ids that resolve in Jaeger.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gym_obs import dashboards
from gym_obs.telemetry import names
from tests.e2e.collector_stack import (
    COLLECTOR_DIR,
    Jaeger,
    Process,
    http_get,
    post_json,
    run_collector,
    run_jaeger,
    run_prometheus_with,
    telemetry_port_override,
    trace_problems,
    wait_until,
)
from tests.e2e.promql_check import PrometheusAPI, QueryWindow, check_dashboards, load_dashboards
from tests.e2e.test_dashboards_real_data import (
    FAULTS,
    ROLLOUTS,
    RUN_ARGS,
    SERVICES,
    _final_totals,
    _stop_harness,
    _summary_totals,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
OTLP_GRPC, OTLP_HTTP, EXPORTER, COLLECTOR_TELEMETRY, COLLECTOR_HEALTH = 30001, 30002, 30003, 30004, 30005
JAEGER_PORTS = (30010, 30011, 30012, 30013)  # OTLP gRPC, query HTTP, query gRPC, health
PROMETHEUS_LISTEN = "127.0.0.1:30020"
HARNESS_PORT_BASE = 30030
SCRAPE_INTERVAL_S = 1.0  # the shipped 5 s would make the run five times longer; every other setting is kept
CANARY = "gym-canary-9f3b1c"


def collector_overrides() -> dict[str, Any]:
    """``collector/otel-collector.yaml`` with only its addresses moved onto loopback test ports."""
    return {
        "receivers::otlp::protocols::grpc::endpoint": f"127.0.0.1:{OTLP_GRPC}",
        "receivers::otlp::protocols::http::endpoint": f"127.0.0.1:{OTLP_HTTP}",
        "exporters::otlp/tempo::endpoint": f"127.0.0.1:{JAEGER_PORTS[0]}",
        "exporters::prometheus::endpoint": f"127.0.0.1:{EXPORTER}",
        **telemetry_port_override(COLLECTOR_TELEMETRY),
    }


def prometheus_config() -> dict[str, Any]:
    """The shipped scrape job of the collector's exporter, pointed at the test collector."""
    shipped = yaml.safe_load((COLLECTOR_DIR / "prometheus.yml").read_text())
    job = next(job for job in shipped["scrape_configs"] if job["job_name"] == "gym-otel-export")
    assert job["honor_labels"] is True
    job = {**job, "static_configs": [{"targets": [f"127.0.0.1:{EXPORTER}"]}]}
    interval = f"{SCRAPE_INTERVAL_S:g}s"
    scrape_global = {**shipped["global"], "scrape_interval": interval, "scrape_timeout": interval}
    return {"global": scrape_global, "storage": shipped["storage"], "scrape_configs": [job]}


@dataclass
class Stack:
    prometheus: str
    jaeger: Jaeger
    collector: Process
    out: Path
    started: float
    final: dict[str, dict[str, float]]

    def window(self) -> QueryWindow:
        return QueryWindow(start=self.started, end=time.time(), scrape_interval_s=SCRAPE_INTERVAL_S)

    def rows(self) -> list[dict[str, Any]]:
        rows = (self.out / "latest" / "rollouts.jsonl").read_text().splitlines()  # the run's own folder
        return [json.loads(line) for line in rows]


def _scalar(api: PrometheusAPI, expr: str) -> float:
    result = api.query(expr, at=time.time())["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _harness(work: Path, out: Path) -> subprocess.Popen[bytes]:
    plan = work / "faults.yaml"
    plan.write_text(json.dumps({"faults": FAULTS}))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    command = [
        sys.executable,
        "-m",
        "gym_obs.cli",
        "harness",
        "run",
        "--out",
        str(out),
        "--faults",
        str(plan),
        f"--port-base={HARNESS_PORT_BASE}",
        f"--otlp-endpoint=http://127.0.0.1:{OTLP_HTTP}",
        *RUN_ARGS,
    ]
    with (work / "harness.stdout").open("wb") as stdout, (work / "harness.stderr").open("wb") as stderr:
        return subprocess.Popen(command, cwd=work, env=env, stdout=stdout, stderr=stderr)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("collector-single-node")
    out = work / "run"
    with (
        run_jaeger("jaeger", work, JAEGER_PORTS) as jaeger,
        run_collector(
            "otelcol", "otel-collector.yaml", work, COLLECTOR_HEALTH, collector_overrides()
        ) as collector,
        run_prometheus_with(
            prometheus_config(), work, PROMETHEUS_LISTEN, ["--enable-feature=exemplar-storage"]
        ) as prometheus,
    ):
        api = PrometheusAPI(prometheus)
        started = time.time()
        harness = _harness(work, out)
        try:
            rollouts = dashboards.ROLLOUTS.series()
            wait_until(
                f"{ROLLOUTS} finished rollouts in Prometheus (through the collector)",
                lambda: harness.poll() is None and _scalar(api, f"sum({rollouts})") >= ROLLOUTS,
                timeout_s=150,
                watch=[collector],
            )
            # Every process exports every 5 s while the harness lingers: wait for two more scrapes after
            # one full export interval, so the final values of every process are in Prometheus.
            settled = time.time() + 6
            wait_until(
                "two scrapes after the final export",
                lambda: (
                    _scalar(api, 'min(timestamp(up{job="gym-otel-export"}))') > settled + SCRAPE_INTERVAL_S
                ),
                timeout_s=30,
                watch=[collector],
            )
            final = _final_totals(api)
            yield Stack(prometheus, jaeger, collector, out, started, final)
        finally:
            returncode = _stop_harness(harness)
    assert returncode == 0, (work / "harness.stderr").read_text()[-3000:]
    summary = json.loads((out / "latest" / "summary.json").read_text())
    assert summary["rollouts"] == ROLLOUTS
    assert _summary_totals(summary) == final  # nothing lost or doubled on the way through the collector


# --- metrics ------------------------------------------------------------------------------------------------


def test_every_panel_and_variable_query_has_data_through_the_collector(stack: Stack) -> None:
    boards = load_dashboards(ROOT / "dashboards")
    report = check_dashboards(stack.prometheus, boards, stack.window())
    assert report.ok, report.summary()
    assert len(report.checked) >= 30


def test_job_is_service_name_on_every_gym_series(stack: Stack) -> None:
    api = PrometheusAPI(stack.prometheus)
    jobs = api.query('count by (job) ({__name__=~"gym_.+|http_.+|target_info"})', at=time.time())["result"]
    assert {series["metric"]["job"] for series in jobs} == SERVICES
    instances = api.query("count by (job, instance) (target_info)", at=time.time())["result"]
    assert len(instances) == len(SERVICES)  # instance = service.instance.id, one per process
    assert all(series["metric"]["instance"] != f"127.0.0.1:{EXPORTER}" for series in instances)


# --- traces -------------------------------------------------------------------------------------------------


def _whole_trace(jaeger: Jaeger, trace_id: str, services: set[str]) -> list[str]:
    """Poll until the trace is whole in Jaeger (batches arrive over a few seconds); return its problems."""
    problems: list[str] = ["not found"]

    def whole() -> bool:
        nonlocal problems
        spans = jaeger.trace(trace_id)
        problems = trace_problems(spans, services) if spans else ["not found"]
        return not problems

    with contextlib.suppress(TimeoutError):  # the problems say what is missing
        wait_until(f"trace {trace_id} whole in Jaeger", whole, timeout_s=20)
    return problems


def test_a_failed_rollouts_trace_is_whole_in_the_trace_store(stack: Stack) -> None:
    failed = [row for row in stack.rows() if row["outcome"] == names.ROLLOUT_OUTCOME_FAILED]
    assert failed, "the fault plan failed no rollout"
    # A verifier error reached every server (a dropped connection may end a call before any SERVER span).
    failed = [row for row in failed if row.get("root_cause", {}).get("kind") == "verifier_error"] or failed
    for row in failed[:3]:
        assert _whole_trace(stack.jaeger, row["trace_id"], SERVICES) == [], row
        spans = stack.jaeger.trace(row["trace_id"]) or []
        assert any(span.error for span in spans), "a failed rollout's trace has an error span"
        assert [span.name for span in spans if span.parent_id is None] == [names.SPAN_HARNESS_ROLLOUT]


def test_redaction_backstop_strips_query_strings_from_a_non_gym_client(stack: Stack) -> None:
    """Raw OTLP/JSON, as any other instrumentation would send it: the collector must strip the secret."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    now = time.time_ns()
    url = f"https://api.example.test/v1/items?token={CANARY}#frag-{CANARY}"
    attributes = [
        {"key": "url.full", "value": {"stringValue": url}},
        {"key": "url.query", "value": {"stringValue": f"token={CANARY}"}},
        {"key": "http.url", "value": {"stringValue": url}},
        {"key": "http.request.method", "value": {"stringValue": "GET"}},
    ]
    payload = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "not-gym"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "someone-elses-instrumentation"},
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": span_id,
                                "name": "GET",
                                "kind": 3,
                                "startTimeUnixNano": str(now - 1_000_000),
                                "endTimeUnixNano": str(now),
                                "attributes": attributes,
                                "events": [
                                    {
                                        "name": "redirect",
                                        "timeUnixNano": str(now),
                                        "attributes": [{"key": "url.full", "value": {"stringValue": url}}],
                                    }
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    assert post_json(f"http://127.0.0.1:{OTLP_HTTP}/v1/traces", payload) == 200
    wait_until("the non-gym span in Jaeger", lambda: stack.jaeger.trace(trace_id) is not None, timeout_s=20)
    status, body = http_get(f"{stack.jaeger.url}/api/traces/{trace_id}")
    assert status == 200
    assert CANARY not in body.decode()
    (span,) = stack.jaeger.trace(trace_id) or []
    assert span.tags["url.full"] == "https://api.example.test/v1/items"
    assert span.tags["http.url"] == "https://api.example.test/v1/items"
    assert "url.query" not in span.tags
    assert span.tags["http.request.method"] == "GET"  # the backstop removes only what it must


def test_exemplars_carry_trace_ids_that_resolve_in_the_trace_store(stack: Stack) -> None:
    api = PrometheusAPI(stack.prometheus)
    window = stack.window()
    series = dashboards.SERVER_REQUEST_DURATION.series("_bucket")
    found = api.call(
        "/api/v1/query_exemplars",
        [("query", series), ("start", str(window.start)), ("end", str(window.end))],
        post=False,
    )
    trace_ids = {
        exemplar["labels"]["trace_id"]
        for group in found
        for exemplar in group["exemplars"]
        if "trace_id" in exemplar["labels"]
    }
    assert len(trace_ids) >= 3, found
    rollout_traces = {row["trace_id"] for row in stack.rows()}
    for trace_id in sorted(trace_ids)[:5]:
        wait_until(
            f"exemplar trace {trace_id} in Jaeger",
            lambda t=trace_id: stack.jaeger.trace(t) is not None,
            timeout_s=20,
        )
    assert trace_ids & rollout_traces  # the exemplars point into this run's rollouts
