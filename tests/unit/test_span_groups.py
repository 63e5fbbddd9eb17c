"""Span-group specs: presets and groups mixed, case-insensitive, unknown names rejected with the list."""

from __future__ import annotations

import pytest

from gym_obs.telemetry.groups import (
    DEFAULT_GROUPS,
    GROUPS,
    PRESETS,
    SpanGroups,
    UnknownSpanGroup,
    parse_span_groups,
)


def test_default_preset_is_the_spine_rollout_and_startup() -> None:
    groups = parse_span_groups(None)
    assert groups == DEFAULT_GROUPS == parse_span_groups("  ")
    assert groups.enabled == {"server", "http_client", "rollout", "startup"}
    assert (groups.server, groups.http_client, groups.rollout, groups.startup) == (True, True, True, True)
    assert (groups.model_call, groups.verify, groups.concurrency) == (False, False, False)
    assert not groups.rollout_is_root
    assert groups.missing_spine() == ()


def test_presets_and_groups_mix_case_insensitively() -> None:
    groups = parse_span_groups(" Default , MODEL_CALL,,verify ")
    assert groups.enabled == {"server", "http_client", "rollout", "startup", "model_call", "verify"}
    assert parse_span_groups("all").enabled == frozenset(GROUPS)
    assert parse_span_groups("none").enabled == frozenset()
    assert parse_span_groups("none").missing_spine() == ("server", "http_client")
    assert parse_span_groups("server").missing_spine() == ("http_client",)


def test_per_rollout_is_every_group_but_startup_and_makes_rollouts_roots() -> None:
    groups = parse_span_groups("per_rollout")
    assert groups.enabled == frozenset(GROUPS) - {"startup"}
    assert not groups.startup
    assert groups.rollout_is_root
    assert not parse_span_groups("all").rollout_is_root
    assert PRESETS["per_rollout"] == groups.enabled


@pytest.mark.parametrize("spec", ["defualt", "server,bogus", "model-call"])
def test_unknown_names_fail_with_every_valid_name(spec: str) -> None:
    with pytest.raises(UnknownSpanGroup) as caught:
        parse_span_groups(spec)
    message = str(caught.value)
    assert "unknown span group" in message
    for name in (*GROUPS, *PRESETS):
        assert name in message
    assert isinstance(caught.value, ValueError)


def test_unknown_name_in_message_is_bounded() -> None:
    with pytest.raises(UnknownSpanGroup) as caught:
        parse_span_groups("x" * 10_000)
    assert len(str(caught.value)) < 400


def test_groups_are_immutable_and_reject_unknown_members() -> None:
    groups = parse_span_groups("all")
    with pytest.raises(AttributeError):
        groups.server = False  # type: ignore[misc]
    with pytest.raises(UnknownSpanGroup):
        SpanGroups(frozenset({"server", "nope"}))
    assert repr(parse_span_groups("none")) == "SpanGroups(none)"


def test_config_beats_the_environment_and_an_unknown_name_fails_config_loading() -> None:
    from gym_obs.config import ConfigError, parse_global_config
    from gym_obs.telemetry.settings import TelemetryConfig, resolve_settings

    env = {"GYM_OBS_TELEMETRY": "1", "GYM_OBS_SPAN_GROUPS": "none", "OTEL_TRACES_EXPORTER": "console"}
    assert resolve_settings(TelemetryConfig(), env).span_groups.enabled == frozenset()
    chosen = resolve_settings(TelemetryConfig(span_groups="Server,model_call"), env).span_groups
    assert chosen.enabled == {"server", "model_call"}
    with pytest.raises(ConfigError) as caught:
        parse_global_config({"telemetry": {"span_groups": "default,modelcall"}, "servers": {}})
    assert "modelcall" in str(caught.value) and "model_call" in str(caught.value)


def test_an_unknown_name_in_the_environment_is_reported_with_the_list_and_the_default_used() -> None:
    from gym_obs.telemetry.settings import TelemetryConfig, resolve_settings

    env = {"GYM_OBS_TELEMETRY": "1", "GYM_OBS_SPAN_GROUPS": "sever", "OTEL_TRACES_EXPORTER": "console"}
    settings = resolve_settings(TelemetryConfig(), env)
    assert settings.span_groups == DEFAULT_GROUPS
    (problem,) = [p for p in settings.problems if "GYM_OBS_SPAN_GROUPS" in p]
    assert "'sever'" in problem and all(name in problem for name in GROUPS)


def test_an_unknown_name_in_the_environment_fails_config_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_obs.config import ConfigError, parse_global_config

    monkeypatch.setenv("GYM_OBS_SPAN_GROUPS", "default,bogus")
    with pytest.raises(ConfigError) as caught:
        parse_global_config({"servers": {}})
    assert "GYM_OBS_SPAN_GROUPS" in str(caught.value) and "'bogus'" in str(caught.value)
    assert all(name in str(caught.value) for name in GROUPS)
    # the config's own choice wins: the environment is not consulted then
    chosen = parse_global_config({"telemetry": {"span_groups": "all"}, "servers": {}})
    assert chosen.telemetry.span_groups == "all"
