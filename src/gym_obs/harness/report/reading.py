"""Stream a run folder back in: rows, spans and metric snapshots, one line at a time.

A run folder is hostile input (a peer's failure reason lands in it) and may be cut short by a crash: every
line that is not a complete JSON object is counted in ``Skipped`` and passed over, never raised. Spans are
yielded one by one so a caller keeps only the traces it wants, whatever the size of the run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gym_obs.harness.telemetry_files import attributes_of
from gym_obs.telemetry import names
from gym_obs.telemetry.file_export import METRICS_SUFFIX, TRACES_SUFFIX

__all__ = [
    "ROWS_FILE",
    "Skipped",
    "Span",
    "SpanEvent",
    "count_metric_lines",
    "has_telemetry_files",
    "iter_jsonl",
    "iter_rows",
    "iter_spans",
    "resolve_run_dir",
    "telemetry_dir",
]

ROWS_FILE = "rollouts.jsonl"
MAX_ATTRIBUTE_CHARS = 1500  # a stack trace is kept readable, not whole: the report stays small
_TRACE_ID = re.compile(rb'"traceId"\s*:\s*"([0-9a-fA-F]{32})"')
SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


@dataclass
class Skipped:
    """Lines passed over per file (cut by a crash, not JSON, or not the expected shape)."""

    lines: dict[str, int] = field(default_factory=dict)

    def add(self, path: Path, count: int = 1) -> None:
        self.lines[path.name] = self.lines.get(path.name, 0) + count

    @property
    def total(self) -> int:
        return sum(self.lines.values())


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Span:
    """One span with what a waterfall and a hop path need; strings as the file had them (escape on output)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...]
    status_code: int
    status_message: str

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def is_error(self) -> bool:
        return self.status_code == STATUS_ERROR


def iter_jsonl(
    path: Path, skipped: Skipped, keep: Callable[[bytes], bool] | None = None
) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``path``, one per line; anything else is counted as skipped.

    ``keep`` sees the raw line first: a line it rejects is not parsed (a cheap pre-filter), but a line that
    is visibly cut short (does not end in ``}``) still counts as skipped.
    """
    try:
        handle = path.open("rb")
    except OSError:
        skipped.add(path)
        return
    with handle:
        for raw in handle:
            line = raw.strip()
            if not line:
                continue
            if not (line.startswith(b"{") and line.endswith(b"}")):
                skipped.add(path)
                continue
            if keep is not None and not keep(line):
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                skipped.add(path)
                continue
            if isinstance(doc, dict):
                yield doc
            else:
                skipped.add(path)


def iter_rows(run_dir: Path, skipped: Skipped) -> Iterator[dict[str, Any]]:
    """The harness's rollout rows (``rollouts.jsonl``); nothing when the folder has none."""
    path = run_dir / ROWS_FILE
    if path.is_file():
        yield from iter_jsonl(path, skipped)


def telemetry_dir(run_dir: Path) -> Path:
    """A harness folder keeps telemetry in ``telemetry/``; a ``gym-obs serve`` sink folder is the folder."""
    nested = run_dir / "telemetry"
    return nested if nested.is_dir() else run_dir


def has_telemetry_files(directory: Path) -> bool:
    """Whether the file sink wrote anything here (spans or metrics of any process)."""
    return any(directory.glob(f"*{TRACES_SUFFIX}")) or any(directory.glob(f"*{METRICS_SUFFIX}"))


def resolve_run_dir(path: Path) -> Path:
    """``path`` itself, or its ``latest`` run when ``path`` is a folder of runs (``harness-out/latest``)."""
    latest = path / "latest"
    own = (path / ROWS_FILE).is_file() or has_telemetry_files(telemetry_dir(path))
    return latest if not own and latest.is_dir() else path


_ENUM_NAMES = {
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
    "STATUS_CODE_OK": 1,
    "STATUS_CODE_ERROR": 2,
}


def _int(value: Any) -> int:
    """An OTLP/JSON integer, which may be a decimal string or (from some writers) an enum name."""
    if isinstance(value, str) and value in _ENUM_NAMES:
        return _ENUM_NAMES[value]
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _clip(attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        str(k): (v[:MAX_ATTRIBUTE_CHARS] + "…" if isinstance(v, str) and len(v) > MAX_ATTRIBUTE_CHARS else v)
        for k, v in attributes.items()
    }


def _span(raw: dict[str, Any], service: str) -> Span:
    status = raw.get("status") or {}
    return Span(
        trace_id=str(raw.get("traceId", "")),
        span_id=str(raw.get("spanId", "")),
        parent_span_id=str(raw.get("parentSpanId", "") or ""),
        name=str(raw.get("name", "")),
        kind=_int(raw.get("kind", 0)),
        start_ns=_int(raw.get("startTimeUnixNano", 0)),
        end_ns=_int(raw.get("endTimeUnixNano", 0)),
        service=service,
        attributes=_clip(attributes_of(raw.get("attributes"))),
        events=tuple(
            SpanEvent(
                str(e.get("name", "")),
                _int(e.get("timeUnixNano", 0)),
                _clip(attributes_of(e.get("attributes"))),
            )
            for e in raw.get("events") or ()
            if isinstance(e, dict)
        ),
        status_code=_int(status.get("code", 0)) if isinstance(status, dict) else 0,
        status_message=str(status.get("message", "")) if isinstance(status, dict) else "",
    )


def iter_spans(directory: Path, skipped: Skipped, trace_ids: Collection[str] | None = None) -> Iterator[Span]:
    """Every span of every ``*.traces.jsonl`` under ``directory`` (only of ``trace_ids`` when given)."""
    wanted = None if trace_ids is None else {t.lower().encode() for t in trace_ids}

    def keep(line: bytes) -> bool:
        return wanted is not None and any(t.lower() in wanted for t in _TRACE_ID.findall(line))

    for path in sorted(directory.glob(f"*{TRACES_SUFFIX}")):
        for doc in iter_jsonl(path, skipped, keep if wanted is not None else None):
            try:
                yield from _spans_of(doc, wanted)
            except (AttributeError, TypeError, ValueError):
                skipped.add(path)


def _spans_of(doc: dict[str, Any], wanted: set[bytes] | None) -> Iterator[Span]:
    for resource_spans in doc.get("resourceSpans") or ():
        resource = attributes_of((resource_spans.get("resource") or {}).get("attributes"))
        service = str(resource.get(names.SERVICE_NAME, ""))
        for scope_spans in resource_spans.get("scopeSpans") or ():
            for raw in scope_spans.get("spans") or ():
                if wanted is not None and str(raw.get("traceId", "")).lower().encode() not in wanted:
                    continue
                yield _span(raw, service)


def count_metric_lines(directory: Path, skipped: Skipped) -> None:
    """Count the unreadable lines of the metric files (their values are read by ``read_metric_totals``)."""
    for path in sorted(directory.glob(f"*{METRICS_SUFFIX}")):
        for _ in iter_jsonl(path, skipped):
            pass
