"""Streaming statistics: the sketch's quantiles are within the stated bound of the exact ones, and the
run's tally stays the same size however many rollouts it has seen."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from gym_obs.failures import NgFailureEvent
from gym_obs.harness.rows import RolloutResult
from gym_obs.harness.stats import QUANTILE_PRECISION, QuantileSketch, quantile
from gym_obs.harness.summary import build_summary
from gym_obs.harness.tally import MAX_FAILURE_GROUPS, MAX_HOP_ROLES, OTHER, RunTally

_QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0)


def _samples(distribution: str, n: int, rng: random.Random) -> list[float]:
    draw = {
        "lognormal": lambda: rng.lognormvariate(-4.0, 1.5),
        "exponential": lambda: rng.expovariate(20.0),
        "uniform": lambda: rng.uniform(0.001, 2.0),
        "bimodal": lambda: rng.choice((0.002, 3.0)) * rng.uniform(0.9, 1.1),
        "constant": lambda: 0.25,
        "with_zeros": lambda: rng.choice((0.0, rng.expovariate(5.0))),
    }[distribution]
    return [draw() for _ in range(n)]


@pytest.mark.parametrize(
    "distribution", ["lognormal", "exponential", "uniform", "bimodal", "constant", "with_zeros"]
)
@pytest.mark.parametrize("n", [1, 7, 1024, 1025, 20_000])
def test_streaming_quantiles_are_within_the_stated_relative_error(distribution: str, n: int) -> None:
    values = _samples(distribution, n, random.Random(n))
    sketch = QuantileSketch()
    for value in values:
        sketch.add(value)
    ordered = sorted(values)
    assert sketch.count == n and sketch.min == ordered[0] and sketch.max == ordered[-1]
    assert sketch.exact == (n <= QUANTILE_PRECISION["exact_up_to"])
    bound = 0.0 if sketch.exact else QUANTILE_PRECISION["relative_error"]
    for q in _QS:
        exact = quantile(ordered, q)
        got = sketch.quantile(q)
        assert exact is not None and got is not None
        assert abs(got - exact) <= bound * exact + QuantileSketch.MIN_POSITIVE, (q, got, exact)


def test_sketch_ignores_non_finite_values_and_has_none_for_no_values() -> None:
    sketch = QuantileSketch()
    assert sketch.quantile(0.5) is None and sketch.summary()["count"] == 0
    for value in (float("nan"), float("inf"), -1.0):
        sketch.add(value)
    assert sketch.count == 1 and sketch.max == 0.0  # a negative duration counts as 0


def _result(index: int, rng: random.Random) -> RolloutResult:
    if index % 7 == 0:
        error = NgFailureEvent(
            "transport_timeout", f"call {index} timed out", boundary="model", stage="agent"
        )
        error.__cause__ = TimeoutError(f"after {index} s")
        return RolloutResult.failed(
            error,
            index=index,
            rollout_id=f"run-{index:06d}",
            agent="agent_0",
            started_at=0.0,
            duration_s=rng.expovariate(2.0),
            trace_id=f"{index:032x}",
        )
    return RolloutResult(
        index=index,
        rollout_id=f"run-{index:06d}",
        agent="agent_0",
        outcome="completed",
        duration_s=rng.lognormvariate(-3, 1),
        started_at=0.0,
        trace_id=f"{index:032x}",
        reward=1.0,
        hops=[("model", rng.expovariate(50.0)) for _ in range(4)] + [("resources", rng.expovariate(200.0))],
    )


def test_the_tally_stays_flat_as_the_run_grows() -> None:
    """Measured with tracemalloc: after the sketches switched to buckets, 8,000 more rollouts (with failure
    reports, ~1.5 KB each if kept) cost the tally less than 64 KB (keeping them would cost ~12 MB)."""
    rng = random.Random(11)
    tally = RunTally()
    for index in range(2_000):
        tally.add(_result(index, rng))
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for index in range(2_000, 10_000):
            tally.add(_result(index, rng))
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename") if stat.size_diff > 0)
    assert grown < 64 * 1024, grown
    assert tally.rollouts == 10_000 and tally.outcomes["failed"] == len(range(0, 10_000, 7))


def test_remote_keys_are_capped_but_still_counted() -> None:
    tally = RunTally()
    for index in range(MAX_HOP_ROLES + 10):
        tally.add(
            RolloutResult(index, f"r{index}", "a", "completed", 0.1, 0.0, hops=[(f"role{index}", 0.01)])
        )
    hops = tally.hops()
    assert len(hops) == MAX_HOP_ROLES + 1 + 1  # capped roles, "(other)", and harness -> agent
    assert hops[f"agent -> {OTHER}"]["count"] == 10
    for index in range(MAX_FAILURE_GROUPS + 5):
        error = NgFailureEvent("internal_error", "x", boundary="agent")
        error.__cause__ = type(f"Error{index}", (Exception,), {})("boom")
        tally.add(
            RolloutResult.failed(
                error, index=index, rollout_id="r", agent="a", started_at=0.0, duration_s=0.1
            )
        )
    groups = tally.failure_groups()
    assert len(groups) == MAX_FAILURE_GROUPS + 1 and sum(g["count"] for g in groups) == MAX_FAILURE_GROUPS + 5


def test_summary_from_a_tally_equals_the_summary_from_the_results() -> None:
    rng = random.Random(5)
    results = [_result(index, rng) for index in range(300)]
    kwargs: dict[str, object] = {
        "wall_seconds": 3.0,
        "run": {},
        "metrics": None,
        "role_of": {},
        "injected": {},
    }
    assert build_summary(RunTally.of(results), **kwargs) == build_summary(results, **kwargs)  # type: ignore[arg-type]
