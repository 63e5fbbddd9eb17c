"""The per-request failure log: observed once, counted once, forwarded reports merged without recounting."""

from __future__ import annotations

import asyncio
from typing import Any

from multidict import CIMultiDict

from gym_obs.failures import (
    FAILURE_REPORT_HEADER,
    FailureReport,
    NgFailureEvent,
    current_failure_log,
    decode_failure_report,
    encode_failure_report,
    failure_report_for,
    observe_failure,
    observe_reply,
    rebuild_failure,
    request_failure_log,
)
from gym_obs.failures._base import MAX_DEPTH, MAX_EVENTS, new_event_id
from gym_obs.failures._shrink import final_chain
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture, telemetry_state

STATE = telemetry_state()


def _failure_counts(telemetry: Capture) -> dict[tuple[str | None, str | None, str | None], Any]:
    points = telemetry.metric_points(names.METRIC_FAILURE_EVENTS)
    return {
        (
            p.attributes.get(names.ATTR_FAILURE_KIND),
            p.attributes.get(names.ATTR_FAILURE_BOUNDARY),
            p.attributes.get(names.ATTR_FAILURE_STAGE),
        ): p.value
        for p in points
    }


def _remote_chain() -> NgFailureEvent:
    """A failure as it arrives from another process: encoded, decoded, rebuilt."""
    remote = NgFailureEvent("verifier_error", "verify", boundary="resources_server", stage="verification")
    remote.__cause__ = ZeroDivisionError("division by zero")
    rebuilt = rebuild_failure(decode_failure_report(encode_failure_report(failure_report_for(remote))))
    assert rebuilt is not None
    return rebuilt


def test_first_observation_counts_once_and_adds_a_span_event(telemetry: Capture) -> None:
    assert STATE.tracer is not None
    cause = NgFailureEvent("judge_failed", "judge", boundary="resources_server", stage="verification")
    final = NgFailureEvent("verifier_error", "verify", boundary="resources_server", stage="verification")
    final.__cause__ = cause
    with request_failure_log() as log, STATE.tracer.start_as_current_span("handler"):
        observe_failure(final)
        observe_failure(final)  # again: no second count
        observe_failure(cause)
    assert set(log.events) == {final.event_id, cause.event_id}
    assert _failure_counts(telemetry) == {
        ("verifier_error", "resources_server", "verification"): 1,
        ("judge_failed", "resources_server", "verification"): 1,
    }
    (span,) = telemetry.spans("handler")
    events = [e for e in span.events if e.name == names.SPAN_EVENT_EXCEPTION]
    assert len(events) == 2
    by_id = {e.attributes[names.ATTR_FAILURE_EVENT_ID]: e.attributes for e in events}  # type: ignore[index]
    attrs = by_id[final.event_id]
    assert attrs[names.ATTR_FAILURE_KIND] == "verifier_error"
    assert attrs[names.ATTR_FAILURE_BOUNDARY] == "resources_server"
    assert attrs[names.ATTR_FAILURE_STAGE] == "verification"
    assert attrs[names.ATTR_FAILURE_REASON] == "verify"
    assert attrs[names.ATTR_FAILURE_CAUSE_ID] == cause.event_id


def test_forwarded_failures_are_never_counted_again(telemetry: Capture) -> None:
    rebuilt = _remote_chain()
    with request_failure_log() as log:
        observe_failure(rebuilt)
        wrapper = NgFailureEvent("agent_request_failed", boundary="agent")
        wrapper.__cause__ = rebuilt
        observe_failure(wrapper)
    assert _failure_counts(telemetry) == {("agent_request_failed", "agent", None): 1}
    assert len(log) == 3  # wrapper, remote verifier_error, its foreign root


def test_unknown_kinds_are_counted_as_other(telemetry: Capture) -> None:
    observe_failure(NgFailureEvent("brand new kind!", boundary="harness"))
    assert _failure_counts(telemetry) == {("_OTHER", "harness", None): 1}


def test_off_means_no_count_but_the_log_still_records() -> None:
    assert not STATE.enabled
    event = NgFailureEvent("transport_timeout", boundary="model")
    with request_failure_log() as log:
        observe_failure(event)
    assert list(log.events) == [event.event_id]
    assert current_failure_log() is None


def test_observe_reply_merges_without_duplicates_or_counting(telemetry: Capture) -> None:
    recovered = NgFailureEvent("transport_peer_drop", "retried", boundary="model")
    value = encode_failure_report(failure_report_for(recovered))
    with request_failure_log() as log:
        assert observe_reply({FAILURE_REPORT_HEADER: value}) is not None
        assert observe_reply(CIMultiDict({FAILURE_REPORT_HEADER.lower(): value})) is not None

        class Reply:
            def __init__(self) -> None:
                self.headers = {"x-ng-failure-report": value}

        observe_reply(Reply())
        assert observe_reply({FAILURE_REPORT_HEADER: "v1.garbage"}) is None
        assert observe_reply({}) is None
        assert observe_reply(object()) is None
    assert list(log.events) == [recovered.event_id]
    assert telemetry.metric_points(names.METRIC_FAILURE_EVENTS) == []


