"""The failure model: typed failure events with explicit causes that cross HTTP hops intact.

Nothing here imports aiohttp or FastAPI; the client half (``raise_boundary_failure``) lives in
:mod:`gym_obs.client.boundary` and the server half in the server middleware.
"""

from __future__ import annotations

from gym_obs.failures._base import EVENT_ID_PATTERN
from gym_obs.failures._codec import MAX_DECOMPRESSED_BYTES, MAX_ENCODED_CHARS, VERSION_PREFIX
from gym_obs.failures.causes import cause_types, caused_by
from gym_obs.failures.errors import InvalidFailureReport
from gym_obs.failures.event import FailureEvent, ForeignFailure, NgFailureEvent
from gym_obs.failures.kinds import (
    BOUNDARIES,
    FAILURE_KINDS,
    STAGES,
    Boundary,
    FailureKind,
    Stage,
    validate_failure_kind,
)
from gym_obs.failures.report import (
    FailureReport,
    failure_report_for,
    find_boundary_failure,
    rebuild_failure,
    validate_failure_event_map,
)
from gym_obs.failures.rows import read_report_from_row, store_report_on_row
from gym_obs.failures.transport import (
    FAILURE_REPORT_BODY_KEY,
    FAILURE_REPORT_HEADER,
    RequestFailureLog,
    current_failure_log,
    decode_failure_report,
    encode_failure_report,
    observe_failure,
    observe_reply,
    request_failure_log,
)

__all__ = [
    "BOUNDARIES",
    "EVENT_ID_PATTERN",
    "FAILURE_KINDS",
    "FAILURE_REPORT_BODY_KEY",
    "FAILURE_REPORT_HEADER",
    "MAX_DECOMPRESSED_BYTES",
    "MAX_ENCODED_CHARS",
    "STAGES",
    "VERSION_PREFIX",
    "Boundary",
    "FailureEvent",
    "FailureKind",
    "FailureReport",
    "ForeignFailure",
    "InvalidFailureReport",
    "NgFailureEvent",
    "RequestFailureLog",
    "Stage",
    "cause_types",
    "caused_by",
    "current_failure_log",
    "decode_failure_report",
    "encode_failure_report",
    "failure_report_for",
    "find_boundary_failure",
    "observe_failure",
    "observe_reply",
    "read_report_from_row",
    "rebuild_failure",
    "request_failure_log",
    "store_report_on_row",
    "validate_failure_event_map",
    "validate_failure_kind",
]
