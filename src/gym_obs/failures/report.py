"""FailureReport: an exception's explicit cause chain as data, and back.

Record shape (one per event, JSON-ready, keyed by ``event_id`` in ``FailureReport.events``)::

    gym failure   {"event_id": "fe_<24 hex>", "failure_kind": str, "failure_reason": str,
                   "boundary": str, "stage": str | None, "http_status": int | None,
                   "details": dict | None, "cause_id": "fe_…" | None, "trace_id": hex32 | None,
                   "span_id": hex16 | None, "rollout_id": str | None, "server_name": str | None,
                   "timestamp": float (unix seconds)[, "skipped": int]}
    foreign cause {"event_id": "fe_<24 hex>", "failure_kind": None, "exception_type": "module.QualName",
                   "failure_reason": str (bounded, scrubbed message), "cause_id": "fe_…" | None,
                   "details": dict | None[, "skipped": int]}

``failure_kind is None`` is what marks a foreign cause (a non-gym exception). ``skipped`` (present only when
non-zero) counts events cut out between a record and its ``cause_id`` (see ``_shrink`` for the rule).
``failure_id`` names the final failure, always a gym record; it is ``None`` for a report of recovered
failures only. ``truncated``/``dropped`` say whether and how many events were cut from the report.

Walking rules (``failure_report_for``): only ``__cause__`` is followed, never ``__context__``. The final
failure is the first gym failure reachable from the error (depth first, exception-group members before the
group's own ``__cause__``); with none, the report is empty (a server wraps such errors in an
``internal_error`` event first). An exception group in a chain is recorded as a foreign cause with
``details={"exceptions": n}``; its chain continues into the first member that leads to a gym failure (else
the first member) and the other members are recorded as secondary chains. Exceptions above the final failure
(wrappers, the group that carried it) are recorded as secondary events too. A cycle is cut where it closes;
chains longer than ``MAX_DEPTH`` lose their middle; more than ``MAX_EVENTS`` events are cut by the drop rule.
"""

from __future__ import annotations

import contextlib
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_obs.failures._base import (
    MAX_DEPTH,
    MAX_EVENTS,
    MAX_SKIPPED,
    new_event_id,
)
from gym_obs.failures._shrink import final_chain, trim_to_count
from gym_obs.failures._validation import validate_event_map
from gym_obs.failures.errors import InvalidFailureReport
from gym_obs.failures.event import (
    FailureEvent,
    ForeignFailure,
    NgFailureEvent,
    _event_from_clean,
    exception_type_name,
    safe_message,
)

__all__ = [
    "FailureReport",
    "failure_report_for",
    "find_boundary_failure",
    "rebuild_failure",
    "validate_failure_event_map",
]

_MAX_VISITS = 4096
_MAX_ROOT_STEPS = 1_000_000  # a chain longer than the visits is followed (pointers only) to its root
_ID_ATTR = "_ng_event_id"


class FailureReport(BaseModel):
    """The final failure (``failure_id``) and every event it and the request observed, keyed by id."""

    model_config = ConfigDict(extra="forbid")

    failure_id: str | None = None
    events: dict[str, dict[str, Any]] = Field(default_factory=dict)
    truncated: bool = False
    dropped: int = Field(default=0, ge=0, le=MAX_SKIPPED)

    @model_validator(mode="after")
    def _validate(self) -> Self:
        self.events = validate_event_map(self.events)
        _check_failure_id(self.failure_id, self.events)
        return self

    @property
    def final_record(self) -> FailureEvent | None:
        """The final failure's record, if any."""
        return None if self.failure_id is None else self.events.get(self.failure_id)

    def to_payload(self) -> dict[str, Any]:
        """The JSON-ready dict that travels in a reply body or header (see ``from_payload``)."""
        return {
            "failure_id": self.failure_id,
            "events": self.events,
            "truncated": self.truncated,
            "dropped": self.dropped,
        }

    @classmethod
    def from_payload(cls, payload: object) -> FailureReport:
        """Validate a payload from another process; raises only ``InvalidFailureReport``."""
        if not isinstance(payload, dict):
            raise InvalidFailureReport("a failure report must be an object")
        failure_id = payload.get("failure_id")
        truncated = payload.get("truncated", False)
        dropped = payload.get("dropped", 0)
        if not isinstance(truncated, bool):
            raise InvalidFailureReport("truncated must be a boolean")
        if isinstance(dropped, bool) or not isinstance(dropped, int) or not 0 <= dropped <= MAX_SKIPPED:
            raise InvalidFailureReport("dropped must be a small non-negative integer")
        if failure_id is not None and not isinstance(failure_id, str):
            raise InvalidFailureReport("failure_id must be a string or null")
        events = validate_event_map(payload.get("events", {}))
        _check_failure_id(failure_id, events)
        return cls.model_construct(failure_id=failure_id, events=events, truncated=truncated, dropped=dropped)


