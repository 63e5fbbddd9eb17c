"""launch() takes a GlobalConfig, a dict or a YAML path, and says so for anything else, before starting."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_obs import launch
from gym_obs.config import ConfigError, GlobalConfig
from gym_obs.server.launcher import resolve_config

_SERVER = {"entrypoint": "a.b:C", "server_type": "resources_servers", "port": 16795}


def test_a_dict_is_validated_like_the_yaml_file(tmp_path: Path) -> None:
    config = resolve_config({"servers": {"verifier": _SERVER}})
    assert isinstance(config, GlobalConfig) and config.servers["verifier"].port == 16795
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(
        "servers:\n  verifier: {entrypoint: a.b:C, server_type: resources_servers, port: 16795}\n"
    )
    assert resolve_config(yaml_file) == resolve_config(str(yaml_file)) == config
    assert resolve_config(config) is config


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"servers": {"v": {**_SERVER, "port": "high"}}}, "servers.v.port"),
        ({"servers": {"v": {**_SERVER, "server_type": "agents"}}}, "valid: responses_api_agents"),
        ({"servrs": {}}, "servrs"),
        (42, "launch(): config must be a GlobalConfig, a dict or the path of a YAML file, not int"),
        (["servers"], "not list"),
    ],
)
def test_launch_rejects_a_bad_config_before_starting_anything(config: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught, launch(config, log_dir="/nonexistent/never-created"):  # type: ignore[arg-type]
        raise AssertionError("launch() started with a bad config")
    assert message in str(caught.value)


def test_the_head_server_address_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_obs.client import head_server_from_environment
    from gym_obs.server.top import head_url_for

    monkeypatch.delenv("GYM_OBS_HEAD_SERVER", raising=False)
    assert head_server_from_environment() is None
    assert head_url_for(None, None) == "http://127.0.0.1:11000"
    cases = [("10.0.0.5:12000", "10.0.0.5", 12000), ("http://h.example:80/", "h.example", 80),
             ("[::1]:16790", "::1", 16790)]  # fmt: skip
    for value, host, port in cases:
        monkeypatch.setenv("GYM_OBS_HEAD_SERVER", value)
        head = head_server_from_environment()
        assert head is not None and (head.host, head.port) == (host, port)
    assert head_url_for(None, None) == "http://[::1]:16790"
    assert head_url_for(None, "http://elsewhere:1/") == "http://elsewhere:1"  # --head wins
    for bad in ("nohost", "h:notaport", "h:70000", "http://h:1/path"):
        monkeypatch.setenv("GYM_OBS_HEAD_SERVER", bad)
        with pytest.raises(ConfigError, match="GYM_OBS_HEAD_SERVER must be host:port"):
            head_server_from_environment()
