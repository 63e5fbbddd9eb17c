"""One JSON line per rollout, with the failure report stored the way collection rows store it.

The row is the durable result of a run: rollout id, trace id (to open the trace), outcome, duration, and for
a failure the full report under ``_ng_failure_events`` / ``_ng_failure_id`` plus the root cause it resolves
to, so a dataset of rollouts can be grouped by root cause without re-running anything. A success whose
agent recovered from failures (retried model calls) keeps those events too: the same two keys with
``_ng_failure_id`` null, decoded and validated from the agent's ``X-NG-Failure-Report`` header (so bounded
by the failure model's own limits), and their number as ``recovered_failures``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson

from gym_obs.failures.report import FailureReport, failure_report_for
from gym_obs.failures.rows import store_report_on_row
from gym_obs.telemetry import names

__all__ = ["RolloutResult", "RootCause", "RowWriter", "root_cause_of"]


@dataclass(frozen=True, slots=True)
class RootCause:
    """Where a failed rollout's chain ends: the deepest gym event and the foreign exception under it."""

    kind: str | None
    boundary: str | None
    foreign_type: str | None
    final_kind: str | None
    final_boundary: str | None

    def as_json(self) -> dict[str, str | None]:
        return {
            "kind": self.kind,
            "boundary": self.boundary,
            "foreign_cause": self.foreign_type,
            "final_kind": self.final_kind,
            "final_boundary": self.final_boundary,
        }


def root_cause_of(report: FailureReport) -> RootCause | None:
    """Follow ``cause_id`` from the final failure to the end of the chain (bounded, cycle-safe)."""
    record = report.final_record
    if record is None:
        return None
    final = record
    deepest_gym: dict[str, Any] = record
    foreign: str | None = None
    seen: set[str] = set()
    while record is not None and record["event_id"] not in seen:
        seen.add(record["event_id"])
        if record.get("failure_kind") is not None:
            deepest_gym = record
            foreign = None
        elif foreign is None:
            foreign = record.get("exception_type")
        cause_id = record.get("cause_id")
        record = report.events.get(cause_id) if cause_id else None
    return RootCause(
        kind=deepest_gym.get("failure_kind"),
        boundary=deepest_gym.get("boundary"),
        foreign_type=foreign,
        final_kind=final.get("failure_kind"),
        final_boundary=final.get("boundary"),
    )


@dataclass(slots=True)
class RolloutResult:
    """What the driver learnt about one rollout."""

    index: int
    rollout_id: str
    agent: str
    outcome: str
    duration_s: float
    started_at: float
    trace_id: str | None = None
    reward: float | None = None
    hops: list[tuple[str, float]] = field(default_factory=list)
    report: FailureReport | None = None
    root: RootCause | None = None
    error: str | None = None
    usage: dict[str, float | int | None] | None = None  # the agent's model-call tallies (AgentReply.usage)

    @classmethod
    def failed(
        cls, error: BaseException, report: FailureReport | None = None, **fields: Any
    ) -> RolloutResult:
        """A failed rollout; ``report`` (default: ``error``'s own chain) may add what else was observed."""
        if report is None:
            report = failure_report_for(error)
        result = cls(outcome=names.ROLLOUT_OUTCOME_FAILED, report=report, **fields)
        result.root = root_cause_of(report)
        result.error = str(error)
        return result

    @property
    def recovered_failures(self) -> int:
        """Gym failure events a successful rollout recovered from (retried calls), as its agent reported
        them (their foreign causes are on the row too, not counted here)."""
        if self.outcome == names.ROLLOUT_OUTCOME_FAILED or self.report is None:
            return 0
        return sum(1 for record in self.report.events.values() if record.get("failure_kind") is not None)

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "rollout_id": self.rollout_id,
            "index": self.index,
            "trace_id": self.trace_id,
            "outcome": self.outcome,
            "duration_s": round(self.duration_s, 6),
            "started_at": self.started_at,
            "agent": self.agent,
        }
        if self.reward is not None:
            row["reward"] = self.reward
        if self.root is not None:
            row["root_cause"] = self.root.as_json()
        if self.error is not None:
            row["error"] = self.error
        if self.recovered_failures:
            row["recovered_failures"] = self.recovered_failures
        if self.usage is not None:
            row.update(self.usage)
        return store_report_on_row(row, self.report)


class RowWriter:
    """Appends rows to ``rollouts.jsonl`` as results arrive (a crash keeps every finished rollout).

    The file is unbuffered: each row is one complete ``write`` to the kernel before :meth:`write` returns,
    so a SIGKILL of the harness loses no finished row and never leaves half a line. (The kernel's page
    cache still holds it until it is written back: a power cut, unlike a process crash, can lose the last
    seconds; :meth:`__exit__` syncs the file once at the end.)
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self.count = 0

    def __enter__(self) -> RowWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("wb", buffering=0)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def write(self, result: RolloutResult) -> None:
        """Write ``result``'s row through to the kernel (the whole line, then return)."""
        line = memoryview(orjson.dumps(result.row()) + b"\n")
        with self._lock:
            if self._file is None:
                return
            while line:  # a raw write may be short; finish the line before anyone else writes
                written = self._file.write(line)
                line = line[written or 0 :]
            self.count += 1
