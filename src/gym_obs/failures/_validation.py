"""Validation of failure records and event maps that came from another process (hostile until checked).

Structure is checked strictly (types, id formats, known boundaries and stages, cause links, cycles, counts,
depth); free text is bounded rather than rejected, so a peer with longer limits does not lose its failure.
Every check is linear in the input and raises only ``InvalidFailureReport``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gym_obs.failures._base import (
    EVENT_ID_RE,
    MAX_DEPTH,
    MAX_EVENTS,
    MAX_HTTP_STATUS,
    MAX_LABEL_CHARS,
    MAX_REASON_CHARS,
    MAX_SKIPPED,
    MAX_TYPE_NAME_CHARS,
    MIN_HTTP_STATUS,
    SPAN_ID_RE,
    TRACE_ID_RE,
    bounded,
    without_controls,
)
from gym_obs.failures._details import check_remote_details
from gym_obs.failures.errors import InvalidFailureReport
from gym_obs.failures.kinds import (
    BOUNDARIES,
    FAILURE_KINDS,
    MAX_KIND_CHARS,
    STAGES,
    UNKNOWN_REMOTE_KIND,
    is_known_failure_kind,
)
from gym_obs.telemetry.redaction import scrub_text

_MAX_RECORD_KEYS = 32
# ``module.QualName`` (``<locals>`` allowed between parts): what exception_type_name() produces.
_TYPE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.(?:<locals>|[A-Za-z_][A-Za-z0-9_]*))*")
_KIND_SHAPE_RE = re.compile(r"[a-z][a-z0-9]{0,30}(?:_[a-z0-9]{1,30}){1,6}")
INVALID_TYPE_NAME = "UnknownException"
"""A peer's exception type name that is not an identifier path (or looks like a secret) becomes this."""


