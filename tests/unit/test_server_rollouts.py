"""The agent-side rollout helper: one gym.rollout span, its outcome, totals and root kind, counted once."""

from __future__ import annotations

import asyncio

import pytest

from gym_obs import RolloutOmitted, current_rollout, rollout_route, rollout_scope
from gym_obs.failures import NgFailureEvent
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import current_rollout_id
from gym_obs.telemetry.testing import Capture


def _outcomes(telemetry: Capture) -> dict[str, float]:
    return {
        p.attributes[names.ATTR_ROLLOUT_OUTCOME]: float(p.value or 0)
        for p in telemetry.metric_points(names.METRIC_ROLLOUTS)
    }


def test_a_completed_rollout_carries_its_totals(telemetry: Capture) -> None:
    with rollout_scope("r-1") as tally:
        assert current_rollout() is tally and current_rollout_id() == "r-1"
        with tally.model_call(), tally.model_call():  # parallel calls: model time counted once
            tally.add_usage(10, 4)
            tally.add_usage(5, None)
        tally.add_ttft(0.25)
        tally.add_usage(-3, True)  # type: ignore[arg-type]  # invalid counts are ignored
    assert current_rollout() is None
    (span,) = telemetry.spans(names.SPAN_ROLLOUT)
    attributes = dict(span.attributes or {})
    assert attributes[names.ATTR_ROLLOUT_ID] == "r-1"
    assert attributes[names.ATTR_ROLLOUT_OUTCOME] == names.ROLLOUT_OUTCOME_COMPLETED
    assert attributes[names.ATTR_ROLLOUT_INPUT_TOKENS] == 15
    assert attributes[names.ATTR_ROLLOUT_OUTPUT_TOKENS] == 4
    assert attributes[names.ATTR_ROLLOUT_MODEL_CALLS] == 2
    assert _outcomes(telemetry) == {names.ROLLOUT_OUTCOME_COMPLETED: 1.0}
    (duration,) = telemetry.metric_points(names.METRIC_ROLLOUT_DURATION)
    assert duration.count == 1 and duration.explicit_bounds == names.ROLLOUT_DURATION_BUCKETS_S
    summary = tally.summary()
    assert summary["ttft_p50_s"] == summary["ttft_p99_s"] == 0.25
    assert summary["model_calls"] == 2 and summary["model_time_s"] >= 0 and summary["other_time_s"] >= 0


def test_a_failure_is_failed_with_its_root_kind_and_goes_on(telemetry: Capture) -> None:
    root = NgFailureEvent("verifier_error", "bad verify", boundary="resources_server")
    with pytest.raises(NgFailureEvent) as raised, rollout_scope("r-2"):
        try:
            raise root
        except NgFailureEvent as err:
            raise NgFailureEvent("agent_run_error", "the rollout failed", boundary="agent") from err
    assert raised.value.__cause__ is root  # the exception reaches the caller unchanged
    (span,) = telemetry.spans(names.SPAN_ROLLOUT)
    attributes = dict(span.attributes or {})
    assert attributes[names.ATTR_ROLLOUT_OUTCOME] == names.ROLLOUT_OUTCOME_FAILED
    assert attributes[names.ATTR_FAILURE_KIND] == "verifier_error"
    assert not span.status.is_ok
    assert _outcomes(telemetry) == {names.ROLLOUT_OUTCOME_FAILED: 1.0}


def test_omitted_by_decision_or_by_cancellation(telemetry: Capture) -> None:
    with pytest.raises(RolloutOmitted), rollout_scope("r-3"):
        raise RolloutOmitted("budget exhausted")

    @rollout_route
    async def route() -> None:
        await asyncio.sleep(10)

    async def cancelled() -> None:
        task = asyncio.ensure_future(route())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert _outcomes(telemetry) == {names.ROLLOUT_OUTCOME_OMITTED: 2.0}
    assert all(
        (s.attributes or {})[names.ATTR_ROLLOUT_OUTCOME] == names.ROLLOUT_OUTCOME_OMITTED
        for s in telemetry.spans(names.SPAN_ROLLOUT)
    )


def test_with_telemetry_off_the_scope_still_tallies() -> None:
    with rollout_scope("r-4") as tally:
        tally.add_usage(1, 2)
    assert tally.summary()["input_tokens"] == 1
