"""caused_by: a failure's cause chain asked about an exception type by name, across a real hop's codec."""

from __future__ import annotations

import json

from gym_obs.failures import (
    ForeignFailure,
    NgFailureEvent,
    cause_types,
    caused_by,
    decode_failure_report,
    encode_failure_report,
    failure_report_for,
    rebuild_failure,
)


def _remote_chain() -> NgFailureEvent:
    """A verifier's ZeroDivisionError, reported by the resources server, rebuilt where the agent reads it."""
    try:
        try:
            _ = 1 / 0
        except ZeroDivisionError as zde:
            raise NgFailureEvent("verifier_error", "verifier crashed", boundary="resources_server") from zde
    except NgFailureEvent as event:
        report = failure_report_for(event)
        assert report is not None
        decoded = decode_failure_report(encode_failure_report(report))
        assert decoded is not None
        rebuilt = rebuild_failure(decoded)
        assert rebuilt is not None
        return rebuilt
    raise AssertionError("unreachable")


def test_a_remote_root_cause_is_asked_by_type_name() -> None:
    remote = _remote_chain()
    root = remote.__cause__
    assert isinstance(root, ForeignFailure) and not isinstance(root, ZeroDivisionError)
    assert caused_by(remote, "ZeroDivisionError")
    assert caused_by(remote, ZeroDivisionError)  # a type is compared by its name on a foreign cause
    assert not caused_by(remote, "ValueError")
    assert not caused_by(remote, "ArithmeticError")  # a foreign cause knows its own type's name only
    try:
        raise NgFailureEvent("agent_request_failed", "verify failed", boundary="agent") from remote
    except NgFailureEvent as outer:
        assert caused_by(outer, "ZeroDivisionError")
        event = "gym_obs.failures.event.NgFailureEvent"
        assert cause_types(outer) == [event, event, "ZeroDivisionError"]


def test_local_exceptions_match_their_bases_and_dotted_names() -> None:
    try:
        try:
            json.loads("{")
        except json.JSONDecodeError as err:
            raise RuntimeError("bad reply") from err
    except RuntimeError as outer:
        assert caused_by(outer, "JSONDecodeError")
        assert caused_by(outer, "json.decoder.JSONDecodeError")
        assert caused_by(outer, "ValueError")  # a local exception: its base classes count
        assert caused_by(outer, ValueError)
        assert not caused_by(outer, "KeyError")


def test_a_cycle_ends_the_walk() -> None:
    a, b = ValueError("a"), KeyError("b")
    a.__cause__, b.__cause__ = b, a
    assert caused_by(a, "KeyError") and not caused_by(a, "TypeError")
    foreign = ForeignFailure("mypkg.errors.QuotaError", "over quota")
    assert caused_by(foreign, "QuotaError") and caused_by(foreign, "mypkg.errors.QuotaError")
    assert not caused_by(foreign, "errors.QuotaError")  # a full name or the bare name, not a fragment
