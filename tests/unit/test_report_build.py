"""The HTML report from crafted run folders: hostile strings stay inert, broken lines are counted, samples
stay bounded. (The real harness run and the real browser are in tests/e2e/test_report_browser.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gym_obs.harness.report import ReportError, build_report, write_report
from gym_obs.harness.report.model import FAILED, SLOWEST, Rollout, RolloutStats
from gym_obs.telemetry import names

HOSTILE = '<script>window.__pwned=1</script>"><img src=x onerror="window.__pwned=2">'
T0 = 1_800_000_000_000_000_000


def _attrs(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, value in values.items():
        typed = {"intValue": str(value)} if isinstance(value, int) else {"stringValue": str(value)}
        out.append({"key": key, "value": typed})
    return out


def span(
    trace: str,
    span_id: str,
    parent: str,
    name: str,
    kind: int,
    start_ms: float,
    end_ms: float,
    attributes: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "traceId": trace,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(T0 + int(start_ms * 1e6)),
        "endTimeUnixNano": str(T0 + int(end_ms * 1e6)),
        "attributes": _attrs(attributes or {}),
        "events": [
            {
                "name": e["name"],
                "timeUnixNano": str(T0 + int(e["at_ms"] * 1e6)),
                "attributes": _attrs(e["attrs"]),
            }
            for e in events or ()
        ],
        "status": {"code": 2, "message": error} if error is not None else {},
    }
    return raw


def traces_line(service: str, spans: list[dict[str, Any]]) -> str:
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attrs({names.SERVICE_NAME: service})},
                "scopeSpans": [{"scope": {"name": "gym_obs"}, "spans": spans}],
            }
        ]
    }
    return json.dumps(doc)


def rollout_trace(index: int, *, failed: bool, reason: str = "HTTP 503") -> dict[str, list[dict[str, Any]]]:
    """The spans of one rollout, per service: harness rollout + CLIENT, agent SERVER + CLIENT (one retry),
    model SERVER."""
    t = f"{index:032x}"
    rid = f"run-{index:06d}"
    status = 503 if failed else 200
    err = "503" if failed else None
    base = index * 10.0
    return {
        "gym/harness": [
            span(
                t,
                f"a{index:015x}",
                "",
                names.SPAN_HARNESS_ROLLOUT,
                1,
                base,
                base + 50 + index % 7,
                {names.ATTR_ROLLOUT_ID: rid},
                error=err,
            ),
            span(
                t,
                f"b{index:015x}",
                f"a{index:015x}",
                "POST /run",
                3,
                base + 1,
                base + 49,
                {names.ATTR_SERVER_NAME: "agent_0", names.ATTR_HTTP_RESPONSE_STATUS_CODE: status},
            ),
        ],
        "gym/agent_0": [
            span(
                t,
                f"c{index:015x}",
                f"b{index:015x}",
                "POST /run",
                2,
                base + 2,
                base + 48,
                {names.ATTR_HTTP_ROUTE: "/run"},
                error=err,
            ),
            span(
                t,
                f"d{index:015x}",
                f"c{index:015x}",
                "POST /v1/responses",
                3,
                base + 3,
                base + 40,
                {
                    names.ATTR_SERVER_NAME: "model_0",
                    names.ATTR_HTTP_REQUEST_RESEND_COUNT: 1,
                    names.ATTR_HTTP_RESPONSE_STATUS_CODE: status,
                },
                events=[
                    {
                        "name": names.SPAN_EVENT_ATTEMPT_FAILED,
                        "at_ms": base + 10,
                        "attrs": {names.ATTR_ATTEMPT: 1, names.ATTR_RETRY_REASON: "server_disconnected"},
                    }
                ],
            ),
        ],
        "gym/model_0": [
            span(
                t,
                f"e{index:015x}",
                f"d{index:015x}",
                "POST /v1/responses",
                2,
                base + 12,
                base + 39,
                {names.ATTR_HTTP_ROUTE: "/v1/responses", "note": reason},
                error=err,
            ),
        ],
    }


def failure_row(index: int, reason: str, rollout_id: str | None = None) -> dict[str, Any]:
    rid = rollout_id or f"run-{index:06d}"
    final, root = f"fe_{index:024x}", f"fe_{index + 1:024x}"
    return {
        "rollout_id": rid,
        "index": index,
        "trace_id": f"{index:032x}",
        "outcome": "failed",
        "duration_s": 0.05 + (index % 7) / 1000,
        "started_at": 1_800_000_000 + index / 100,
        "agent": "agent_0",
        "error": f"model provider_unavailable (agent): {reason}",
        "_ng_failure_events": {
            final: {
                "event_id": final,
                "failure_kind": "provider_unavailable",
                "failure_reason": reason,
                "boundary": "model",
                "stage": "agent",
                "http_status": 503,
                "details": None,
                "cause_id": root,
                "trace_id": f"{index:032x}",
                "span_id": f"d{index:015x}",
                "rollout_id": rid,
                "server_name": "agent_0",
                "timestamp": 1_800_000_000.5,
            },
            root: {
                "event_id": root,
                "failure_kind": None,
                "exception_type": "ConnectionResetError",
                "failure_reason": f"peer said {reason}",
                "cause_id": None,
                "details": None,
            },
        },
        "_ng_failure_id": final,
    }


def success_row(index: int) -> dict[str, Any]:
    return {
        "rollout_id": f"run-{index:06d}",
        "index": index,
        "trace_id": f"{index:032x}",
        "outcome": "completed",
        "duration_s": 0.05 + (index % 7) / 1000,
        "started_at": 1_800_000_000 + index / 100,
        "agent": "agent_0",
        "reward": 1.0,
    }


def make_run(
    run_dir: Path, count: int, *, failed_every: int = 3, reason: str = "HTTP 503", rows: bool = True
) -> Path:
    tel = run_dir / "telemetry"
    tel.mkdir(parents=True)
    per_service: dict[str, list[dict[str, Any]]] = {}
    lines = []
    for index in range(count):
        failed = index % failed_every == 0
        lines.append(json.dumps(failure_row(index, reason) if failed else success_row(index)))
        for service, spans in rollout_trace(index, failed=failed, reason=reason).items():
            per_service.setdefault(service, []).extend(spans)
    if rows:
        (run_dir / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    for service, spans in per_service.items():
        name = service.replace("/", "_")
        batches = [spans[i : i + 200] for i in range(0, len(spans), 200)]
        (tel / f"{name}-1.traces.jsonl").write_text("".join(traces_line(service, b) + "\n" for b in batches))
    return run_dir


def test_report_has_every_section_and_a_waterfall_per_sampled_trace(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 30)
    page = write_report(run).read_text()
    for section in (
        "summary",
        "latency",
        "retries",
        "pool-waits",
        "failures",
        "slowest",
        "failed",
        "timeseries",
    ):
        assert f'<section id="{section}">' in page
    data = build_report(run)
    assert data.stats.total == 30 and data.stats.outcomes == {"failed": 10, "completed": 20}
    waterfalls = re.findall(r'id="trace-([0-9a-f]{32})" data-spans="(\d+)"', page)
    assert waterfalls, "no waterfall drawn"
    for trace_id, count in waterfalls:
        assert int(count) == 5  # harness 2 + agent 2 + model 1: every process of the trace
        block = page.split(f'id="trace-{trace_id}"')[1].split('<div class="span-detail"')[0]
        assert block.count('class="span-row"') == 5
        assert block.count('class="ev-attempt"') == 1  # the failed attempt is marked
    # one failure group (kind, boundary, stage, foreign root), with its chain drawn, root last
    assert [(g.kind, g.boundary, g.stage, g.foreign, g.count) for g in data.stats.sorted_groups()] == [
        ("provider_unavailable", "model", "agent", "ConnectionResetError", 10)
    ]
    assert page.index("provider_unavailable</span>") < page.index("ConnectionResetError</span>")


class _Tags(HTMLParser):
    """Every start tag the browser would build, with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_hostile_strings_from_the_run_are_escaped(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 6, failed_every=2, reason=HOSTILE)
    with (run / "rollouts.jsonl").open("a") as rows:
        rows.write(json.dumps({**failure_row(100, HOSTILE, rollout_id=HOSTILE), "error": HOSTILE}) + "\n")
    page = write_report(run).read_text()
    parser = _Tags()
    parser.feed(page)
    assert not [tag for tag, _ in parser.tags if tag == "img"]
    handlers = [(tag, key) for tag, attrs in parser.tags for key in attrs if key.startswith("on")]
    assert handlers == []
    scripts = [attrs.get("type") for tag, attrs in parser.tags if tag == "script"]
    assert scripts.count(None) == 1  # the page's own script; every other is a JSON data block
    assert set(scripts) == {None, "application/json"}
    assert "window.__pwned=1</script>" not in page
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page  # shown, as text


