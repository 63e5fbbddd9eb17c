"""failure_report_for / rebuild_failure / validation: explicit causes only, foreign causes, groups, cycles."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_obs.failures import (
    FailureReport,
    ForeignFailure,
    InvalidFailureReport,
    NgFailureEvent,
    failure_report_for,
    find_boundary_failure,
    rebuild_failure,
    validate_failure_event_map,
)
from gym_obs.failures._base import MAX_DEPTH, MAX_EVENTS, new_event_id
from gym_obs.failures._shrink import final_chain


def _event(kind: str = "internal_error", reason: str = "", **kwargs: Any) -> NgFailureEvent:
    kwargs.setdefault("boundary", "agent")
    return NgFailureEvent(kind, reason, **kwargs)


def _chain(*errors: BaseException) -> BaseException:
    """Link errors[0] <- errors[1] <- ... via __cause__ (errors[-1] is the outermost)."""
    for inner, outer in itertools.pairwise(errors):
        outer.__cause__ = inner
    return errors[-1]


def _valid(report: FailureReport) -> FailureReport:
    """A walked report always passes the validator a peer will run."""
    return FailureReport.from_payload(copy.deepcopy(report.to_payload()))


def test_three_event_chain() -> None:
    root = ZeroDivisionError("division by zero")
    mid = _event("verifier_error", "verify", boundary="resources_server")
    top = _event("agent_request_failed", "call")
    _chain(root, mid, top)
    report = _valid(failure_report_for(top))
    assert report.failure_id == top.event_id
    chain = final_chain(report.events, report.failure_id)
    assert chain[:2] == [top.event_id, mid.event_id]
    foreign = report.events[chain[2]]
    assert foreign["failure_kind"] is None
    assert foreign["exception_type"] == "ZeroDivisionError"
    assert foreign["failure_reason"] == "division by zero"
    assert top.cause_id == mid.event_id and mid.cause_id == chain[2]
    assert not report.truncated and report.dropped == 0


def test_context_is_never_a_cause() -> None:
    caught: NgFailureEvent | None = None
    try:
        try:
            raise KeyError("implicit")
        except KeyError:
            raise _event("internal_error", "no from")  # noqa: B904 - the point of the test
    except NgFailureEvent as event:
        caught = event
    assert caught is not None and isinstance(caught.__context__, KeyError)
    report = failure_report_for(caught)
    assert list(report.events) == [caught.event_id]
    assert report.events[caught.event_id]["cause_id"] is None


def test_foreign_ids_are_stable_across_reports() -> None:
    event = _chain(ValueError("v"), _event())
    first = failure_report_for(event)
    second = failure_report_for(event)
    assert set(first.events) == set(second.events)


def test_non_gym_error_has_an_empty_report_and_wrappers_are_secondary() -> None:
    assert failure_report_for(ValueError("plain")).events == {}
    assert failure_report_for(None).failure_id is None
    inner = _event("judge_failed", boundary="resources_server")
    wrapper = _chain(inner, RuntimeError("wrapped"))
    assert find_boundary_failure(wrapper) is inner
    report = _valid(failure_report_for(wrapper))
    assert report.failure_id == inner.event_id
    wrapper_records = [r for r in report.events.values() if r.get("exception_type") == "RuntimeError"]
    assert wrapper_records and wrapper_records[0]["cause_id"] == inner.event_id


def test_self_referencing_and_cyclic_chains() -> None:
    event = _event()
    event.__cause__ = event
    report = _valid(failure_report_for(event))
    assert report.events[event.event_id]["cause_id"] is None
    a, b, c = _event(), ValueError("b"), _event()
    a.__cause__, b.__cause__, c.__cause__ = b, c, a
    report = _valid(failure_report_for(a))
    assert len(report.events) == 3
    assert len(final_chain(report.events, report.failure_id)) == 3


def test_two_rebuilt_copies_of_one_event_in_a_chain_are_a_cycle() -> None:
    original = _chain(ValueError("root"), _event("verifier_error", boundary="resources_server"))
    report = failure_report_for(original)
    first, second = rebuild_failure(report), rebuild_failure(report)
    assert first is not None and second is not None
    middle = _event("agent_request_failed")
    _chain(second, middle, first)  # first -> middle -> second, and second has first's ids again
    walked = _valid(failure_report_for(first))
    assert len(walked.events) == 2
    assert walked.events[middle.event_id]["cause_id"] is None  # the repeat was cut where it closed


def test_exception_group_members() -> None:
    model = _event("provider_unavailable", boundary="model")
    resources = _chain(ZeroDivisionError("z"), _event("verifier_error", boundary="resources_server"))
    group = ExceptionGroup("task group", [ValueError("first, foreign"), model, resources])
    report = _valid(failure_report_for(group))
    assert report.failure_id == model.event_id  # first gym failure, depth first
    kinds = sorted(str(r["failure_kind"]) for r in report.events.values())
    assert kinds == ["None", "None", "None", "provider_unavailable", "verifier_error"]
    group_record = next(r for r in report.events.values() if r.get("exception_type") == "ExceptionGroup")
    assert group_record["details"] == {"exceptions": 3}
    assert group_record["cause_id"] == model.event_id  # the member that leads to a gym failure


def test_group_as_a_cause_inside_a_chain() -> None:
    inner = _event("verifier_error", boundary="resources_server")
    group = ExceptionGroup("eg", [ValueError("v"), _chain(KeyError("k"), inner)])
    top = _chain(group, _event("agent_run_error"))
    report = _valid(failure_report_for(top))
    chain = final_chain(report.events, report.failure_id)
    assert chain[0] == top.event_id
    assert report.events[chain[1]]["exception_type"] == "ExceptionGroup"
    assert chain[2] == inner.event_id  # the member that is (or leads to) a gym failure
    assert report.events[chain[3]]["exception_type"] == "KeyError"
    assert any(r.get("exception_type") == "ValueError" for r in report.events.values())  # sibling kept


def test_long_chain_loses_its_middle_and_says_so() -> None:
    errors: list[BaseException] = [OSError("root cause")] + [_event(reason=str(i)) for i in range(100)]
    top = _chain(*errors)
    report = _valid(failure_report_for(top))
    chain = final_chain(report.events, report.failure_id)
    assert len(chain) == MAX_DEPTH
    assert report.truncated and report.dropped == 101 - MAX_DEPTH
    assert report.events[chain[-1]]["exception_type"] == "OSError"  # root cause kept
    assert sum(r.get("skipped", 0) for r in report.events.values()) == report.dropped


def test_too_many_events_are_cut_by_the_drop_rule() -> None:
    members = [_chain(ValueError(str(i)), _event(reason=f"m{i}")) for i in range(60)]
    group = ExceptionGroup("many", members)
    report = _valid(failure_report_for(group))
    assert len(report.events) == MAX_EVENTS
    assert report.truncated and report.dropped > 0
    assert report.failure_id == members[0].event_id


def test_rebuild_keeps_ids_and_causes() -> None:
    root = ZeroDivisionError("division by zero")
    mid = _event("verifier_error", "verify", boundary="resources_server", stage="verification")
    top = _event("agent_request_failed", "call", http_status=500)
    _chain(root, mid, top)
    rebuilt = rebuild_failure(_valid(failure_report_for(top)))
    assert rebuilt is not None
    assert rebuilt.to_record() == top.to_record()
    assert isinstance(rebuilt.__cause__, NgFailureEvent)
    assert rebuilt.__cause__.to_record() == mid.to_record()
    foreign = rebuilt.__cause__.__cause__
    assert isinstance(foreign, ForeignFailure)
    assert str(foreign) == "ZeroDivisionError: division by zero"
    # Walking the rebuilt failure again reproduces the same report (ids survive any number of hops).
    assert failure_report_for(rebuilt).events == failure_report_for(top).events


def test_rebuild_without_final_failure() -> None:
    assert rebuild_failure(FailureReport()) is None


# --- validation ------------------------------------------------------------------------------------------


def _record(**changes: Any) -> dict[str, Any]:
    record = _event().to_record()
    record.update(changes)
    return record


def _map(*records: dict[str, Any]) -> dict[str, Any]:
    return {r["event_id"]: r for r in records}


def _bad_maps() -> list[Any]:
    a, b = new_event_id(), new_event_id()
    return [
        [],
        "events",
        {"fe_x": _record()},
        {a: _record(event_id=b)},
        _map(_record(event_id=a, cause_id=a)),
        _map(_record(event_id=a, cause_id=b)),
        _map(_record(event_id=a, cause_id=b), _record(event_id=b, cause_id=a)),
        _map(_record(event_id=a, failure_kind=7)),
        _map(_record(event_id=a, failure_reason=["x"])),
        _map(_record(event_id=a, skipped=-1)),
        _map(_record(event_id=a, rollout_id="r" * 1000)),
        _map({"event_id": a, "failure_kind": None}),
        {new_event_id(): 5},
        {f"fe_{i:024x}": _record(event_id=f"fe_{i:024x}") for i in range(MAX_EVENTS + 1)},
    ]


@pytest.mark.parametrize("events", _bad_maps())
def test_validate_rejects(events: Any) -> None:
    with pytest.raises(InvalidFailureReport):
        validate_failure_event_map(events)


def test_validate_rejects_deep_chains() -> None:
    ids = [new_event_id() for _ in range(MAX_DEPTH + 1)]
    records = [_record(event_id=eid, cause_id=nxt) for eid, nxt in zip(ids, [*ids[1:], None], strict=True)]
    with pytest.raises(InvalidFailureReport):
        validate_failure_event_map(_map(*records))
    assert len(validate_failure_event_map(_map(*records[1:]))) == MAX_DEPTH


def test_validate_normalizes_without_losing_unknown_kinds() -> None:
    a = new_event_id()
    clean = validate_failure_event_map(
        _map(_record(event_id=a, failure_kind="future_kind", extra="dropped", failure_reason="r" * 5000))
    )
    assert clean[a]["failure_kind"] == "future_kind"
    assert "extra" not in clean[a]
    assert len(clean[a]["failure_reason"]) == 1000


def test_report_model_validates_on_construction() -> None:
    a = new_event_id()
    with pytest.raises(ValueError):
        FailureReport(failure_id=new_event_id(), events={})
    with pytest.raises(ValueError):
        FailureReport(failure_id=a, events=_map({"event_id": a, "failure_kind": None, "exception_type": "E"}))
    assert FailureReport(failure_id=a, events=_map(_record(event_id=a))).failure_id == a


# --- property: any chain shape yields a valid report ----------------------------------------------------

_node = st.sampled_from(["gym", "foreign", "group"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(_node, min_size=1, max_size=80), loop_to=st.one_of(st.none(), st.integers(0, 79)))
def test_any_chain_gives_a_valid_report(shape: list[str], loop_to: int | None) -> None:
    errors: list[BaseException] = []
    for i, kind in enumerate(shape):
        if kind == "gym":
            errors.append(_event(reason=str(i)))
        elif kind == "foreign":
            errors.append(ValueError(str(i)))
        else:
            errors.append(ExceptionGroup(str(i), [KeyError(i), _event(reason=f"g{i}")]))
    top = _chain(*errors)
    if loop_to is not None:
        errors[0].__cause__ = errors[loop_to % len(errors)]
    report = _valid(failure_report_for(top))
    assert len(report.events) <= MAX_EVENTS
    if find_boundary_failure(top) is not None:
        assert report.failure_id is not None
        assert rebuild_failure(report) is not None


def test_forwarding_a_truncated_remote_chain_keeps_its_gaps_counted() -> None:
    from gym_obs.failures import decode_failure_report, encode_failure_report

    cause: BaseException = ValueError("root")
    for i in range(100):
        cause = _chain(cause, _event(reason=str(i)))
    first = failure_report_for(cause)
    assert len(first.events) + sum(r.get("skipped", 0) for r in first.events.values()) == 101
    remote = rebuild_failure(decode_failure_report(encode_failure_report(first)))
    assert remote is not None
    top = _chain(remote, _event(reason="forwarded"))
    second = failure_report_for(top)
    assert len(second.events) + sum(r.get("skipped", 0) for r in second.events.values()) == 102
    assert getattr(remote, "skipped_causes", 0) == first.events[remote.event_id].get("skipped", 0)


def test_a_peers_reason_is_scrubbed_again_and_loses_control_characters() -> None:
    """A peer may be older or buggy: its free text is treated like any other untrusted text."""
    from gym_obs.failures import NgFailureEvent as _Event
    from gym_obs.failures.report import validate_failure_event_map as _validate

    record = _Event("verifier_error", "ok", boundary="resources_server").to_record()
    record["failure_reason"] = "boom api_key=sk-livesecretvalue0123456789 \x1b[31mred\x1b[0m\nnext line"
    clean = _validate({record["event_id"]: record})[record["event_id"]]
    assert "sk-livesecretvalue0123456789" not in clean["failure_reason"]
    assert "\x1b" not in clean["failure_reason"]
    assert "\nnext line" in clean["failure_reason"]
