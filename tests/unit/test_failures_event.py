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
    from gym_obs.telemetry.testing import telemetry_state
    STATE = telemetry_state()

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


# --- audit additions: constructor forms, cause ids, long chains ------------------------------------------


def test_reason_may_be_positional_or_keyword() -> None:
    from gym_obs.failures import NgFailureEvent

    positional = NgFailureEvent(
        "verifier_error", "bad answer", boundary="resources_server", stage="verification"
    )
    keyword = NgFailureEvent(
        failure_kind="verifier_error", failure_reason="bad answer", boundary="resources_server"
    )
    assert positional.failure_reason == keyword.failure_reason == "bad answer"
    assert positional.event_id != keyword.event_id
    with pytest.raises(TypeError):
        NgFailureEvent("verifier_error", "x", "resources_server")  # type: ignore[call-arg]  # boundary is keyword-only


def test_cause_id_follows_raise_from_before_any_report() -> None:
    from gym_obs.failures import NgFailureEvent, failure_report_for

    inner = NgFailureEvent("judge_failed", "judge crashed", boundary="resources_server")
    with pytest.raises(NgFailureEvent) as raised:
        raise NgFailureEvent("verifier_error", boundary="resources_server") from inner
    assert raised.value.cause_id == inner.event_id
    with pytest.raises(NgFailureEvent) as raised_foreign:
        try:
            _ = 1 / 0
        except ZeroDivisionError as zde:
            raise NgFailureEvent("verifier_error", boundary="resources_server") from zde
    outer = raised_foreign.value
    foreign_id = outer.cause_id
    assert foreign_id is not None and foreign_id.startswith("fe_")
    assert outer.cause_id == foreign_id  # stable
    report = failure_report_for(outer)
    assert report.events[outer.event_id]["cause_id"] == foreign_id
    assert report.events[foreign_id]["exception_type"] == "ZeroDivisionError"
    assert outer.to_record()["cause_id"] == foreign_id
    restored = pickle.loads(pickle.dumps(outer))
    assert restored.cause_id == foreign_id and restored.__cause__.event_id == foreign_id


def test_context_alone_never_gives_a_cause_id() -> None:
    from gym_obs.failures import NgFailureEvent

    with pytest.raises(NgFailureEvent) as raised:
        try:
            raise NgFailureEvent("judge_failed", boundary="agent")
        except NgFailureEvent:
            raise NgFailureEvent("agent_run_error", boundary="agent")  # noqa: B904 - the point of the test
    assert raised.value.__context__ is not None
    assert raised.value.cause_id is None


@pytest.mark.parametrize("length", [31, 33, 200, 5000])
def test_pickle_and_report_of_a_very_long_chain_keep_the_root_cause(length: int) -> None:
    from gym_obs.failures import NgFailureEvent, failure_report_for
    from gym_obs.failures._shrink import final_chain

    cause: BaseException = OSError("disk full: the root cause")
    for i in range(length):
        link = KeyError(i) if i % 2 else NgFailureEvent("internal_error", str(i), boundary="agent")
        link.__cause__ = cause
        cause = link
    top = NgFailureEvent("agent_run_error", "top", boundary="agent")
    top.__cause__ = cause
    report = failure_report_for(top)
    chain = final_chain(report.events, top.event_id)
    assert report.events[chain[-1]]["failure_reason"] == "disk full: the root cause"
    assert len(chain) + sum(r.get("skipped", 0) for r in report.events.values()) == length + 2
    restored = pickle.loads(pickle.dumps(top))  # no RecursionError, however long the chain
    links, skipped, node = 0, 0, restored
    while node.__cause__ is not None:
        skipped += getattr(node, "skipped_causes", 0)
        node = node.__cause__
        links += 1
    assert str(node) == "OSError: disk full: the root cause"
    assert links + skipped == length + 1
    assert links <= 33


def test_reason_none_or_unprintable_is_not_an_error() -> None:
    from gym_obs.failures import NgFailureEvent

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert NgFailureEvent("internal_error", None, boundary="agent").failure_reason == ""  # type: ignore[arg-type]
    unprintable = NgFailureEvent("internal_error", Unprintable(), boundary="agent")  # type: ignore[arg-type]
    assert unprintable.failure_reason == "<unprintable reason>"


def test_empty_labels_and_undecodable_text_still_give_a_report_a_peer_accepts() -> None:
    from gym_obs.failures import (
        NgFailureEvent,
        decode_failure_report,
        encode_failure_report,
        failure_report_for,
        rebuild_failure,
    )
    from gym_obs.telemetry.testing import telemetry_state
    STATE = telemetry_state()

    saved = STATE.server_name
    STATE.server_name = ""  # setup_telemetry("") leaves an empty server name
    try:
        with rollout_context(""):
            event = NgFailureEvent(
                "internal_error", "bad \udcff name", boundary="agent", details={"path\udcff": ["\udcfe"]}
            )
    finally:
        STATE.server_name = saved
    event.__cause__ = OSError("cannot open \udcfe.txt")  # surrogate-escaped file name
    assert event.server_name is None and event.rollout_id is None
    decoded = decode_failure_report(encode_failure_report(failure_report_for(event)))
    rebuilt = rebuild_failure(decoded)
    assert rebuilt is not None and rebuilt.event_id == event.event_id
    assert rebuilt.failure_reason == "bad ? name"
    assert str(rebuilt.__cause__) == "OSError: cannot open ?.txt"
    restored = pickle.loads(pickle.dumps(event))
    assert restored.failure_reason == "bad ? name"