def test_truncated_and_corrupt_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 12)
    with (run / "rollouts.jsonl").open("a") as rows:
        rows.write('not json at all\n[1, 2, 3]\n{"rollout_id": "cut-')  # 3 bad lines, the last cut
    traces = run / "telemetry" / "gym_agent_0-1.traces.jsonl"
    text = traces.read_text()
    traces.write_text(text + text[: len(text) // 3])  # a batch cut mid-line by a crash
    (run / "telemetry" / "gym_agent_0-1.metrics.jsonl").write_text('{"resourceMetrics": [\n')
    data = build_report(run)
    assert data.stats.total == 12
    assert data.skipped.lines == {
        "rollouts.jsonl": 3,
        "gym_agent_0-1.traces.jsonl": 1,
        "gym_agent_0-1.metrics.jsonl": 1,
    }
    page = write_report(run).read_text()
    assert "5 lines skipped" in page and "gym_agent_0-1.traces.jsonl" in page


def test_cheap_grouping_agrees_with_the_validated_chains(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 40, failed_every=2)
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    rows.append({"rollout_id": "broken", "outcome": "failed", "_ng_failure_events": "nope"})
    stats = RolloutStats()
    for row in rows:
        stats.add(Rollout.from_row(row, validate=False))
    validated = RolloutStats()
    for row in rows:
        validated.add(Rollout.from_row(row))
    assert {k: g.count for k, g in stats.groups.items()} == {k: g.count for k, g in validated.groups.items()}
    assert stats.invalid_reports == validated.invalid_reports == 1
    assert all(r.chain for r in stats.failed_samples() if r.rollout_id != "broken")


def test_a_folder_without_rows_reports_from_rollout_spans(tmp_path: Path) -> None:
    run = make_run(tmp_path / "serve-sink", 9, rows=False)
    data = build_report(run)
    assert data.stats.total == 9
    assert data.stats.outcomes == {"failed": 3, "completed": 6}
    assert "gym.harness.rollout spans" in data.source
    assert data.traces  # the slowest are drawn


def test_samples_and_kept_spans_stay_bounded(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 600)
    data = build_report(run)
    assert len(data.slowest) == SLOWEST and len(data.failed) == FAILED
    kept = {r.trace_id for r in (*data.slowest, *data.failed)}
    assert set(data.traces) <= kept  # only the sampled traces' spans were held
    assert sum(len(s) for s in data.traces.values()) <= 5 * len(kept)
    assert [r.duration_s for r in data.slowest] == sorted((r.duration_s for r in data.slowest), reverse=True)


def test_not_a_run_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"no rollouts\.jsonl"):
        build_report(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "report", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("gym-obs report: error: not a directory")
    assert "Traceback" not in result.stderr


def test_cli_writes_to_out_and_prints_the_path(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 5)
    result = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "report", str(run), "--out", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "site" / "report.html")
    assert (tmp_path / "site" / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert not (run / "report.html").exists()


def test_a_folder_of_runs_reports_its_latest_run(tmp_path: Path) -> None:
    make_run(tmp_path / "runs" / "abc123", 4)
    (tmp_path / "runs" / "latest").symlink_to("abc123")
    path = write_report(tmp_path / "runs")
    assert path == tmp_path / "runs" / "latest" / "report.html"
    assert build_report(tmp_path / "runs").stats.total == 4


def test_rows_without_telemetry_still_give_a_report(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 6)
    for path in (run / "telemetry").iterdir():
        path.unlink()
    page = write_report(run).read_text()
    assert "no metric files in this folder" in page
    assert "no spans in this folder" in page
    assert build_report(run).stats.total == 6


def test_an_otlp_run_links_its_traces_to_grafana(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 4)
    shutil.rmtree(run / "telemetry")
    (run / "summary.json").write_text(json.dumps({"telemetry": {"otlp_endpoint": "http://127.0.0.1:4318"}}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gym_obs.cli",
            "report",
            str(run),
            "--grafana-url",
            "http://grafana.test:3000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    page = (run / "report.html").read_text()
    assert 'href="http://grafana.test:3000/explore?left=' in page
    assert "open the traces in Grafana" in page


def test_enum_names_for_kind_and_status_are_understood(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 1, failed_every=1)
    traces = run / "telemetry" / "gym_model_0-1.traces.jsonl"
    traces.write_text(
        traces.read_text()
        .replace('"kind": 2', '"kind": "SPAN_KIND_SERVER"')
        .replace('"code": 2', '"code": "STATUS_CODE_ERROR"')
    )
    spans = build_report(run).traces[f"{0:032x}"]
    model = next(s for s in spans if s.service == "gym/model_0")
    assert model.kind == 2 and model.is_error