def validate_failure_event_map(events: object) -> dict[str, FailureEvent]:
    """A normalized copy of an event map from another process, or ``InvalidFailureReport``.

    Checks: ids well formed and equal to their keys, known boundaries/stages, field types and sizes,
    every ``cause_id`` resolves, no cycle, at most ``MAX_EVENTS`` events and ``MAX_DEPTH`` chain depth.
    """
    return validate_event_map(events)


def find_boundary_failure(error: BaseException | None) -> NgFailureEvent | None:
    """The first gym failure reachable from ``error`` through ``__cause__`` and exception groups."""
    stack: list[BaseException | None] = [error]
    seen: set[int] = set()
    while stack and len(seen) < _MAX_VISITS:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, NgFailureEvent):
            return node
        stack.append(node.__cause__)
        if isinstance(node, BaseExceptionGroup):
            stack.extend(reversed(node.exceptions))
    return None


def failure_report_for(error: BaseException | None) -> FailureReport:
    """The report of ``error``'s final gym failure and its explicit causes (rules in the module doc)."""
    return _walk(error)[0]


def rebuild_failure(report: FailureReport) -> NgFailureEvent | None:
    """The final failure of ``report`` with original ids, its causes linked as ``__cause__``."""
    record = report.final_record
    if record is None or record["failure_kind"] is None:
        return None
    built: dict[str, BaseException] = {}
    previous: BaseException | None = None
    for eid in final_chain(report.events, report.failure_id):
        current = _rebuild_one(report.events[eid])
        built[eid] = current
        if previous is not None:
            previous.__cause__ = current
        previous = current
    final = built[report.failure_id]  # type: ignore[index]
    assert isinstance(final, NgFailureEvent)
    return final


def _rebuild_one(record: FailureEvent) -> BaseException:
    if record["failure_kind"] is not None:
        return _event_from_clean(NgFailureEvent, record)
    foreign = ForeignFailure(
        record["exception_type"],
        record["failure_reason"],
        event_id=record["event_id"],
        details=record.get("details"),
    )
    foreign.skipped_causes = record.get("skipped", 0)
    return foreign


def _check_failure_id(failure_id: str | None, events: dict[str, FailureEvent]) -> None:
    if failure_id is None:
        return
    record = events.get(failure_id)
    if record is None:
        raise InvalidFailureReport("failure_id does not name an event in the report")
    if record["failure_kind"] is None:
        raise InvalidFailureReport("failure_id names a foreign cause, not a gym failure")


# --- walking an exception chain ---------------------------------------------------------------------------


