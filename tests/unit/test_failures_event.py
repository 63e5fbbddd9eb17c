"""NgFailureEvent and the kind vocabulary: construction, bounds, redaction, records and pickling."""

from __future__ import annotations

import logging
import pickle
import re

import pytest

from gym_obs.failures import (
    BOUNDARIES,
    EVENT_ID_PATTERN,
    FAILURE_KINDS,
    STAGES,
    ForeignFailure,
    InvalidFailureReport,
    NgFailureEvent,
    validate_failure_kind,
)
from gym_obs.failures._base import MAX_DETAILS_BYTES, MAX_REASON_CHARS
from gym_obs.failures.kinds import OTHER_KIND_LABEL, failure_kind_label, is_known_failure_kind
from gym_obs.telemetry.propagation import rollout_context
from gym_obs.telemetry.testing import Capture


def _raise_chain() -> NgFailureEvent:
    try:
        try:
            _ = 1 / 0
        except ZeroDivisionError as zde:
            raise NgFailureEvent("verifier_error", "bad", boundary="resources_server") from zde
    except NgFailureEvent as event:
        return event
    raise AssertionError("unreachable")


# --- kinds -----------------------------------------------------------------------------------------------


def test_vocabulary_is_the_issue_list() -> None:
    assert len(FAILURE_KINDS) == 25
    assert {"transport_unreachable", "verifier_error", "internal_error", "kill_shaped"} <= FAILURE_KINDS
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)+|cancelled|shutdown", k) for k in FAILURE_KINDS)
    assert {"admission", "seed", "agent", "verification", "cleanup"} == STAGES
    assert {"model", "harness", "agent", "resources_server", "environment", "collection"} == BOUNDARIES


def test_namespaced_kinds_are_known() -> None:
    assert is_known_failure_kind("sandbox_env:container_crashed")
    assert failure_kind_label("sandbox_env:container_crashed") == "sandbox_env:container_crashed"
    assert not is_known_failure_kind("Not A Kind")


