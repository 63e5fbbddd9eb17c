"""Rows, root causes, quantiles and the summary (JSON and tables from the same dict)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import aiohttp
import pytest
from rich.console import Console

from gym_obs.failures import NgFailureEvent, read_report_from_row
from gym_obs.harness.rows import RolloutResult, RowWriter
from gym_obs.harness.servers._common import failure_for_call
from gym_obs.harness.servers.model import LatencySpec
from gym_obs.harness.stats import bucket_quantile, quantile, quantiles
from gym_obs.harness.summary import build_summary, render_summary, write_summary
from gym_obs.harness.telemetry_files import MetricTotals
from gym_obs.telemetry import names


def _verifier_failure() -> NgFailureEvent:
    try:
        try:
            try:
                1 / 0  # noqa: B018
            except ZeroDivisionError as err:
                raise NgFailureEvent(
                    "verifier_error", "boom", boundary="resources_server", stage="verification"
                ) from err
        except NgFailureEvent as err:
            raise NgFailureEvent("agent_request_failed", "verify failed", boundary="agent") from err
    except NgFailureEvent as final:
        return final


def _result(index: int, **fields: object) -> RolloutResult:
    base: dict[str, object] = {
        "index": index,
        "rollout_id": f"r-{index}",
        "agent": "agent_0",
        "started_at": 0.0,
        "duration_s": 0.01 * (index + 1),
        "trace_id": f"{index:032x}",
    }
    base.update(fields)
    return RolloutResult(**base)  # type: ignore[arg-type]


def test_failed_row_stores_the_report_and_its_root_cause(tmp_path: Path) -> None:
    failed = RolloutResult.failed(
        _verifier_failure(),
        **{
            "index": 0,
            "rollout_id": "r-0",
            "agent": "agent_0",
            "started_at": 0.0,
            "duration_s": 0.5,
        },
    )
    assert failed.root is not None
    assert (failed.root.kind, failed.root.boundary, failed.root.foreign_type) == (
        "verifier_error",
        "resources_server",
        "ZeroDivisionError",
    )
    assert (failed.root.final_kind, failed.root.final_boundary) == ("agent_request_failed", "agent")
    ok = _result(1, outcome="completed", reward=1.0)
    with RowWriter(tmp_path / "rows.jsonl") as writer:
        writer.write(failed)
        writer.write(ok)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    report = read_report_from_row(rows[0])
    assert report is not None and report.final_record is not None
    assert report.final_record["failure_kind"] == "agent_request_failed"
    assert rows[0]["root_cause"]["foreign_cause"] == "ZeroDivisionError"
    assert "_ng_failure_events" not in rows[1] and rows[1]["reward"] == 1.0


def test_summary_groups_failures_and_renders(tmp_path: Path) -> None:
    results = [
        _result(i, outcome="completed", hops=[("model", 0.01), ("resources", 0.002)]) for i in range(8)
    ]
    for i in range(8, 11):
        results.append(
            RolloutResult.failed(
                _verifier_failure(),
                index=i,
                rollout_id=f"r-{i}",
                agent="agent_0",
                started_at=0.0,
                duration_s=0.2,
                trace_id="ab" * 16,
            )
        )
    summary = build_summary(
        results,
        wall_seconds=2.0,
        run={"run_id": "x", "out_dir": str(tmp_path)},
        metrics=None,
        role_of={},
        injected={"resources_0": {"raise": 3}},
    )
    assert summary["outcomes"] == {"completed": 8, "failed": 3, "omitted": 0}
    assert summary["rollouts_per_second"] == 5.5
    assert summary["failures_by_root_cause"] == [
        {
            "root_kind": "verifier_error",
            "root_boundary": "resources_server",
            "foreign_cause": "ZeroDivisionError",
            "final_kind": "agent_request_failed",
            "count": 3,
            "example_trace_id": "ab" * 16,
        }
    ]
    assert summary["hops_source"] == "in_band" and summary["hops"]["agent -> model"]["count"] == 8
    assert summary["retries"] is None  # telemetry off: unknown, not zero
    path = write_summary(summary, tmp_path)
    assert json.loads(path.read_text()) == summary
    buffer = io.StringIO()
    render_summary(summary, Console(file=buffer, width=160))
    text = buffer.getvalue()
    for needle in (
        "Failures by root cause",
        "verifier_error",
        "ZeroDivisionError",
        "Latency per hop",
        "Faults injected",
    ):
        assert needle in text


def test_summary_reads_telemetry_totals() -> None:
    totals = MetricTotals(processes=2)
    totals.sums[(names.METRIC_CLIENT_RETRIES, ((names.ATTR_RETRY_REASON, "timeout"),))] = 4
    totals.sums[(names.METRIC_CLIENT_RETRIES, ((names.ATTR_RETRY_REASON, "server_disconnected"),))] = 2
    hist_point = {
        "explicitBounds": [0.01, 0.1],
        "bucketCounts": ["1", "2", "0"],
        "count": "3",
        "sum": 0.15,
        "max": 0.09,
    }
    from gym_obs.harness.telemetry_files import HistogramTotal

    for destination in ("agent_0", "model_0"):
        hist = HistogramTotal()
        hist.add(hist_point)
        totals.histograms[
            (names.METRIC_HTTP_CLIENT_REQUEST_DURATION, ((names.ATTR_SERVER_NAME, destination),))
        ] = hist
    summary = build_summary(
        [_result(0, outcome="completed")],
        wall_seconds=1.0,
        run={},
        metrics=totals,
        role_of={"agent_0": "agent", "model_0": "model"},
        injected={},
    )
    assert summary["retries"] == {"total": 6, "by_reason": {"server_disconnected": 2, "timeout": 4}}
    assert set(summary["hops"]) == {"harness -> agent", "agent -> model"}
    assert summary["hops"]["agent -> model"]["count"] == 3
    assert summary["hops_source"].startswith("telemetry")
    assert summary["pool_waits"] == {}


def test_quantiles() -> None:
    assert quantile([], 0.5) is None
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    q = quantiles([float(v) for v in range(1, 101)])
    assert q["count"] == 100 and q["max"] == 100.0 and 99.0 <= (q["p99"] or 0) <= 100.0
    bounds, counts = [0.1, 0.2, 0.5], [0, 10, 0, 0]
    assert bucket_quantile(bounds, counts, 0.5) == pytest.approx(0.15)
    assert bucket_quantile(bounds, [0, 0, 0, 5], 0.5, high=0.9) == 0.9
    assert bucket_quantile(bounds, [0, 0, 0, 0], 0.5) is None


def test_latency_distributions_are_clamped_and_centred() -> None:
    rng = random.Random(1)
    for distribution in ("constant", "uniform", "exponential", "lognormal"):
        spec = LatencySpec(distribution=distribution, median_s=0.02, max_s=0.5)  # type: ignore[arg-type]
        samples = sorted(spec.sample(rng) for _ in range(2001))
        assert samples[0] >= 0.0 and samples[-1] <= 0.5
        assert 0.012 <= samples[1000] <= 0.03, distribution
    assert LatencySpec(median_s=0).sample(rng) == 0.0


def test_agent_classifies_failed_calls() -> None:
    def kind(err: BaseException, role: str = "model", **kw: object) -> tuple[str, str]:
        event = failure_for_call(err, role=role, stage="agent", what="call", **kw)  # type: ignore[arg-type]
        return event.failure_kind, event.boundary

    info = aiohttp.RequestInfo(
        aiohttp.client_reqrep.URL("http://x/y"),
        "POST",
        {},
    )  # type: ignore[arg-type]

    def http(status: int) -> aiohttp.ClientResponseError:
        return aiohttp.ClientResponseError(info, (), status=status)

    assert kind(http(503)) == ("provider_unavailable", "model")
    assert kind(http(429)) == ("provider_quota_exhausted", "model")
    assert kind(http(400)) == ("protocol_violation", "model")
    assert kind(http(500), role="resources") == ("environment_server_failed", "resources_server")
    assert kind(TimeoutError()) == ("transport_timeout", "model")
    assert kind(aiohttp.ServerDisconnectedError()) == ("transport_peer_drop", "model")
    assert kind(TimeoutError(), role="agent", boundary="harness") == ("agent_timeout", "harness")
    assert kind(http(502), role="agent", boundary="harness") == ("agent_run_error", "harness")
    assert kind(_verifier_failure()) == ("agent_request_failed", "agent")


def test_progress_bar_shows_done_failed_rate_and_quantiles() -> None:
    from gym_obs.harness.progress import RunProgress

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160)
    with RunProgress(4, console, enabled=True) as progress:
        for index, failed in enumerate((False, True, False, False)):
            progress.record(0.1 * (index + 1), failed=failed)
    text = buffer.getvalue()
    assert "4/4" in text and "1 failed" in text and "/s" in text
    assert "p50 250ms" in text and "p99 397ms" in text
    quiet = io.StringIO()
    with RunProgress(1, Console(file=quiet), enabled=None) as progress:  # not a terminal: silent
        progress.record(0.1, failed=False)
    assert quiet.getvalue() == ""
