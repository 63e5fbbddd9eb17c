"""NgFailureEvent: the exception a boundary raises and the record it serialises to.

One object plays both roles so that what a handler raises is exactly what crosses the wire: ``to_record()``
gives the JSON-ready record (shape documented in :mod:`gym_obs.failures.report`) and ``from_record()``
rebuilds it on the other side with its original ids. A non-gym exception in a cause chain is rebuilt as a
:class:`ForeignFailure`, which carries the type name and message only (never anything executable).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any, TypeAlias

from gym_obs.failures._base import (
    MAX_DEPTH,
    MAX_HTTP_STATUS,
    MAX_LABEL_CHARS,
    MAX_REASON_CHARS,
    MAX_TYPE_NAME_CHARS,
    MIN_HTTP_STATUS,
    bounded,
    new_event_id,
    utf8_safe,
)
from gym_obs.failures._details import sanitize_details
from gym_obs.failures._validation import validate_record
from gym_obs.failures.errors import InvalidFailureReport
from gym_obs.failures.kinds import BOUNDARIES, STAGES, Boundary, Stage, validate_failure_kind
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.propagation import current_rollout_id
from gym_obs.telemetry.redaction import scrub_text
from gym_obs.telemetry.spans import current_ids

__all__ = [
    "FailureEvent",
    "ForeignFailure",
    "NgFailureEvent",
    "exception_type_name",
    "safe_message",
]

FailureEvent: TypeAlias = dict[str, Any]
"""A failure record: the JSON-ready dict form of an event (see :mod:`gym_obs.failures.report`)."""

_ID_ATTR = "_ng_event_id"
_UNSET: Any = object()
_EVENT_ATTRIBUTES = frozenset(
    {
        "failure_kind", "failure_reason", "boundary", "stage", "http_status", "details", "event_id",
        "cause_id", "_cause_id", "trace_id", "span_id", "rollout_id", "server_name", "timestamp",
        "skipped_causes",
        "http_error", "_observed", "__notes__",
    }
)


class NgFailureEvent(Exception):
    """A typed failure observed at a boundary; raise it ``from`` its cause so the cause is kept.

    ``failure_reason`` is scrubbed of secrets and bounded; ``details`` is a small JSON-ready dict (bounded,
    scrubbed). Ids (event, trace, span, rollout) and the server name are taken from the current context
    when the event is created. ``http_error`` is set on the caller side by ``raise_boundary_failure``: the
    picklable HTTP error of this hop (status, bounded body, redacted request info).
    """

    failure_kind: str
    failure_reason: str
    boundary: str
    stage: str | None
    http_status: int | None
    details: dict[str, Any] | None
    event_id: str
    trace_id: str | None
    span_id: str | None
    rollout_id: str | None
    server_name: str | None
    timestamp: float
    skipped_causes: int
    http_error: BaseException | None

    def __init__(
        self,
        failure_kind: str,
        failure_reason: str = "",
        *,
        boundary: Boundary,
        stage: Stage | None = None,
        http_status: int | None = None,
        details: Mapping[str, object] | None = None,
    ) -> None:
        if boundary not in BOUNDARIES:
            raise ValueError(f"unknown failure boundary {boundary!r}; expected one of {sorted(BOUNDARIES)}")
        if stage is not None and stage not in STAGES:
            raise ValueError(f"unknown failure stage {stage!r}; expected one of {sorted(STAGES)}")
        kind = validate_failure_kind(failure_kind)
        reason = _clean_reason(failure_reason)
        super().__init__(kind, reason)
        self.failure_kind = kind
        self.failure_reason = reason
        self.boundary = boundary
        self.stage = stage
        self.http_status = _clean_status(http_status)
        self.details = sanitize_details(details)
        self.event_id = new_event_id()
        self._cause_id: str | None = _UNSET
        self.trace_id, self.span_id = current_ids()
        self.rollout_id = _clean_label(current_rollout_id())
        self.server_name = _clean_label(STATE.server_name)
        self.timestamp = time.time()
        self.skipped_causes = 0
        self.http_error = None
        self._observed = False

    @property
    def cause_id(self) -> str | None:
        """The event id of the explicit cause (``raise … from cause``), ``None`` without one.

        Derived from ``__cause__`` until a report walk or a rebuild sets it (a walk may link past events it
        cut out); a non-gym cause gets a stable id that its foreign-cause record will carry.
        """
        explicit = self._cause_id
        return _cause_event_id(self.__cause__) if explicit is _UNSET else explicit

    @cause_id.setter
    def cause_id(self, value: str | None) -> None:
        self._cause_id = value

    def __str__(self) -> str:
        where = f"{self.boundary} {self.failure_kind}"
        if self.stage is not None:
            where += f" ({self.stage})"
        return f"{where}: {self.failure_reason}" if self.failure_reason else where

    def to_record(self) -> FailureEvent:
        """The JSON-ready record of this event (``skipped`` only when causes were cut out)."""
        record: FailureEvent = {
            "event_id": self.event_id,
            "failure_kind": self.failure_kind,
            "failure_reason": self.failure_reason,
            "boundary": self.boundary,
            "stage": self.stage,
            "http_status": self.http_status,
            "details": self.details,
            "cause_id": self.cause_id,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "rollout_id": self.rollout_id,
            "server_name": self.server_name,
            "timestamp": self.timestamp,
        }
        if self.skipped_causes:
            record["skipped"] = self.skipped_causes
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NgFailureEvent:
        """Rebuild an event with its original ids; raises ``InvalidFailureReport`` for a bad record.

        A rebuilt event counts as already observed: it was counted where it was created.
        """
        clean = validate_record(None, record)
        if clean["failure_kind"] is None:
            raise InvalidFailureReport("a foreign-cause record is not a gym failure event")
        return _event_from_clean(cls, clean)

    def __reduce__(self) -> tuple[Any, ...]:
        extra = {k: v for k, v in self.__dict__.items() if k not in _EVENT_ATTRIBUTES}  # subclass state
        return (
            _restore_event,
            (type(self), self.to_record(), self.http_error, _bounded_cause(self.__cause__), self._observed),
            extra or None,
        )


class ForeignFailure(Exception):
    """A non-gym exception from a cause chain, rebuilt from its record: type name and message only."""

    def __init__(
        self,
        exception_type: str,
        message: str = "",
        *,
        event_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(exception_type, message)
        self.exception_type = exception_type
        self.message = message
        self.event_id = event_id
        self.details = details
        self.skipped_causes = 0

    def __str__(self) -> str:
        return f"{self.exception_type}: {self.message}" if self.message else self.exception_type

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_foreign, (self.exception_type, self.message, self.event_id, self.details,
                                   self.skipped_causes, picklable_cause(self.__cause__)))

    @classmethod
    def from_exception(cls, error: BaseException) -> ForeignFailure:
        """The type name and bounded, scrubbed message of ``error``; never raises."""
        if isinstance(error, ForeignFailure):
            return error
        return cls(exception_type_name(error), safe_message(error), event_id=getattr(error, _ID_ATTR, None))


def exception_type_name(error: BaseException) -> str:
    """``module.QualName`` of the exception type (just ``QualName`` for builtins), bounded."""
    if isinstance(error, ForeignFailure):
        return error.exception_type
    cls = type(error)
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", None) or cls.__name__
    full = name if module in (None, "builtins") else f"{module}.{name}"
    return bounded(utf8_safe(str(full)), MAX_TYPE_NAME_CHARS) or "Exception"


def safe_message(error: BaseException) -> str:
    """``str(error)`` bounded and scrubbed; a failing ``__str__`` yields a placeholder."""
    if isinstance(error, ForeignFailure):
        return error.message
    try:
        text = str(error)
    except Exception:
        return "<unprintable exception>"
    return _clean_reason(text)


def picklable_cause(cause: BaseException | None, _depth: int = 0) -> BaseException | None:
    """``cause`` if it is a gym failure (or already foreign), else a ForeignFailure standing in for it."""
    if cause is None or isinstance(cause, NgFailureEvent | ForeignFailure):
        return cause
    foreign = ForeignFailure.from_exception(cause)
    nxt = cause.__cause__
    if nxt is None or nxt is cause:
        return foreign
    if _depth < MAX_DEPTH:
        foreign.__cause__ = picklable_cause(nxt, _depth + 1)
        return foreign
    root, jumped = _chain_root(nxt, {id(cause)})  # too long: skip to the root cause, and say how many
    if jumped or root is not cause:
        foreign = ForeignFailure(
            foreign.exception_type, foreign.message, event_id=foreign.event_id, details=foreign.details
        )
        foreign.skipped_causes = jumped
        if isinstance(root, NgFailureEvent | ForeignFailure):
            foreign.__cause__ = root
        else:
            foreign.__cause__ = ForeignFailure.from_exception(root)
    return foreign


def _bounded_cause(cause: BaseException | None) -> BaseException | None:
    """The cause chain to pickle: as is up to ``MAX_DEPTH`` links, else copies of the first links and the
    root cause with the gap counted (pickle recurses once per link, so a long chain would overflow)."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    node = cause
    while node is not None and id(node) not in seen and len(chain) < 1_000_000:
        seen.add(id(node))
        chain.append(node)
        node = node.__cause__
    if len(chain) <= MAX_DEPTH:
        return picklable_cause(cause)
    keep = [*chain[: MAX_DEPTH - 1], chain[-1]]
    copies: list[NgFailureEvent | ForeignFailure] = [_detached_copy(link) for link in keep]
    for upper, lower in itertools.pairwise(copies):
        upper.__cause__ = lower
    before_gap = copies[-2]
    before_gap.skipped_causes += len(chain) - len(keep)
    if isinstance(before_gap, NgFailureEvent):
        before_gap.cause_id = _cause_event_id(keep[-1])
    return copies[0]


