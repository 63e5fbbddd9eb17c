"""What the report shows, aggregated while the rows stream by: outcomes, latency, failure groups, samples.

Memory is one float per rollout (for the quantiles and the time series) plus a bounded set of sampled
rollouts: the slowest and the failed, one per root-cause group first. Their traces are the only spans kept.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gym_obs.failures import InvalidFailureReport
from gym_obs.failures.rows import ROW_FAILURE_EVENTS_KEY, ROW_FAILURE_ID_KEY, read_report_from_row
from gym_obs.harness.stats import quantiles
from gym_obs.harness.telemetry_files import HistogramTotal, MetricTotals
from gym_obs.telemetry import names

__all__ = [
    "ChainLink",
    "FailureGroup",
    "MetricView",
    "Rollout",
    "RolloutStats",
    "failure_chain",
    "metric_view",
    "raw_group_key",
    "time_series",
]

SLOWEST = 8
FAILED = 12
MAX_CHAIN = 32
TIME_BINS = 90
OUTCOME_FAILURE = names.ROLLOUT_OUTCOME_FAILED


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One event of a failure chain, outermost first; a foreign exception has only a type and a reason."""

    kind: str | None
    boundary: str | None
    stage: str | None
    server: str | None
    http_status: int | None
    reason: str
    exception_type: str | None
    event_id: str

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "boundary": self.boundary,
            "stage": self.stage,
            "server": self.server,
            "http_status": self.http_status,
            "reason": self.reason,
            "exception_type": self.exception_type,
            "event_id": self.event_id,
        }


def failure_chain(row: dict[str, Any]) -> list[ChainLink] | None:
    """The row's failure report, validated by the failure layer, from the final failure to the root cause.

    ``None`` when the row carries no report or an invalid one (the caller counts it, never trusts it).
    """
    try:
        report = read_report_from_row(row)
    except (InvalidFailureReport, TypeError, ValueError):
        return None
    if report is None:
        return None
    chain: list[ChainLink] = []
    record = report.final_record
    seen: set[str] = set()
    while record is not None and len(chain) < MAX_CHAIN and record["event_id"] not in seen:
        seen.add(record["event_id"])
        status = record.get("http_status")
        chain.append(
            ChainLink(
                kind=record.get("failure_kind"),
                boundary=record.get("boundary"),
                stage=record.get("stage"),
                server=record.get("server_name"),
                http_status=status if isinstance(status, int) else None,
                reason=str(record.get("failure_reason") or ""),
                exception_type=record.get("exception_type"),
                event_id=str(record["event_id"]),
            )
        )
        cause = record.get("cause_id")
        record = report.events.get(cause) if isinstance(cause, str) else None
    return chain


def _root(chain: list[ChainLink]) -> tuple[ChainLink | None, str | None]:
    """The deepest gym event and the foreign exception under it (if any)."""
    gym = [link for link in chain if link.kind is not None]
    root = gym[-1] if gym else None
    foreign = next((link.exception_type for link in reversed(chain) if link.kind is None), None)
    return root, foreign


@dataclass(slots=True)
class Rollout:
    """A rollout the report shows in detail (or ``explain`` prints)."""

    rollout_id: str
    trace_id: str | None
    outcome: str
    duration_s: float
    started_at: float | None
    error: str | None
    chain: list[ChainLink] | None
    row: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_row(cls, row: dict[str, Any], *, validate: bool = True) -> Rollout:
        """``validate=False`` defers the failure layer's validation of the report to whoever needs the
        chain (the report validates only the rollouts it shows)."""
        duration = row.get("duration_s")
        started = row.get("started_at")
        trace = row.get("trace_id")
        error = row.get("error")
        return cls(
            rollout_id=str(row.get("rollout_id", "")),
            trace_id=trace.lower() if isinstance(trace, str) and trace else None,
            outcome=str(row.get("outcome", "unknown")),
            duration_s=float(duration) if isinstance(duration, (int, float)) and _finite(duration) else 0.0,
            started_at=float(started) if isinstance(started, (int, float)) and _finite(started) else None,
            error=str(error) if error is not None else None,
            chain=failure_chain(row) if validate and row.get("outcome") == OUTCOME_FAILURE else None,
            row=row,
        )

    @property
    def failed(self) -> bool:
        return self.outcome == OUTCOME_FAILURE


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