def test_report_at_reply_time() -> None:
    with request_failure_log() as log:
        assert log.report() is None
        recovered = NgFailureEvent("transport_timeout", "first attempt", boundary="model")
        observe_failure(recovered)
        success = log.report()
        assert success is not None and success.failure_id is None
        assert list(success.events) == [recovered.event_id]
        final = NgFailureEvent("agent_run_error", boundary="agent")
        final.__cause__ = ValueError("root")
        failure = log.report(final=final)
    assert failure is not None and failure.failure_id == final.event_id
    assert recovered.event_id in failure.events
    assert len(final_chain(failure.events, failure.failure_id)) == 2
    FailureReport.from_payload(failure.to_payload())


def test_log_is_shared_by_tasks_of_the_request() -> None:
    async def main() -> int:
        with request_failure_log() as log:

            async def child(i: int) -> None:
                observe_failure(NgFailureEvent("transport_timeout", str(i), boundary="model"))

            await asyncio.gather(*(child(i) for i in range(5)))
            return len(log)

    assert asyncio.run(main()) == 5


def test_merge_refuses_a_report_that_conflicts_with_the_log() -> None:
    def record(eid: str, cause: str | None) -> dict[str, Any]:
        rec = NgFailureEvent("internal_error", boundary="agent").to_record()
        rec.update(event_id=eid, cause_id=cause)
        return rec

    def chain(ids: list[str]) -> dict[str, Any]:
        return {eid: record(eid, nxt) for eid, nxt in zip(ids, [*ids[1:], None], strict=True)}

    shared = new_event_id()
    below = [shared] + [new_event_id() for _ in range(19)]  # shared -> 19 more
    above = [new_event_id() for _ in range(19)] + [shared]  # 19 -> shared (its root in that report)
    with request_failure_log() as log:
        log.merge(FailureReport(events=chain(below)))
        log.merge(FailureReport(events=chain(above)))  # valid alone; together a chain of 39 > MAX_DEPTH
        assert set(log.events) == set(below)
        extra = new_event_id()
        log.merge(FailureReport(events=chain([extra])))
        assert extra in log.events


def test_log_is_bounded() -> None:
    with request_failure_log() as log:
        for i in range(MAX_EVENTS * 2):
            observe_failure(NgFailureEvent("transport_timeout", str(i), boundary="model"))
        report = log.report()
    assert len(log) == MAX_EVENTS
    assert report is not None and report.truncated and report.dropped == MAX_EVENTS


def test_report_around_the_observed_walk_is_the_report_of_the_final_failure() -> None:
    with request_failure_log() as log:
        observe_failure(NgFailureEvent("transport_timeout", "first attempt", boundary="model"))
        final = NgFailureEvent("agent_run_error", boundary="agent")
        final.__cause__ = _remote_chain()
        around = log.report_around(observe_failure(final))  # one walk of the chain
        walked = log.report(final=final)  # walks it again
    assert around is not None and walked is not None
    assert around.to_payload() == walked.to_payload()
    assert len(around.events) == 4


def test_a_chain_that_cannot_join_the_final_one_leaves_the_other_recovered_failures_reported() -> None:
    # A forwarded chain as deep as a report allows, ending in an event y, was observed; the final failure
    # then arrives with y rebuilt (same id) on top of 20 more causes: y's forwarded chain would now be
    # too deep. Only that chain is left out; an unrelated recovered failure is still reported.
    y = NgFailureEvent("judge_failed", "judge", boundary="resources_server")
    head: NgFailureEvent = y
    for i in range(MAX_DEPTH - 1):
        above = NgFailureEvent("verifier_error", str(i), boundary="resources_server")
        above.__cause__ = head
        head = above
    forwarded = failure_report_for(head)
    assert len(forwarded.events) == MAX_DEPTH and forwarded.dropped == 0
    y_again = rebuild_failure(FailureReport(failure_id=y.event_id, events={y.event_id: y.to_record()}))
    assert y_again is not None
    cause: BaseException | None = None
    for i in range(20):
        error = ValueError(str(i))
        error.__cause__ = cause
        cause = error
    y_again.__cause__ = cause
    final = NgFailureEvent("agent_run_error", boundary="agent")
    final.__cause__ = y_again
    with request_failure_log() as log:
        log.merge(forwarded)
        recovered = NgFailureEvent("transport_timeout", "first attempt", boundary="model")
        observe_failure(recovered)
        report = log.report(final=final)
    assert report is not None and report.failure_id == final.event_id
    assert recovered.event_id in report.events
    assert len(final_chain(report.events, report.failure_id)) == 22
    assert head.event_id not in report.events  # the chain that did not fit
    FailureReport.from_payload(report.to_payload())
