"""The report page: sections from a ``ReportData``, inline CSS and a few lines of JS (no network, no assets).

The JS only toggles details and fills the span panel with ``textContent``: no string from the run is ever
parsed as HTML in the browser.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from pathlib import Path

from gym_obs.harness.report.charts import bars, cause_tree, esc, fmt_s, histogram, time_series_chart
from gym_obs.harness.report.links import grafana_explore_url, trace_anchor
from gym_obs.harness.report.model import MetricView, Rollout, RolloutStats, time_series
from gym_obs.harness.report.reading import Skipped, Span
from gym_obs.harness.report.waterfall import PALETTE, render_waterfall
from gym_obs.telemetry import names

__all__ = ["SECTION_IDS", "ReportData", "render_page"]

SECTION_IDS = ("summary", "latency", "retries", "pool-waits", "failures", "slowest", "failed", "timeseries")


@dataclass
class ReportData:
    """Everything one page shows, gathered by ``build_report``."""

    run_dir: Path
    title: str
    run_id: str | None
    source: str
    stats: RolloutStats
    metrics: MetricView | None
    traces: dict[str, list[Span]]
    slowest: list[Rollout]
    failed: list[Rollout]
    skipped: Skipped
    wall_seconds: float | None
    notes: list[str] = field(default_factory=list)
    grafana_url: str | None = None  # set when the spans went to an OTLP endpoint instead of this folder


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _card(label: str, value: str, cls: str = "") -> str:
    return (
        f'<div class="card {cls}"><div class="card-value">{value}</div>'
        f'<div class="card-label">{esc(label)}</div></div>'
    )


def _summary(data: ReportData) -> str:
    stats = data.stats
    total = stats.total
    failed = stats.outcomes.get(names.ROLLOUT_OUTCOME_FAILED, 0)
    lat = stats.latency()
    cards = [_card("rollouts", str(total))]
    for outcome, count in sorted(stats.outcomes.items(), key=lambda kv: -kv[1]):
        cls = (
            "bad"
            if outcome == names.ROLLOUT_OUTCOME_FAILED
            else ("good" if outcome == names.ROLLOUT_OUTCOME_COMPLETED else "")
        )
        cards.append(
            _card(outcome, f"{count} <small>({100 * count / total:.1f}%)</small>" if total else "0", cls)
        )
    if data.wall_seconds:
        cards.append(_card("rollouts/s", f"{total / data.wall_seconds:.1f}"))
        cards.append(_card("failures/s", f"{failed / data.wall_seconds:.2f}"))
    for key in ("p50", "p90", "p99", "max"):
        cards.append(_card(f"latency {key}", esc(fmt_s(lat.get(key)))))
    meta = [f"source: {esc(data.source)}"]
    if data.run_id:
        meta.append(f"run id: <code>{esc(data.run_id)}</code>")
    if data.wall_seconds:
        meta.append(f"wall time: {data.wall_seconds:.2f} s")
    if data.metrics is not None:
        meta.append(f"telemetry from {data.metrics.processes} processes")
    meta.append("tokens: none recorded (this run has no token telemetry)")
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in data.notes)
    return (
        '<div class="cards">' + "".join(cards) + "</div>"
        f'<p class="meta">{" · ".join(meta)}</p>{notes}{_skipped(data.skipped)}'
    )


def _skipped(skipped: Skipped) -> str:
    if not skipped.total:
        return '<p class="meta" id="skipped">skipped lines: 0 (every line of the folder was read)</p>'
    rows = [(esc(name), str(count)) for name, count in sorted(skipped.lines.items())]
    return (
        f'<div class="warn" id="skipped"><strong>{skipped.total} lines skipped</strong> (truncated or not '
        "valid JSON objects; the rest of the run is shown)"
        + _table(("file", "lines skipped"), rows)
        + "</div>"
    )


def _no_metrics(data: ReportData) -> str:
    return '<p class="muted">no metric files in this folder (telemetry off, or sent to an OTLP endpoint)</p>'


def _latency(data: ReportData) -> str:
    if data.metrics is None or not data.metrics.hops:
        return _no_metrics(data)
    parts = []
    for hop, hist in data.metrics.hops.items():
        summary = hist.summary()
        parts.append(
            f'<figure class="chart"><figcaption><strong>{esc(hop)}</strong> · {summary["count"]} attempts · '
            f"p50 {esc(fmt_s(summary['p50']))} · p90 {esc(fmt_s(summary['p90']))} · "
            f"p99 {esc(fmt_s(summary['p99']))}</figcaption>{histogram(hist)}</figure>"
        )
    routes = [
        (esc(route), str(h.count), esc(fmt_s(h.summary()["p50"])), esc(fmt_s(h.summary()["p99"])))
        for route, h in data.metrics.server_routes.items()
    ]
    server = (
        "<h3>Server side, by route and status</h3>"
        + _table(("route status", "requests", "p50", "p99"), routes)
        if routes
        else ""
    )
    return '<div class="grid">' + "".join(parts) + "</div>" + server


def _retries(data: ReportData) -> str:
    if data.metrics is None:
        return _no_metrics(data)
    total = sum(data.metrics.retries.values())
    return f"<p>{total:g} retries in total.</p>" + bars(list(data.metrics.retries.items()))


def _pool_waits(data: ReportData) -> str:
    if data.metrics is None:
        return _no_metrics(data)
    if not data.metrics.pool_waits:
        return '<p class="muted">no pool waits: every request found a free pooled connection</p>'
    parts = []
    for pool, hist in data.metrics.pool_waits.items():
        s = hist.summary()
        parts.append(
            f'<figure class="chart"><figcaption><strong>{esc(pool)}</strong> · {s["count"]} waits · '
            f"p50 {esc(fmt_s(s['p50']))} · p99 {esc(fmt_s(s['p99']))}</figcaption>{histogram(hist)}</figure>"
        )
    return '<div class="grid">' + "".join(parts) + "</div>"


def _trace_link(rollout: Rollout | None, drawn: set[str]) -> str:
    if rollout is None or not rollout.trace_id:
        return "-"
    tid = esc(rollout.trace_id)
    return (
        f'<a href="#{esc(trace_anchor(rollout.trace_id))}"><code>{tid[:16]}…</code></a>'
        if (rollout.trace_id in drawn)
        else f"<code>{tid[:16]}…</code>"
    )


def _failures(data: ReportData, drawn: set[str]) -> str:
    groups = data.stats.sorted_groups()
    if not groups:
        return '<p class="muted">no failed rollouts</p>'
    out = []
    for group in groups:
        example = group.example
        head = (
            f'<span class="count">{group.count}×</span> <span class="kind">{esc(group.kind)}</span>'
            f' <span class="tag">boundary {esc(group.boundary or "-")}</span>'
            f' <span class="tag">stage {esc(group.stage or "-")}</span>'
            + (f' <span class="foreign">{esc(group.foreign)}</span>' if group.foreign else "")
        )
        example_line = (
            f'<p class="meta">example rollout <code>{esc(example.rollout_id)}</code> · trace '
            f"{_trace_link(example, drawn)} · {esc((example.error or '')[:240])}</p>"
            if example
            else ""
        )
        out.append(
            f'<details class="group" open><summary>{head}</summary>{example_line}'
            f"{cause_tree(example.chain if example else None)}</details>"
        )
    return "".join(out)


def _rollout_block(rollout: Rollout, data: ReportData, drawn: set[str], colors: dict[str, str]) -> str:
    status = "bad" if rollout.failed else "good"
    head = (
        f'<span class="pill {status}">{esc(rollout.outcome)}</span> <code>{esc(rollout.rollout_id)}</code>'
        f" · {esc(fmt_s(rollout.duration_s))}"
    )
    if rollout.error:
        head += f' · <span class="err">{esc(rollout.error[:200])}</span>'
    trace = rollout.trace_id
    if not trace:
        return f'<div class="rollout"><h3>{head}</h3><p class="muted">no trace id on this rollout</p></div>'
    if trace in drawn:
        return (
            f'<div class="rollout"><h3>{head}</h3><p class="meta">trace '
            f'<a href="#{esc(trace_anchor(trace))}">'
            f"<code>{esc(trace)}</code></a> is drawn above</p></div>"
        )
    spans = data.traces.get(trace)
    if not spans:
        grafana = (
            f' · <a href="{esc(grafana_explore_url(data.grafana_url, trace))}">open it in Grafana</a>'
            if data.grafana_url
            else ""
        )
        return (
            f'<div class="rollout"><h3>{head}</h3><p class="muted">trace <code>{esc(trace)}</code>: no spans '
            f"in this folder{grafana}</p></div>"
        )
    drawn.add(trace)
    services = len({s.service for s in spans})
    return (
        f'<div class="rollout trace" id="{esc(trace_anchor(trace))}" data-spans="{len(spans)}">'
        f'<h3>{head}</h3><p class="meta">trace <code>{esc(trace)}</code> · {len(spans)} spans from '
        f'{services} processes · click a span for its attributes</p><div class="wf-wrap">'
        f"{render_waterfall(trace, spans, colors)}</div>"
        '<div class="span-detail" hidden></div></div>'
    )


def _legend(colors: dict[str, str]) -> str:
    keys = "".join(
        f'<span class="key" style="background:{c}"></span>{esc(s)}' for s, c in sorted(colors.items())
    )
    return (
        f'<div class="legend">{keys}<span class="key ev-a"></span>failed attempt'
        '<span class="key ev-x"></span>exception<span class="key err-key"></span>error span</div>'
    )


def _colors(traces: dict[str, list[Span]]) -> dict[str, str]:
    services = sorted({s.service for spans in traces.values() for s in spans})
    return {service: PALETTE[i % len(PALETTE)] for i, service in enumerate(services)}


def render_page(data: ReportData) -> str:
    colors = _colors(data.traces)
    drawn: set[str] = set()
    # waterfalls first, so the failure groups link only to traces that really are on the page
    slowest = (
        "".join(_rollout_block(r, data, drawn, colors) for r in data.slowest) or '<p class="muted">none</p>'
    )
    failed = "".join(_rollout_block(r, data, drawn, colors) for r in data.failed) or (
        '<p class="muted">no failed rollouts</p>'
    )
    _, width, totals, fails = time_series(data.stats.ends)
    sections = [
        ("summary", "Run summary", _summary(data)),
        ("latency", "Latency per hop (per attempt)", _latency(data)),
        ("retries", "Retries by reason", _retries(data)),
        ("pool-waits", "Pool waits", _pool_waits(data)),
        ("failures", "Failures by root cause", _failures(data, drawn)),
        ("slowest", "Slowest rollouts", _legend(colors) + slowest),
        ("failed", "Failed rollouts", failed),
        ("timeseries", "Rollouts and failures per second", time_series_chart(width, totals, fails)),
    ]
    nav = "".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title, _ in sections)
    body = "".join(
        f'<section id="{sid}"><h2>{esc(title)}</h2>{content}</section>' for sid, title, content in sections
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(data.title)}</title>"
        f"<style>{_asset('report.css')}</style></head><body>"
        f"<header><h1>{esc(data.title)}</h1><nav>{nav}</nav></header><main>{body}</main>"
        f"<script>{_asset('report.js')}</script></body></html>"
    )


@cache
def _asset(name: str) -> str:
    return files(__package__).joinpath(name).read_text(encoding="utf-8")