GroupKey = tuple[str, str, str, str]  # root kind, boundary, stage, foreign cause
INVALID_GROUP: GroupKey = ("(no valid failure report)", "", "", "")
_MAX_LABEL = 120


def _group_key(chain: list[ChainLink]) -> GroupKey:
    root, foreign = _root(chain)
    return (
        (root.kind if root else None) or "(unknown)",
        (root.boundary if root else None) or "",
        (root.stage if root else None) or "",
        foreign or "",
    )


def _text(value: Any) -> str | None:
    return value[:_MAX_LABEL] if isinstance(value, str) else None


def raw_group_key(row: dict[str, Any]) -> GroupKey | None:
    """The root-cause group of a row's report, read without the full validation (bounded, cycle-safe).

    Grouping thousands of failures this way is cheap; the strings are escaped wherever they are shown and
    the rollouts the page details are validated by ``failure_chain``. ``None``: no usable report.
    """
    events = row.get(ROW_FAILURE_EVENTS_KEY)
    record = events.get(row.get(ROW_FAILURE_ID_KEY)) if isinstance(events, dict) else None
    root: dict[str, Any] | None = None
    foreign: str | None = None
    seen: set[str] = set()
    while isinstance(record, dict) and len(seen) < MAX_CHAIN:
        event_id = record.get("event_id")
        if not isinstance(event_id, str) or event_id in seen:
            break
        seen.add(event_id)
        if isinstance(record.get("failure_kind"), str):
            root, foreign = record, None
        elif foreign is None:
            foreign = _text(record.get("exception_type"))
        cause = record.get("cause_id")
        record = events.get(cause) if isinstance(cause, str) and isinstance(events, dict) else None
    if root is None and foreign is None:
        return None
    return (
        (_text(root.get("failure_kind")) if root else None) or "(unknown)",
        (_text(root.get("boundary")) if root else None) or "",
        (_text(root.get("stage")) if root else None) or "",
        foreign or "",
    )


@dataclass(slots=True)
class FailureGroup:
    kind: str
    boundary: str
    stage: str
    foreign: str
    count: int = 0
    example: Rollout | None = None


@dataclass
class RolloutStats:
    """Everything the summary, the failure groups and the time series need, fed one rollout at a time."""

    outcomes: Counter[str] = field(default_factory=Counter)
    durations: list[float] = field(default_factory=list)
    ends: list[tuple[float, bool]] = field(default_factory=list)
    groups: dict[GroupKey, FailureGroup] = field(default_factory=dict)
    invalid_reports: int = 0
    _slowest: list[tuple[float, int, Rollout]] = field(default_factory=list)
    _failed: list[Rollout] = field(default_factory=list)
    _seen: int = 0

    def add(self, rollout: Rollout) -> None:
        self._seen += 1
        self.outcomes[rollout.outcome] += 1
        self.durations.append(rollout.duration_s)
        if rollout.started_at is not None:
            self.ends.append((rollout.started_at + rollout.duration_s, rollout.failed))
        entry = (rollout.duration_s, -self._seen, rollout)
        if len(self._slowest) < SLOWEST:
            heapq.heappush(self._slowest, entry)
        elif entry[:2] > self._slowest[0][:2]:
            heapq.heapreplace(self._slowest, entry)
        if rollout.failed:
            self._add_failure(rollout)
        rollout.row = {}  # the row's job is done; keep memory flat

    def _add_failure(self, rollout: Rollout) -> None:
        key = _group_key(rollout.chain) if rollout.chain is not None else raw_group_key(rollout.row)
        if key is None:
            self.invalid_reports += 1
            key = INVALID_GROUP
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = FailureGroup(*key)
        group.count += 1
        shown = group.example is None or len(self._failed) < FAILED
        if shown and rollout.chain is None and rollout.row:
            rollout.chain = failure_chain(rollout.row)  # validated only for the rollouts on the page
        if group.example is None:
            group.example = rollout
        elif len(self._failed) < FAILED:
            self._failed.append(rollout)

    @property
    def total(self) -> int:
        return self._seen

    def latency(self) -> dict[str, float | None]:
        return quantiles(self.durations)

    def sorted_groups(self) -> list[FailureGroup]:
        return sorted(self.groups.values(), key=lambda g: (-g.count, g.kind, g.boundary, g.stage, g.foreign))

    def slowest(self) -> list[Rollout]:
        return [r for _, _, r in sorted(self._slowest, key=lambda e: (-e[0], -e[1]))]

    def failed_samples(self) -> list[Rollout]:
        """One example per root-cause group (largest first), then more failures, at most ``FAILED``."""
        picked = [g.example for g in self.sorted_groups() if g.example is not None]
        return (picked + self._failed)[:FAILED]


