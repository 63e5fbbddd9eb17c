"""Small inline-SVG charts: a bucket histogram, horizontal bars, a time series and a failure's cause tree.

Every label passes through ``esc``; numbers are formatted here, so no string from the run reaches the page
unescaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from gym_obs.harness.report.model import ChainLink
from gym_obs.harness.telemetry_files import HistogramTotal

__all__ = ["bars", "cause_tree", "esc", "fmt_s", "histogram", "time_series_chart"]


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt_s(seconds: float | None) -> str:
    """Seconds as a short human duration (``-`` when unknown)."""
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def _bound(value: float) -> str:
    return fmt_s(value).replace(".0 ms", " ms")


def histogram(hist: HistogramTotal, width: int = 420, height: int = 150) -> str:
    """Bars per explicit bucket, empty buckets at either end trimmed; the overflow bucket is ``> last``."""
    counts = hist.counts
    if not counts or not any(counts):
        return '<p class="muted">no observations</p>'
    first = next(i for i, c in enumerate(counts) if c)
    last = max(i for i, c in enumerate(counts) if c)
    first, last = max(0, first - 1), min(len(counts) - 1, last + 1)
    shown = counts[first : last + 1]
    peak = max(shown)
    bar_w = (width - 40) / len(shown)
    plot_h = height - 42
    out = [f'<svg class="hist" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for offset, count in enumerate(shown):
        index = first + offset
        label = (
            f"≤ {_bound(hist.bounds[index])}" if index < len(hist.bounds) else f"> {_bound(hist.bounds[-1])}"
        )
        h = plot_h * count / peak if peak else 0
        x = 30 + offset * bar_w
        out.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{10 + plot_h - h:.1f}" width="{max(bar_w - 2, 1):.1f}"'
            f' height="{h:.1f}"><title>{esc(label)}: {count}</title></rect>'
        )
        if offset % max(1, math.ceil(len(shown) / 5)) == 0:
            out.append(
                f'<text class="axis" x="{x + bar_w / 2:.1f}" y="{height - 18}" text-anchor="middle">'
                f"{esc(label)}</text>"
            )
    out.append(f'<text class="axis" x="2" y="18">{peak}</text>')
    out.append(f'<line class="baseline" x1="30" y1="{10 + plot_h}" x2="{width - 10}" y2="{10 + plot_h}"/>')
    out.append("</svg>")
    return "".join(out)


def bars(items: Sequence[tuple[str, float]], unit: str = "") -> str:
    """Horizontal bars, largest first: one row per label."""
    if not items:
        return '<p class="muted">none</p>'
    peak = max(v for _, v in items) or 1
    rows = [
        f'<div class="hbar"><span class="hbar-label">{esc(label)}</span>'
        f'<span class="hbar-track"><span class="hbar-fill" style="width:{100 * value / peak:.1f}%">'
        "</span></span>"
        f'<span class="hbar-value">{value:g}{esc(unit)}</span></div>'
        for label, value in sorted(items, key=lambda kv: -kv[1])
    ]
    return '<div class="hbars">' + "".join(rows) + "</div>"


def time_series_chart(width_s: float, totals: Sequence[int], failures: Sequence[int]) -> str:
    """Rollouts/s and failures/s per bin as two lines on one axis."""
    if not totals:
        return '<p class="muted">no rollout timestamps</p>'
    w, h, left, bottom = 900, 200, 44, 26
    plot_w, plot_h = w - left - 10, h - bottom - 12
    rates = [c / width_s for c in totals]
    fails = [c / width_s for c in failures]
    peak = max(max(rates), 1e-9)
    n = max(len(rates) - 1, 1)

    def points(values: Sequence[float]) -> str:
        return " ".join(
            f"{left + plot_w * i / n:.1f},{12 + plot_h - plot_h * v / peak:.1f}" for i, v in enumerate(values)
        )

    elapsed = width_s * len(totals)
    out = [f'<svg class="series" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">']
    for frac in (0, 0.5, 1):
        y = 12 + plot_h - plot_h * frac
        out.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{w - 10}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="axis" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{peak * frac:.3g}</text>'
        )
    for frac in (0, 0.25, 0.5, 0.75, 1):
        x = left + plot_w * frac
        out.append(
            f'<text class="axis" x="{x:.1f}" y="{h - 8}" text-anchor="middle">{elapsed * frac:.3g} s</text>'
        )
    out.append(f'<polyline class="line-total" points="{points(rates)}"/>')
    out.append(f'<polyline class="line-fail" points="{points(fails)}"/>')
    out.append("</svg>")
    legend = (
        '<div class="legend"><span class="key total"></span>rollouts/s'
        '<span class="key fail"></span>failures/s'
        f'<span class="muted"> · bins of {width_s:.3g} s · peak {peak:.3g}/s</span></div>'
    )
    return "".join(out) + legend


def _link_text(link: ChainLink) -> str:
    if link.kind is None:
        return f'<span class="foreign">{esc(link.exception_type or "exception")}</span>'
    parts = [f'<span class="kind">{esc(link.kind)}</span>']
    if link.boundary:
        parts.append(f'<span class="tag">boundary {esc(link.boundary)}</span>')
    if link.stage:
        parts.append(f'<span class="tag">stage {esc(link.stage)}</span>')
    if link.server:
        parts.append(f'<span class="tag">server {esc(link.server)}</span>')
    if link.http_status is not None:
        parts.append(f'<span class="tag">HTTP {link.http_status}</span>')
    return " ".join(parts)


def cause_tree(chain: Sequence[ChainLink] | None) -> str:
    """The chain from the final failure (top) to its root cause (bottom), each node inside its caller."""
    if not chain:
        return '<p class="muted">no valid failure report on this rollout</p>'
    out: list[str] = []
    for depth, link in enumerate(chain):
        root = " root" if depth == len(chain) - 1 else ""
        out.append(
            f'<ul class="tree"><li><div class="node{root}">{_link_text(link)}'
            f'<div class="reason">{esc(link.reason[:300])}</div></div>'
        )
    out.extend("</li></ul>" for _ in chain)
    return '<div class="cause-tree">' + "".join(out) + "</div>"