def _detached_copy(error: BaseException) -> NgFailureEvent | ForeignFailure:
    """A cause-less copy of one link: a gym event keeps its record and ``http_error``."""
    if isinstance(error, NgFailureEvent):
        event = _event_from_clean(type(error), error.to_record())
        event.http_error = error.http_error
        event._observed = error._observed
        return event
    foreign = ForeignFailure.from_exception(error)
    event_id = foreign.event_id or _cause_event_id(error)
    copy = ForeignFailure(foreign.exception_type, foreign.message, event_id=event_id, details=foreign.details)
    copy.skipped_causes = foreign.skipped_causes if foreign is error else 0
    return copy


def _chain_root(node: BaseException, seen: set[int]) -> tuple[BaseException, int]:
    """The last exception of ``node``'s ``__cause__`` chain (cycle-safe) and how many lie before it."""
    steps = 0
    seen.add(id(node))
    while node.__cause__ is not None and id(node.__cause__) not in seen and steps < 1_000_000:
        node = node.__cause__
        seen.add(id(node))
        steps += 1
    return node, steps


def _cause_event_id(cause: BaseException | None) -> str | None:
    """The id a report gives ``cause`` (assigned once and kept on the exception); never raises."""
    if cause is None:
        return None
    own = cause.event_id if isinstance(cause, NgFailureEvent | ForeignFailure) else None
    if own is not None:
        return own
    existing = getattr(cause, _ID_ATTR, None)
    if isinstance(existing, str):
        return existing
    eid = new_event_id()
    try:
        setattr(cause, _ID_ATTR, eid)
    except Exception:
        return None
    return eid


