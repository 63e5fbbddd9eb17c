"""``gym-obs explain ID [RUN_DIR]``: one rollout's story, from its row and its spans.

Why did rollout X fail? The failure chain from the outermost event to the root cause, the hops it made
(latency and attempts, from the spans of every process), and where to open its trace. Everything printed
comes from the run folder, which is hostile input: control characters are replaced before they reach the
terminal, reasons are bounded.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_obs.harness.report import REPORT_FILE, read_run_summary, rollout_from_span
from gym_obs.harness.report.links import DEFAULT_GRAFANA_URL, grafana_explore_url, trace_anchor
from gym_obs.harness.report.model import Rollout
from gym_obs.harness.report.reading import (
    ROWS_FILE,
    SPAN_KIND_CLIENT,
    SPAN_KIND_SERVER,
    Skipped,
    Span,
    iter_rows,
    iter_spans,
    resolve_run_dir,
    telemetry_dir,
)
from gym_obs.telemetry import names

__all__ = ["Explanation", "UnknownRollout", "explain", "printable", "render_text"]

MAX_REASON = 300
MAX_HOPS = 200


class UnknownRollout(LookupError):
    """No rollout or trace with that id; ``rollouts`` says how many the folder has."""

    def __init__(self, wanted: str, run_dir: Path, rollouts: int) -> None:
        self.rollouts = rollouts
        super().__init__(
            f"no rollout or trace {printable(wanted, 80)!r} in {printable(str(run_dir), 200)} "
            f"(it has {rollouts} rollout{'s' if rollouts != 1 else ''})"
        )


def printable(text: object, limit: int = MAX_REASON) -> str:
    """``text`` bounded, with every control or format character (ANSI escapes included) made visible."""
    out = []
    for char in str(text)[:limit]:
        if unicodedata.category(char)[0] == "C":
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    suffix = "…" if len(str(text)) > limit else ""
    return "".join(out) + suffix


@dataclass(frozen=True)
class Hop:
    caller: str
    destination: str
    name: str
    start_offset_s: float
    duration_s: float
    attempts: int
    status: str
    server_duration_s: float | None
    retry_reasons: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "caller": self.caller,
            "destination": self.destination,
            "name": self.name,
            "start_offset_s": round(self.start_offset_s, 6),
            "duration_s": round(self.duration_s, 6),
            "attempts": self.attempts,
            "status": self.status,
            "server_duration_s": None if self.server_duration_s is None else round(self.server_duration_s, 6),
            "retry_reasons": list(self.retry_reasons),
        }


@dataclass(frozen=True)
class Explanation:
    rollout: Rollout
    hops: list[Hop]
    spans: int
    report_link: str | None
    report_exists: bool
    grafana_url: str | None

    def as_json(self) -> dict[str, Any]:
        r = self.rollout
        return {
            "rollout_id": r.rollout_id,
            "trace_id": r.trace_id,
            "outcome": r.outcome,
            "duration_s": r.duration_s,
            "error": r.error,
            "failure_chain": [link.as_json() for link in r.chain or ()],
            "hops": [hop.as_json() for hop in self.hops],
            "spans": self.spans,
            "report": self.report_link,
            "report_exists": self.report_exists,
            "grafana_explore_url": self.grafana_url,
        }


def _service(span: Span) -> str:
    return span.service.removeprefix(names.SERVICE_NAME_PREFIX) or "?"


def _hops(spans: list[Span]) -> list[Hop]:
    if not spans:
        return []
    t0 = min(s.start_ns for s in spans)
    servers = {s.parent_span_id: s for s in spans if s.kind == SPAN_KIND_SERVER}
    hops = []
    for span in sorted((s for s in spans if s.kind == SPAN_KIND_CLIENT), key=lambda s: s.start_ns)[:MAX_HOPS]:
        failed = [e for e in span.events if e.name == names.SPAN_EVENT_ATTEMPT_FAILED]
        resends = span.attributes.get(names.ATTR_HTTP_REQUEST_RESEND_COUNT)
        if isinstance(resends, int) and resends >= 0:
            attempts = resends + 1
        else:
            attempts = max(1, len(failed) + (0 if span.is_error else 1))
        status = span.attributes.get(names.ATTR_HTTP_RESPONSE_STATUS_CODE)
        error = span.attributes.get(names.ATTR_ERROR_TYPE)
        server = servers.get(span.span_id)
        hops.append(
            Hop(
                caller=_service(span),
                destination=str(span.attributes.get(names.ATTR_SERVER_NAME, "?")),
                name=span.name,
                start_offset_s=(span.start_ns - t0) / 1e9,
                duration_s=span.duration_s,
                attempts=attempts,
                status=str(status) if status is not None else (str(error) if error else "-"),
                server_duration_s=server.duration_s if server else None,
                retry_reasons=tuple(
                    str(
                        e.attributes.get(
                            names.ATTR_RETRY_REASON, e.attributes.get(names.ATTR_ERROR_TYPE, "?")
                        )
                    )
                    for e in failed
                ),
            )
        )
    return hops


def _find(wanted: str, run_dir: Path, tel_dir: Path) -> tuple[Rollout | None, int]:
    key = wanted.strip()
    count = 0
    skipped = Skipped()
    if (run_dir / ROWS_FILE).is_file():
        for row in iter_rows(run_dir, skipped):
            count += 1
            trace = row.get("trace_id")
            if row.get("rollout_id") == key or (isinstance(trace, str) and trace.lower() == key.lower()):
                return Rollout.from_row(row), count
        return None, count
    for span in iter_spans(tel_dir, skipped):
        if span.name != names.SPAN_HARNESS_ROLLOUT:
            continue
        count += 1
        rollout = rollout_from_span(span)
        if key in (rollout.rollout_id, span.trace_id) or span.trace_id.lower() == key.lower():
            return rollout, count
    return None, count


def explain(wanted: str, run_dir: str | Path, *, grafana_url: str = DEFAULT_GRAFANA_URL) -> Explanation:
    """Find ``wanted`` (a rollout id or a trace id) in ``run_dir``; ``UnknownRollout`` if it is not there."""
    run_dir = resolve_run_dir(Path(run_dir)) if Path(run_dir).is_dir() else Path(run_dir)
    tel_dir = telemetry_dir(run_dir)
    rollout, count = _find(wanted, run_dir, tel_dir) if run_dir.is_dir() else (None, 0)
    if rollout is None:
        # the scan stopped at a match only; an unknown id has read everything
        raise UnknownRollout(wanted, run_dir, count)
    spans: list[Span] = []
    if rollout.trace_id:
        spans = list(iter_spans(tel_dir, Skipped(), {rollout.trace_id}))
    summary = read_run_summary(run_dir)
    telemetry = summary.get("telemetry")
    otlp = telemetry.get("otlp_endpoint") if isinstance(telemetry, dict) else None
    report = run_dir / REPORT_FILE
    link = f"{report}#{trace_anchor(rollout.trace_id)}" if rollout.trace_id else None
    return Explanation(
        rollout=rollout,
        hops=_hops(spans),
        spans=len(spans),
        report_link=link,
        report_exists=report.is_file(),
        grafana_url=grafana_explore_url(grafana_url, rollout.trace_id) if otlp and rollout.trace_id else None,
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def render_text(ex: Explanation) -> str:
    """The terminal story; every string from the run goes through ``printable``."""
    p = printable
    r = ex.rollout
    lines = [
        f"rollout   {p(r.rollout_id)}",
        f"outcome   {p(r.outcome)}",
        f"duration  {_ms(r.duration_s)}",
        f"trace     {p(r.trace_id or '-')}",
    ]
    if r.error:
        lines.append(f"error     {p(r.error)}")
    if r.failed:
        lines.append("failure chain (outermost -> root cause):")
        if not r.chain:
            lines.append("  (no valid failure report on this rollout)")
        for i, link in enumerate(r.chain or (), 1):
            if link.kind is None:
                lines.append(f"  {i}. {p(link.exception_type or 'exception', 120)} (foreign cause)")
            else:
                fields = [
                    f"boundary={p(link.boundary or '-', 60)}",
                    f"stage={p(link.stage or '-', 60)}",
                    f"server={p(link.server or '-', 60)}",
                    f"http_status={link.http_status if link.http_status is not None else '-'}",
                ]
                lines.append(f"  {i}. {p(link.kind, 60)}  {' '.join(fields)}")
            lines.append(f"     reason: {p(link.reason)}")
    if ex.hops:
        lines.append(
            f"hops ({len(ex.hops)}, from {ex.spans} spans; start offset, latency, attempts, status):"
        )
        for hop in ex.hops:
            retry = (
                f"  retried: {', '.join(p(x, 40) for x in hop.retry_reasons)}" if hop.retry_reasons else ""
            )
            server = f"  (server {_ms(hop.server_duration_s)})" if hop.server_duration_s is not None else ""
            lines.append(
                f"  +{hop.start_offset_s * 1000:7.1f} ms  {p(hop.caller, 40)} -> {p(hop.destination, 40)}  "
                f"{p(hop.name, 80)}  {_ms(hop.duration_s)}{server}  "
                f"{hop.attempts} attempt{'s' if hop.attempts != 1 else ''}  {p(hop.status, 20)}{retry}"
            )
    elif r.trace_id:
        lines.append("hops: no spans of this trace in the folder")
    if ex.report_link:
        hint = (
            ""
            if ex.report_exists
            else "   (write it first: gym-obs report "
            + p(str(Path(ex.report_link.split("#")[0]).parent), 200)
            + ")"
        )
        lines.append(f"open      {p(ex.report_link, 400)}{hint}")
    if ex.grafana_url:
        lines.append(f"grafana   {p(ex.grafana_url, 600)}")
    return "\n".join(lines)
