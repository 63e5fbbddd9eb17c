"""Which requests are model calls, what a destination's config says about them, and the tally's clock."""

from __future__ import annotations

import time

import pytest

from gym_obs.client.model_calls import (
    NOT_A_MODEL_CALL,
    ModelCallTarget,
    model_call_target,
    observe_model_call,
)
from gym_obs.telemetry.tally import RolloutTally


@pytest.mark.parametrize(
    ("url", "model_call"),
    [
        ("http://h:1/v1/chat/completions", True),
        ("http://h:1/v1/responses/", True),
        ("http://h:1/ng-rollout/r-1/ng-trace/00-ab-cd-01/v1/messages", True),
        ("https://gateway/openai/v1/chat/completions?api-version=2", True),
        ("http://h:1/v1/responses#frag", True),
        ("http://h:1/v1/embeddings", False),
        ("http://h:1/v1/responses/extra", False),
        ("http://h:1/run", False),
        ("http://h:1/v1/chat/completions-ish", False),
    ],
)
def test_model_calls_are_the_dialect_routes_whatever_the_prefix(url: str, model_call: bool) -> None:
    call = observe_model_call(url, None, {"model": "m"}, "h", 1, "policy")
    assert (call is not None) is model_call
    assert observe_model_call(url, NOT_A_MODEL_CALL, None, "h", 1, "policy") is None


def test_a_destination_config_follows_the_servers_own_rule() -> None:
    assert model_call_target("responses_api_models", {}) == ModelCallTarget()
    assert model_call_target("resources_servers", {}) == NOT_A_MODEL_CALL
    assert model_call_target("resources_servers", {"model_calls": {"enabled": True}}).enabled
    assert model_call_target("responses_api_models", {"model_calls": {"enabled": False}}) == NOT_A_MODEL_CALL
    own = {"model_calls": {"provider": "openai", "model_allow_list": ["a", "b", 3, "bad\x00name"]}}
    target = model_call_target("responses_api_models", own)
    assert target.provider == "openai" and target.model_allow_list == frozenset({"a", "b"})
    odd = {"model_calls": {"provider": "x" * 500, "model_allow_list": "gpt", "enabled": "yes"}}
    assert model_call_target("responses_api_models", odd) == ModelCallTarget()  # read leniently
    assert model_call_target("responses_api_models", {"model_calls": ["not", "a", "mapping"]}).enabled


def test_model_time_counts_overlapping_calls_once_and_late_ends_at_their_time() -> None:
    tally = RolloutTally("r")
    tally.call_started()
    tally.call_started()
    t0 = time.perf_counter()
    tally.call_ended(t0 + 2.0)
    assert tally.model_time_s == 0.0  # one call still in flight
    tally.call_ended(t0 + 1.0)  # reported late, ended earlier: the busy period ends at the latest end
    assert 2.0 <= tally.model_time_s < 2.5
    tally.call_ended()  # one end too many: ignored
    assert tally.model_calls == 2 and tally.summary()["model_calls"] == 2
    with tally.model_call():
        pass
    assert tally.model_calls == 3 and tally.model_time_s >= 2.0