def _clean_reason(reason: object) -> str:
    if reason is None:
        return ""
    try:
        text = reason if isinstance(reason, str) else str(reason)
    except Exception:
        return "<unprintable reason>"
    if not text:
        return ""
    # Cut generously before scrubbing (bounded cost), then to the final bound.
    return bounded(utf8_safe(scrub_text(text[: MAX_REASON_CHARS * 4])), MAX_REASON_CHARS)


def _clean_status(status: object) -> int | None:
    if isinstance(status, bool) or not isinstance(status, int):
        return None
    return status if MIN_HTTP_STATUS <= status <= MAX_HTTP_STATUS else None


def _clean_label(value: object) -> str | None:
    """A context label as a record accepts it: ``None`` when unset or empty, else bounded UTF-8 text."""
    if value is None or value == "":
        return None
    text = value if isinstance(value, str) else str(value)
    return utf8_safe(text[:MAX_LABEL_CHARS]) or None


def _event_from_clean(cls: type[NgFailureEvent], clean: Mapping[str, Any]) -> NgFailureEvent:
    """Build an event from an already validated record without running ``__init__``."""
    event = cls.__new__(cls)
    Exception.__init__(event, clean["failure_kind"], clean["failure_reason"])
    event.failure_kind = clean["failure_kind"]
    event.failure_reason = clean["failure_reason"]
    event.boundary = clean["boundary"]
    event.stage = clean["stage"]
    event.http_status = clean["http_status"]
    event.details = clean["details"]
    event.event_id = clean["event_id"]
    event.cause_id = clean["cause_id"]
    event.trace_id = clean["trace_id"]
    event.span_id = clean["span_id"]
    event.rollout_id = clean["rollout_id"]
    event.server_name = clean["server_name"]
    event.timestamp = clean["timestamp"]
    event.skipped_causes = clean.get("skipped", 0)
    event.http_error = None
    event._observed = True
    return event


def _restore_event(
    cls: type[NgFailureEvent],
    record: FailureEvent,
    http_error: BaseException | None,
    cause: BaseException | None,
    observed: bool,
) -> NgFailureEvent:
    event = _event_from_clean(cls, record)
    event.http_error = http_error
    event._observed = observed
    if cause is not None:
        event.__cause__ = cause
    return event


def _restore_foreign(
    exception_type: str,
    message: str,
    event_id: str | None,
    details: dict[str, Any] | None,
    skipped: int,
    cause: BaseException | None,
) -> ForeignFailure:
    foreign = ForeignFailure(exception_type, message, event_id=event_id, details=details)
    foreign.skipped_causes = skipped
    if cause is not None:
        foreign.__cause__ = cause
    return foreign