class _Walker:
    """Collects records for chains of live exceptions; remembers the gym events it met (for counting)."""

    def __init__(self) -> None:
        self.events: dict[str, FailureEvent] = {}
        self.depth: dict[str, int] = {}
        self.ids: dict[int, str] = {}
        self.gym: list[NgFailureEvent] = []
        self.pending: list[BaseException] = []
        self.dropped = 0
        self.visits = 0

    def known_id(self, node: BaseException) -> str | None:
        eid = self.ids.get(id(node))
        if eid is None and isinstance(node, NgFailureEvent | ForeignFailure) and node.event_id in self.events:
            eid = node.event_id
        return eid

    def chain(self, head: BaseException) -> None:
        nodes: list[BaseException] = []
        on_path: set[int] = set()
        ids_on_path: set[str] = set()  # two rebuilt copies of one event are one event
        node: BaseException | None = head
        cycle = False
        while node is not None and self.visits < _MAX_VISITS:
            own = node.event_id if isinstance(node, NgFailureEvent | ForeignFailure) else None
            cycle = id(node) in on_path or (own is not None and own in ids_on_path)
            if cycle or self.known_id(node) is not None:
                break
            self.visits += 1
            nodes.append(node)
            on_path.add(id(node))
            if own is not None:
                ids_on_path.add(own)
            node = self._next(node)
        tail = None
        jumped = 0
        if node is not None and not cycle:
            tail = self.known_id(node)  # a shared cause recorded by an earlier chain (never a cycle)
            if tail is None and nodes:  # out of visits: the root cause must still be the chain's end
                root, jumped = _root_beyond(node)
                nodes.append(root)
        self._record(nodes, tail, jumped)

    def _next(self, node: BaseException) -> BaseException | None:
        if not isinstance(node, BaseExceptionGroup) or not node.exceptions:
            return node.__cause__
        members = list(node.exceptions)
        follow = next((m for m in members if find_boundary_failure(m) is not None), members[0])
        self.pending.extend(m for m in members if m is not follow)
        if node.__cause__ is not None:
            self.pending.append(node.__cause__)
        return follow

    def _record(self, nodes: list[BaseException], tail: str | None, jumped: int = 0) -> None:
        """Record ``nodes`` (head first) linked to ``tail``; ``jumped`` events were skipped before the
        last one (the root cause, reached past the visit bound)."""
        if not nodes:
            return
        self.dropped += jumped
        tail_depth = self.depth.get(tail, 0) if tail is not None else 0
        budget = MAX_DEPTH - tail_depth
        if budget < 2 and len(nodes) > budget:
            tail, tail_depth, budget = None, 0, MAX_DEPTH
        skipped_at = -1
        cut = 0
        gaps = 0  # gaps already standing before the removed events (a forwarded truncated chain)
        if len(nodes) > budget:
            head_keep = (budget + 1) // 2
            cut = len(nodes) - budget
            for removed in nodes[head_keep : head_keep + cut]:
                own_gap = getattr(removed, "skipped_causes", 0)
                gaps += own_gap if isinstance(own_gap, int) else 0
            nodes = nodes[:head_keep] + nodes[head_keep + cut :]
            skipped_at = head_keep - 1
            self.dropped += cut
        ids = [self._id_for(node) for node in nodes]
        causes = [*ids[1:], tail]
        for index, node in enumerate(nodes):  # head first, so a map reads from the final failure down
            skipped = cut + gaps if index == skipped_at else 0
            if index == len(nodes) - 2:
                skipped += jumped
            self.events[ids[index]] = self._record_for(node, ids[index], causes[index], skipped)
        below = tail_depth
        for eid in reversed(ids):
            below += 1
            self.depth[eid] = below

    def _id_for(self, node: BaseException) -> str:
        own = node.event_id if isinstance(node, NgFailureEvent | ForeignFailure) else None
        eid = own or getattr(node, _ID_ATTR, None) or new_event_id()
        if own is None:
            with contextlib.suppress(Exception):  # the same foreign exception keeps its id across reports
                setattr(node, _ID_ATTR, eid)
        self.ids[id(node)] = eid
        return str(eid)

    def _record_for(self, node: BaseException, eid: str, cause_id: str | None, skipped: int) -> FailureEvent:
        # A rebuilt event or foreign cause may already stand before a gap (its report was truncated).
        own_gap = getattr(node, "skipped_causes", 0)
        skipped = min(skipped + (own_gap if isinstance(own_gap, int) else 0), MAX_SKIPPED)
        if isinstance(node, NgFailureEvent):  # the live event is not changed: the report may cut links
            self.gym.append(node)
            gym_record = node.to_record()
            gym_record["cause_id"] = cause_id
            gym_record.pop("skipped", None)
            if skipped:
                gym_record["skipped"] = skipped
            return gym_record
        details: dict[str, Any] | None = None
        if isinstance(node, ForeignFailure):
            details = node.details
        elif isinstance(node, BaseExceptionGroup):
            details = {"exceptions": len(node.exceptions)}
        record: FailureEvent = {
            "event_id": eid,
            "failure_kind": None,
            "exception_type": exception_type_name(node),
            "failure_reason": safe_message(node),
            "cause_id": cause_id,
            "details": details,
        }
        if skipped:
            record["skipped"] = skipped
        return record


def _root_beyond(node: BaseException) -> tuple[BaseException, int]:
    """The end of ``node``'s ``__cause__`` chain (cycle-safe, bounded) and how many events lie before it."""
    seen = {id(node)}
    steps = 0
    while steps < _MAX_ROOT_STEPS:
        nxt = node.__cause__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        node = nxt
        steps += 1
    return node, steps


def _walk(error: BaseException | None) -> tuple[FailureReport, list[NgFailureEvent]]:
    """The report for ``error`` and the gym events met while walking it."""
    final = find_boundary_failure(error)
    if error is None or final is None:
        return FailureReport.model_construct(failure_id=None, events={}, truncated=False, dropped=0), []
    walker = _Walker()
    walker.chain(final)
    if error is not final:
        walker.pending.insert(0, error)
    while walker.pending and walker.visits < _MAX_VISITS:
        walker.chain(walker.pending.pop(0))
    events, trimmed = trim_to_count(walker.events, final.event_id, MAX_EVENTS)
    dropped = walker.dropped + trimmed
    report = FailureReport.model_construct(
        failure_id=final.event_id, events=events, truncated=dropped > 0, dropped=min(dropped, MAX_SKIPPED)
    )
    return report, walker.gym

