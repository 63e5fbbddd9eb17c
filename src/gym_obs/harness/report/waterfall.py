"""One trace as a waterfall: every span of every process on one time axis, children under their parents.

A SERVER span's parent is the CLIENT span that called it (the trace context crossed the hop), so plain
parent links give CLIENT -> SERVER nesting across processes. Everything from the run is escaped here: the
SVG is built as text, and span attributes go into a JSON blob that only ``textContent`` ever reads.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gym_obs.harness.report.reading import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, Span
from gym_obs.telemetry import names

__all__ = ["WaterfallRow", "json_for_script", "order_spans", "render_waterfall"]

_KIND_NAMES = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
PALETTE = ("#4e79a7", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac")
_LABEL_W = 330
_BAR_W = 640
_ROW_H = 20
_TOP = 24
MAX_SPANS = 400  # a pathological trace is cut (and says so); the report stays small


@dataclass(frozen=True, slots=True)
class WaterfallRow:
    span: Span
    depth: int


def order_spans(spans: Sequence[Span]) -> list[WaterfallRow]:
    """Depth-first by start time from the roots; a span whose parent is missing is a root (cycle-safe)."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[Span]] = {}
    roots: list[Span] = []
    for span in spans:
        if span.parent_span_id and span.parent_span_id in by_id and span.parent_span_id != span.span_id:
            children.setdefault(span.parent_span_id, []).append(span)
        else:
            roots.append(span)
    rows: list[WaterfallRow] = []
    seen: set[str] = set()
    stack = [(s, 0) for s in sorted(roots, key=lambda s: s.start_ns, reverse=True)]
    while stack:
        span, depth = stack.pop()
        if span.span_id in seen:
            continue
        seen.add(span.span_id)
        rows.append(WaterfallRow(span, depth))
        kids = sorted(children.get(span.span_id, ()), key=lambda s: s.start_ns, reverse=True)
        stack.extend((kid, depth + 1) for kid in kids)
    # spans only reachable through a cycle are still shown, as roots
    rows.extend(WaterfallRow(s, 0) for s in spans if s.span_id not in seen)
    return rows


def json_for_script(value: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` can end the element."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _nice_step(total_ms: float) -> float:
    raw = max(total_ms, 0.001) / 6
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000):
        if step >= raw:
            return float(step)
    return 120000.0


def _span_detail(span: Span) -> dict[str, Any]:
    return {
        "name": span.name,
        "service": span.service,
        "kind": _KIND_NAMES.get(span.kind, str(span.kind)),
        "duration_ms": round(span.duration_s * 1000, 3),
        "status": "error" if span.is_error else "ok",
        "status_message": span.status_message,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "attributes": span.attributes,
        "events": [{"name": e.name, "attributes": e.attributes} for e in span.events],
    }


def _label(span: Span) -> str:
    if span.kind == SPAN_KIND_CLIENT:
        target = span.attributes.get(names.ATTR_SERVER_NAME)
        return f"{span.name} → {target}" if target else span.name
    return span.name


def render_waterfall(trace_id: str, spans: Sequence[Span], colors: dict[str, str]) -> str:
    """The SVG waterfall of one trace plus its span details (JSON) for the click panel."""
    rows = order_spans(spans)
    cut = len(rows) - MAX_SPANS
    rows = rows[:MAX_SPANS]
    t0 = min(r.span.start_ns for r in rows)
    t1 = max(max(r.span.end_ns, r.span.start_ns) for r in rows)
    total_ms = max((t1 - t0) / 1e6, 0.001)
    scale = _BAR_W / total_ms
    height = _TOP + _ROW_H * len(rows) + 6
    width = _LABEL_W + _BAR_W + 80  # room for the duration label after the longest bar
    out = [
        f'<svg class="waterfall" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' data-trace="{_esc(trace_id)}" aria-label="trace {_esc(trace_id)}">'
    ]
    step = _nice_step(total_ms)
    tick = 0.0
    while tick <= total_ms + 1e-9:
        x = _LABEL_W + tick * scale
        out.append(f'<line class="tick" x1="{x:.1f}" y1="{_TOP - 6}" x2="{x:.1f}" y2="{height}"/>')
        label = f"{tick / 1000:g} s" if step >= 1000 else f"{tick:g} ms"
        out.append(f'<text class="tick-label" x="{x:.1f}" y="{_TOP - 10}">{label}</text>')
        tick += step
    for index, row in enumerate(rows):
        span = row.span
        y = _TOP + index * _ROW_H
        x = _LABEL_W + (span.start_ns - t0) / 1e6 * scale
        w = max(span.duration_s * 1000 * scale, 1.5)
        color = colors.get(span.service, PALETTE[0])
        cls = "span-bar error" if span.is_error else "span-bar"
        kind = _KIND_NAMES.get(span.kind, "")
        tip = f"{span.service} · {span.name} ({kind}) · {span.duration_s * 1000:.2f} ms"
        if span.is_error:
            tip += f" · error {span.status_message}".rstrip()
        out.append(f'<g class="span-row" data-span="{index}" data-kind="{_esc(kind)}" tabindex="0">')
        out.append(f'<rect class="row-bg" x="0" y="{y}" width="{width}" height="{_ROW_H}"/>')
        indent = 6 + row.depth * 12
        service = _fit(span.service.removeprefix(names.SERVICE_NAME_PREFIX), 16)
        label = _fit(_label(span), 44 - row.depth * 2 - len(service))
        marker = "▸ " if span.kind in (SPAN_KIND_CLIENT, SPAN_KIND_SERVER) else ""
        out.append(
            f'<text class="span-label" x="{indent}" y="{y + 14}"><tspan class="svc" fill="{color}">'
            f"{_esc(service)}</tspan> {_esc(marker)}{_esc(label)}</text>"
        )
        out.append(
            f'<rect class="{cls}" x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{_ROW_H - 8}" rx="2"'
            f' fill="{color}"><title>{_esc(tip)}</title></rect>'
        )
        for event in span.events:
            ex = _LABEL_W + (event.time_ns - t0) / 1e6 * scale if event.time_ns else x + w
            ev_cls = "ev-attempt" if event.name == names.SPAN_EVENT_ATTEMPT_FAILED else "ev-exception"
            out.append(
                f'<path class="{ev_cls}" d="M{ex:.1f} {y + 3} l5 7 l-5 7 l-5 -7 z">'
                f"<title>{_esc(event.name)}: {_esc(_event_summary(event.attributes))}</title></path>"
            )
        out.append(
            f'<text class="span-ms" x="{x + w + 4:.1f}" y="{y + 14}">'
            f"{span.duration_s * 1000:.1f} ms</text></g>"
        )
    out.append("</svg>")
    details = json_for_script([_span_detail(r.span) for r in rows])
    note = f'<p class="note">{cut} more spans not drawn.</p>' if cut > 0 else ""
    return "".join(out) + note + f'<script type="application/json" class="span-data">{details}</script>'


def _fit(text: str, limit: int) -> str:
    limit = max(limit, 8)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _event_summary(attributes: dict[str, Any]) -> str:
    keys = (
        names.ATTR_ATTEMPT,
        names.ATTR_ERROR_TYPE,
        names.ATTR_RETRY_REASON,
        names.ATTR_FAILURE_KIND,
        names.ATTR_EXCEPTION_TYPE,
        names.ATTR_EXCEPTION_MESSAGE,
    )
    parts = [f"{k}={attributes[k]}" for k in keys if k in attributes]
    return ", ".join(parts)[:300] or "-"