def test_unknown_kind_is_kept_warned_once_and_labelled_other(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gym_obs.failures")
    name = "weird kind for this test"
    assert validate_failure_kind(name) == name
    assert validate_failure_kind(name) == name
    assert sum(name in r.getMessage() for r in caplog.records) == 1
    assert failure_kind_label(name) == OTHER_KIND_LABEL


@pytest.mark.parametrize("value", [None, 42, b"bytes", "", "x" * 10_000, object()])
def test_validate_failure_kind_never_raises(value: object) -> None:
    kind = validate_failure_kind(value)
    assert isinstance(kind, str)
    assert 0 < len(kind) <= 128


# --- construction ----------------------------------------------------------------------------------------


def test_event_fields_and_ids() -> None:
    event = NgFailureEvent(
        "judge_failed",
        "judge said no",
        boundary="resources_server",
        stage="verification",
        http_status=502,
        details={"judge": "gpt", "attempt": 2},
    )
    assert re.fullmatch(EVENT_ID_PATTERN, event.event_id)
    assert event.failure_kind == "judge_failed"
    assert event.stage == "verification"
    assert event.http_status == 502
    assert event.details == {"judge": "gpt", "attempt": 2}
    assert event.cause_id is None
    assert event.http_error is None
    assert str(event) == "resources_server judge_failed (verification): judge said no"
    assert event.args == ("judge_failed", "judge said no")
    other = NgFailureEvent("judge_failed", boundary="resources_server")
    assert other.event_id != event.event_id
    assert str(other) == "resources_server judge_failed"


@pytest.mark.parametrize("kwargs", [{"boundary": "nowhere"}, {"boundary": "agent", "stage": "later"}])
def test_unknown_boundary_or_stage_is_a_programming_error(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        NgFailureEvent("internal_error", "x", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", [99, 600, True, "500", 5.0])
def test_invalid_http_status_is_dropped(status: object) -> None:
    event = NgFailureEvent("internal_error", boundary="agent", http_status=status)  # type: ignore[arg-type]
    assert event.http_status is None


def test_reason_is_scrubbed_and_bounded() -> None:
    secret = "sk-" + "a" * 40
    event = NgFailureEvent(
        "provider_unavailable", f"call with {secret} failed; " + "x" * 10_000, boundary="model"
    )
    assert secret not in event.failure_reason
    assert "[REDACTED]" in event.failure_reason
    assert len(event.failure_reason) <= MAX_REASON_CHARS


def test_details_are_sanitized() -> None:
    event = NgFailureEvent(
        "agent_run_error",
        boundary="agent",
        details={
            "api_key": "hunter2",
            "url": "https://user:pw@example.com/x?token=abc",
            "nested": {"a": {"b": {"c": {"d": {"e": 1}}}}},
            "items": list(range(100)),
            "obj": object(),
            "big": 10**30,
        },
    )
    details = event.details
    assert details is not None
    assert details["api_key"] == "[REDACTED]"
    assert "pw" not in details["url"] and "abc" not in details["url"]
    assert len(details["items"]) <= 33
    assert isinstance(details["obj"], str)
    assert details["big"] == str(10**30)
    huge = NgFailureEvent(
        "agent_run_error", boundary="agent", details={f"k{i}": "v" * 200 for i in range(30)}
    )
    assert huge.details == {"_truncated": True}
    assert MAX_DETAILS_BYTES < 30 * 200


def test_context_ids_are_captured(telemetry: Capture) -> None:
    assert telemetry is not None
    from gym_obs.telemetry._state import STATE

    assert STATE.tracer is not None
    with STATE.tracer.start_as_current_span("outer") as span, rollout_context("rollout-7"):
        event = NgFailureEvent("agent_timeout", boundary="agent")
    ctx = span.get_span_context()
    assert event.trace_id == format(ctx.trace_id, "032x")
    assert event.span_id == format(ctx.span_id, "016x")
    assert event.rollout_id == "rollout-7"
    assert event.server_name == STATE.server_name
    outside = NgFailureEvent("agent_timeout", boundary="agent")
    assert outside.trace_id is None and outside.span_id is None and outside.rollout_id is None


# --- records ---------------------------------------------------------------------------------------------


def test_record_round_trip_keeps_ids() -> None:
    event = NgFailureEvent(
        "session_lost",
        "gone",
        boundary="environment",
        stage="agent",
        http_status=410,
        details={"session": "s1"},
    )
    record = event.to_record()
    assert set(record) == {
        "event_id",
        "failure_kind",
        "failure_reason",
        "boundary",
        "stage",
        "http_status",
        "details",
        "cause_id",
        "trace_id",
        "span_id",
        "rollout_id",
        "server_name",
        "timestamp",
    }
    rebuilt = NgFailureEvent.from_record(record)
    assert rebuilt.to_record() == record
    assert rebuilt._observed  # counted where it was created, never again


@pytest.mark.parametrize(
    "change",
    [
        {"event_id": "nope"},
        {"boundary": "mars"},
        {"stage": 3},
        {"http_status": 1000},
        {"timestamp": "yesterday"},
        {"trace_id": "xyz"},
        {"failure_kind": None, "exception_type": "ValueError"},
    ],
)
def test_from_record_rejects_bad_records(change: dict[str, object]) -> None:
    record = NgFailureEvent("session_lost", boundary="environment").to_record()
    record.update(change)
    with pytest.raises(InvalidFailureReport):
        NgFailureEvent.from_record(record)


def test_pickle_keeps_ids_causes_and_http_error() -> None:
    event = _raise_chain()
    event.http_error = ValueError("hop error")
    clone = pickle.loads(pickle.dumps(event))
    assert type(clone) is NgFailureEvent
    assert clone.to_record() == event.to_record()
    assert isinstance(clone.http_error, ValueError)
    assert isinstance(clone.__cause__, ForeignFailure)
    assert str(clone.__cause__) == "ZeroDivisionError: division by zero"
    assert pickle.loads(pickle.dumps(clone.__cause__)).exception_type == "ZeroDivisionError"


class _CustomFailure(NgFailureEvent):
    def __init__(self, tool: str) -> None:
        super().__init__("agent_command_not_allowed", f"tool {tool} refused", boundary="agent")
        self.tool = tool


def test_pickle_of_a_subclass_keeps_its_state() -> None:
    event = _CustomFailure("rm")
    clone = pickle.loads(pickle.dumps(event))
    assert type(clone) is _CustomFailure
    assert clone.tool == "rm" and clone.event_id == event.event_id


def test_pickle_of_unpicklable_foreign_cause() -> None:
    class Local(Exception):  # a local class cannot be pickled by reference
        pass

    try:
        try:
            raise Local("locally defined")
        except Local as exc:
            raise NgFailureEvent("internal_error", boundary="agent") from exc
    except NgFailureEvent as event:
        clone = pickle.loads(pickle.dumps(event))
    assert isinstance(clone.__cause__, ForeignFailure)
    assert clone.__cause__.exception_type.endswith("Local")
    assert clone.__cause__.message == "locally defined"


def test_foreign_failure_from_exception_with_broken_str() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    foreign = ForeignFailure.from_exception(Broken())
    assert foreign.message == "<unprintable exception>"
    assert foreign.exception_type.endswith("Broken")