def time_series(
    ends: list[tuple[float, bool]], bins: int = TIME_BINS
) -> tuple[float, float, list[int], list[int]]:
    """Rollouts and failures finished per bin: (start, bin width s, totals, failures)."""
    if not ends:
        return 0.0, 1.0, [], []
    start = min(t for t, _ in ends)
    span = max(t for t, _ in ends) - start
    # bins of at least a tenth of the run (and of 1 s once the run is long): a rate over a few ms is noise
    width = max(span / bins, min(1.0, span / 10)) if span > 0 else 1.0
    count = min(bins, int(span / width) + 1)
    totals, failures = [0] * count, [0] * count
    for t, failed in ends:
        index = min(count - 1, int((t - start) / width))
        totals[index] += 1
        failures[index] += failed
    return start, width, totals, failures


@dataclass
class MetricView:
    """The metric-derived sections: per-destination latency histograms, retries, pool waits, server routes."""

    hops: dict[str, HistogramTotal]
    retries: dict[str, float]
    pool_waits: dict[str, HistogramTotal]
    server_routes: dict[str, HistogramTotal]
    processes: int


def metric_view(totals: MetricTotals) -> MetricView:
    def destination(attrs: dict[str, str]) -> str | None:
        return f"→ {attrs.get(names.ATTR_SERVER_NAME, '?')}"

    def reason(attrs: dict[str, str]) -> str | None:
        return f"{attrs.get(names.ATTR_RETRY_REASON, '?')} → {attrs.get(names.ATTR_SERVER_NAME, '?')}"

    def pool(attrs: dict[str, str]) -> str | None:
        return (
            f"{attrs.get(names.ATTR_POOL, '?')} pool → {attrs.get(names.ATTR_SERVER_NAME, '?')}"
            f" ({attrs.get(names.ATTR_POOL_OUTCOME, '?')})"
        )

    def route(attrs: dict[str, str]) -> str | None:
        status = attrs.get(names.ATTR_HTTP_RESPONSE_STATUS_CODE, "no status")
        return f"{attrs.get(names.ATTR_HTTP_ROUTE, '(no route)')} · {status}"

    return MetricView(
        hops=dict(
            sorted(totals.histogram_by(names.METRIC_HTTP_CLIENT_REQUEST_DURATION, destination).items())
        ),
        retries=dict(sorted(totals.sum_by(names.METRIC_CLIENT_RETRIES, reason).items())),
        pool_waits=dict(sorted(totals.histogram_by(names.METRIC_POOL_WAIT_DURATION, pool).items())),
        server_routes=dict(
            sorted(totals.histogram_by(names.METRIC_HTTP_SERVER_REQUEST_DURATION, route).items())
        ),
        processes=totals.processes,
    )
