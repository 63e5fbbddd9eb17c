"""``gym-obs report``: one self-contained HTML file from a run folder (a harness run or a file-sink folder).

Reading streams: the rows once (aggregates plus a bounded sample of rollouts), then the trace files once
for the sampled traces only, then each process's last metric snapshot. ``write_report`` is what the harness
calls at the end of a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gym_obs.harness.report.links import DEFAULT_GRAFANA_URL, trace_anchor
from gym_obs.harness.report.model import Rollout, RolloutStats, metric_view
from gym_obs.harness.report.page import SECTION_IDS, ReportData, render_page
from gym_obs.harness.report.reading import (
    ROWS_FILE,
    Skipped,
    Span,
    count_metric_lines,
    has_telemetry_files,
    iter_rows,
    iter_spans,
    resolve_run_dir,
    telemetry_dir,
)
from gym_obs.harness.telemetry_files import read_metric_totals
from gym_obs.telemetry import names

__all__ = [
    "REPORT_FILE",
    "SECTION_IDS",
    "ReportError",
    "build_report",
    "read_run_summary",
    "render_page",
    "rollout_from_span",
    "trace_anchor",
    "write_report",
]

REPORT_FILE = "report.html"
SUMMARY_FILE = "summary.json"


class ReportError(Exception):
    """The folder cannot give a report (not a directory, nothing gym_obs wrote in it)."""


def read_run_summary(run_dir: Path) -> dict[str, Any]:
    """``summary.json`` if the folder has a valid one, else ``{}`` (the report works without it)."""
    try:
        loaded = orjson.loads((run_dir / SUMMARY_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def rollout_from_span(span: Span) -> Rollout:
    """A rollout seen only as its ``gym.harness.rollout`` span (a folder without ``rollouts.jsonl``)."""
    outcome = span.attributes.get(names.ATTR_ROLLOUT_OUTCOME)
    if not isinstance(outcome, str):
        outcome = names.ROLLOUT_OUTCOME_FAILED if span.is_error else names.ROLLOUT_OUTCOME_COMPLETED
    return Rollout(
        rollout_id=str(span.attributes.get(names.ATTR_ROLLOUT_ID, span.span_id)),
        trace_id=span.trace_id.lower() or None,
        outcome=outcome,
        duration_s=span.duration_s,
        started_at=span.start_ns / 1e9 if span.start_ns else None,
        error=span.status_message or None,
        chain=None,
    )


def _collect_rollouts(run_dir: Path, tel_dir: Path, skipped: Skipped) -> tuple[RolloutStats, str]:
    stats = RolloutStats()
    if (run_dir / ROWS_FILE).is_file():
        for row in iter_rows(run_dir, skipped):
            stats.add(Rollout.from_row(row, validate=False))
        return stats, ROWS_FILE
    for span in iter_spans(tel_dir, skipped):
        if span.name == names.SPAN_HARNESS_ROLLOUT:
            stats.add(rollout_from_span(span))
    return stats, f"{names.SPAN_HARNESS_ROLLOUT} spans (no {ROWS_FILE} in this folder)"


def build_report(run_dir: str | Path, *, grafana_url: str = DEFAULT_GRAFANA_URL) -> ReportData:
    """Read ``run_dir`` and gather what the page shows; raises ``ReportError`` only for an unusable folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"not a directory: {run_dir}")
    run_dir = resolve_run_dir(run_dir)
    tel_dir = telemetry_dir(run_dir)
    summary = read_run_summary(run_dir)
    run_id = summary.get("run_id") if isinstance(summary.get("run_id"), str) else None
    skipped = Skipped()
    # a rows file is read (and its skips counted) once; a spans-only folder reads its traces twice
    rows_skipped = Skipped() if (run_dir / ROWS_FILE).is_file() else skipped
    stats, source = _collect_rollouts(run_dir, tel_dir, rows_skipped)
    has_telemetry = has_telemetry_files(tel_dir)
    if not stats.total and not has_telemetry and not (run_dir / ROWS_FILE).is_file():
        raise ReportError(f"{run_dir} holds no {ROWS_FILE} and no telemetry *.jsonl files")
    slowest, failed = stats.slowest(), stats.failed_samples()
    wanted = {r.trace_id for r in (*slowest, *failed) if r.trace_id}
    traces: dict[str, list[Span]] = {}
    if wanted and has_telemetry:
        trace_skips = Skipped()
        for span in iter_spans(tel_dir, trace_skips, wanted):
            traces.setdefault(span.trace_id.lower(), []).append(span)
        if rows_skipped is not skipped:
            for name, count in (*rows_skipped.lines.items(), *trace_skips.lines.items()):
                skipped.lines[name] = skipped.lines.get(name, 0) + count
    elif rows_skipped is not skipped:
        skipped.lines.update(rows_skipped.lines)
    count_metric_lines(tel_dir, skipped)
    totals = read_metric_totals(tel_dir, run_id=run_id)
    wall = summary.get("wall_seconds")
    notes = []
    if stats.invalid_reports:
        notes.append(f"{stats.invalid_reports} failed rollouts carry no valid failure report (grouped apart)")
    otlp = (
        (summary.get("telemetry") or {}).get("otlp_endpoint")
        if isinstance(summary.get("telemetry"), dict)
        else None
    )
    if otlp and not has_telemetry:
        notes.append("spans and metrics were sent to an OTLP endpoint: open the traces in Grafana (Tempo)")
    return ReportData(
        run_dir=run_dir,
        title=f"gym-obs run {run_id}" if run_id else f"gym-obs run report: {run_dir.name}",
        run_id=run_id,
        source=source,
        stats=stats,
        metrics=metric_view(totals) if totals.processes else None,
        traces=traces,
        slowest=slowest,
        failed=failed,
        skipped=skipped,
        wall_seconds=float(wall) if isinstance(wall, (int, float)) and wall > 0 else _span_of(stats),
        notes=notes,
        grafana_url=grafana_url if otlp and not has_telemetry else None,
    )


def _span_of(stats: RolloutStats) -> float | None:
    if not stats.ends:
        return None
    starts = [end - d for (end, _), d in zip(stats.ends, stats.durations, strict=False)]
    span = max(end for end, _ in stats.ends) - min(starts)
    return span if span > 0 else None


def write_report(
    run_dir: str | Path, out: str | Path | None = None, *, grafana_url: str = DEFAULT_GRAFANA_URL
) -> Path:
    """Write ``OUT/report.html`` (default: inside ``run_dir``) and return its path."""
    data = build_report(run_dir, grafana_url=grafana_url)
    out_dir = Path(out) if out is not None else data.run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT_FILE
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render_page(data), encoding="utf-8")
    tmp.replace(path)
    return path