def remote_text(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """A peer's free text: bounded, scrubbed again (a peer may be older, buggy or hostile) and free of
    control characters (newline and tab are kept)."""
    return scrub_text(without_controls(bounded(text, limit), keep_lines=True))[:limit]


def remote_label(text: str, limit: int) -> str:
    """A peer's short label (rollout id, server name, details key): one line, scrubbed, bounded."""
    return scrub_text(without_controls(text)[:limit])[:limit]


def _remote_reason(reason: str) -> str:
    return remote_text(reason, MAX_REASON_CHARS)


def _remote_kind(kind: str) -> str:
    """A vocabulary kind, else one shaped like a kind (``<domain>_<condition>`` from a peer with a newer
    vocabulary, or namespaced ``<server>:<kind>``) that holds no secret; anything else is ``unknown``."""
    if kind in FAILURE_KINDS:
        return kind
    if (_KIND_SHAPE_RE.fullmatch(kind) or is_known_failure_kind(kind)) and scrub_text(kind) == kind:
        return kind
    return UNKNOWN_REMOTE_KIND


def _remote_type_name(value: object) -> str | None:
    name = _label(value, "exception_type", MAX_TYPE_NAME_CHARS)
    if name is None:
        return None
    if _TYPE_NAME_RE.fullmatch(name) is None or scrub_text(name) != name:
        return INVALID_TYPE_NAME
    return name


def validate_record(key: object, record: object) -> dict[str, Any]:
    """A normalized copy of one record (unknown keys dropped); ``key`` must equal its event id if given."""
    if not isinstance(record, Mapping):
        raise InvalidFailureReport("a failure record must be an object")
    if len(record) > _MAX_RECORD_KEYS:
        raise InvalidFailureReport("a failure record has too many fields")
    event_id = _event_id(record.get("event_id"), "event_id")
    if event_id is None:
        raise InvalidFailureReport("a failure record needs an event_id")
    if key is not None and key != event_id:
        raise InvalidFailureReport("an event map key differs from its record's event_id")
    cause_id = _event_id(record.get("cause_id"), "cause_id")
    if cause_id == event_id:
        raise InvalidFailureReport("a failure record names itself as its cause")
    reason = record.get("failure_reason")
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise InvalidFailureReport("failure_reason must be a string")
    skipped = record.get("skipped", 0)
    if not _is_int(skipped) or not 0 <= skipped <= MAX_SKIPPED:
        raise InvalidFailureReport("skipped must be a small non-negative integer")
    kind = record.get("failure_kind")
    clean: dict[str, Any]
    if kind is None:
        clean = {
            "event_id": event_id,
            "failure_kind": None,
            "exception_type": _remote_type_name(record.get("exception_type")),
            "failure_reason": _remote_reason(reason),
            "cause_id": cause_id,
            "details": check_remote_details(record.get("details")),
        }
        if clean["exception_type"] is None:
            raise InvalidFailureReport("a foreign-cause record needs an exception_type")
    else:
        clean = _gym_record(record, event_id, cause_id, kind, _remote_reason(reason))
    if skipped:
        clean["skipped"] = skipped
    return clean


def validate_event_map(events: object) -> dict[str, dict[str, Any]]:
    """Validate every record, then the graph: causes resolve, no cycle, depth and count bounded."""
    if not isinstance(events, Mapping):
        raise InvalidFailureReport("events must be an object keyed by event id")
    if len(events) > MAX_EVENTS:
        raise InvalidFailureReport(f"too many failure events ({len(events)} > {MAX_EVENTS})")
    clean = {key: validate_record(key, record) for key, record in events.items()}
    check_graph(clean)
    return clean


def check_graph(events: Mapping[str, Mapping[str, Any]]) -> None:
    """Every cause resolves, no cycle, no chain longer than ``MAX_DEPTH``."""
    depth: dict[str, int] = {}
    for start in events:
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node not in depth:
            if node in on_path:
                raise InvalidFailureReport("the cause links form a cycle")
            record = events.get(node)
            if record is None:
                raise InvalidFailureReport("a cause_id does not resolve to an event in the report")
            path.append(node)
            on_path.add(node)
            node = record["cause_id"]
        below = 0 if node is None else depth[node]
        for item in reversed(path):
            below += 1
            if below > MAX_DEPTH:
                raise InvalidFailureReport(f"a cause chain is deeper than {MAX_DEPTH}")
            depth[item] = below


def _gym_record(
    record: Mapping[str, Any], event_id: str, cause_id: str | None, kind: object, reason: str
) -> dict[str, Any]:
    if not isinstance(kind, str) or not kind or len(kind) > MAX_KIND_CHARS:
        raise InvalidFailureReport("failure_kind must be a short string")
    boundary = record.get("boundary")
    if not isinstance(boundary, str) or boundary not in BOUNDARIES:
        raise InvalidFailureReport("boundary must be a known failure boundary")
    stage = record.get("stage")
    if stage is not None and (not isinstance(stage, str) or stage not in STAGES):
        raise InvalidFailureReport("stage must be a known failure stage or null")
    status = record.get("http_status")
    if status is not None and (not _is_int(status) or not MIN_HTTP_STATUS <= status <= MAX_HTTP_STATUS):
        raise InvalidFailureReport("http_status must be an HTTP status code or null")
    timestamp = _finite(record.get("timestamp"))
    return {
        "event_id": event_id,
        "failure_kind": _remote_kind(kind),
        "failure_reason": reason,
        "boundary": boundary,
        "stage": stage,
        "http_status": status,
        "details": check_remote_details(record.get("details")),
        "cause_id": cause_id,
        "trace_id": _hex(record.get("trace_id"), "trace_id", TRACE_ID_RE),
        "span_id": _hex(record.get("span_id"), "span_id", SPAN_ID_RE),
        "rollout_id": _remote_label(record.get("rollout_id"), "rollout_id"),
        "server_name": _remote_label(record.get("server_name"), "server_name"),
        "timestamp": timestamp,
    }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: object) -> float:
    try:
        if _is_int(value) or isinstance(value, float):
            number = float(value)  # type: ignore[arg-type]
            if math.isfinite(number):
                return number
    except OverflowError:
        pass
    raise InvalidFailureReport("timestamp must be a finite number")


def _event_id(value: object, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or EVENT_ID_RE.fullmatch(value) is None:
        raise InvalidFailureReport(f"{field} is not a well-formed event id")
    return value


def _hex(value: object, field: str, pattern: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise InvalidFailureReport(f"{field} is not well formed")
    return value


def _remote_label(value: object, field: str) -> str | None:
    label = _label(value, field, MAX_LABEL_CHARS)
    return None if label is None else (remote_label(label, MAX_LABEL_CHARS) or None)


def _label(value: object, field: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limit:
        raise InvalidFailureReport(f"{field} must be a non-empty string of at most {limit} characters")
    return value
