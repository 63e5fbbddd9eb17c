"""Global config: validation errors that name the bad key, server-own keys kept, env and head look-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_obs.client import ServerClient, global_config_from_environment
from gym_obs.config import ConfigError, GlobalConfig, load_global_config, parse_global_config
from gym_obs.telemetry import names


def _server(**extra: object) -> dict[str, object]:
    return {"entrypoint": "pkg.mod:Server", "server_type": "responses_api_models", "port": 12001, **extra}


def _error(data: object) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_global_config(data)
    return str(caught.value)


def test_defaults() -> None:
    config = parse_global_config({"servers": {"policy_model": _server()}})
    assert (config.head_server.host, config.head_server.port) == ("127.0.0.1", 11000)
    server = config.servers["policy_model"]
    assert (server.host, server.num_workers, server.proxy_headers, server.forwarded_allow_ips) == (
        "127.0.0.1",
        1,
        False,
        None,
    )
    assert server.reuse_port is False and server.backlog == 2048
    assert config.telemetry.enabled is None and config.client.global_aiohttp_tcp_keepalive_probes == 3


def test_server_own_keys_are_kept() -> None:
    config = parse_global_config({"servers": {"m": _server(model_name="llama", sampling={"t": 0.5})}})
    server = config.servers["m"]
    assert server.own_config() == {"model_name": "llama", "sampling": {"t": 0.5}}
    assert server.model_name == "llama"  # type: ignore[attr-defined]


def test_errors_name_every_bad_key() -> None:
    message = _error({"servers": {"policy_model": _server(port="abc")}, "bogus": 1})
    assert "servers.policy_model.port: Input should be a valid integer" in message
    assert "(got 'abc')" in message
    assert "bogus: unknown key" in message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"servers": {"m": _server(num_worker=2)}},
            "servers.m: unknown key 'num_worker' (did you mean 'num_workers'?)",
        ),
        ({"servers": {"m": _server(entrypoint="pkg.mod.Server")}}, "servers.m.entrypoint: must look like"),
        (
            {"servers": {"m": {"server_type": "resources_servers", "port": 1}}},
            "servers.m.entrypoint: Field required",
        ),
        (
            {"servers": {"m": _server(port=70000)}},
            "servers.m.port: Input should be less than or equal to 65535",
        ),
        ({"servers": {"m": _server(num_workers=0)}}, "servers.m.num_workers: Input should be greater than"),
        (
            {"servers": {"m": _server(port=11000)}},
            "servers.m.port: 127.0.0.1:11000 is already used by head_server",
        ),
        ({"servers": {"bad name": _server()}}, "servers.bad name: server names use"),
        ({"head_server": {"port": 1, "extra": 2}}, "head_server.extra: unknown key"),
        ({"telemetry": {"enabeld": True}}, "telemetry.enabeld: unknown key"),
        ([1, 2], "the top level must be a mapping"),
        ({"head_server": {"port": "eleven"}}, "head_server.port: Input should be a valid integer"),
        ({"head_server": {"port": True}}, "head_server.port: must be a whole number, not a boolean"),
        ({"servers": {"m": _server(port=[1])}}, "servers.m.port: Input should be a valid integer"),
        ({"servers": {"m": _server(num_workers=True)}}, "servers.m.num_workers: must be a whole number"),
        ({"servers": {"m": _server(num_workers=-1)}}, "servers.m.num_workers: Input should be greater than"),
        ({"servers": {"m": _server(entrypoint="pkg.mod:")}}, "servers.m.entrypoint: must look like"),
        ({"servers": {"m": _server(entrypoint=":Class")}}, "servers.m.entrypoint: must look like"),
        ({"servers": {"m": 5}}, "servers.m: Input should be a valid dictionary"),
        ({"bogus": 1}, "bogus: unknown key"),
    ],
)
def test_clear_errors(data: object, expected: str) -> None:
    assert expected in _error(data)


def test_duplicate_ports_between_servers() -> None:
    message = _error({"servers": {"a": _server(), "b": _server()}})
    assert "servers.b.port: 127.0.0.1:12001 is already used by servers.a" in message


def test_yaml_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=r"cannot read global config .*missing\.yaml"):
        load_global_config(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("servers: [unclosed\n")
    with pytest.raises(ConfigError, match=r"invalid YAML in global config .*broken\.yaml"):
        load_global_config(broken)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "servers:\n  m:\n    entrypoint: a.b:C\n    server_type: resources_servers\n    port: nope\n"
    )
    with pytest.raises(ConfigError, match=r"invalid global config \(.*bad.yaml\):\n  servers.m.port"):
        load_global_config(bad)
    for name, text in (("empty.yaml", ""), ("comment.yaml", "# nothing here\n")):
        empty = tmp_path / name
        empty.write_text(text)
        with pytest.raises(ConfigError, match=rf"invalid global config \(.*{name}\): the file is empty"):
            load_global_config(empty)
    assert parse_global_config(None) == GlobalConfig()  # an empty mapping in code is the defaults


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("servers: [unclosed\n", r"line 2, column 1: expected ',' or '\]'"),
        ("a: b: c\n", "line 1, column 5: mapping values are not allowed here"),
        ("servers:\n\tx: 1\n", "line 2, column 1: found character"),
        ("head_server: {port: 1}\nhead_server: {port: 2}\n", "line 2, column 1: found duplicate key"),
        (
            "servers:\n  m:\n    entrypoint: a.b:C\n    server_type: resources_servers\n"
            "    port: 1\n    port: 2\n",
            "line 6, column 5: found duplicate key 'port'",
        ),
    ],
)
def test_yaml_syntax_errors_give_the_line_in_one_message(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    pattern = r"invalid YAML in global config .*config\.yaml: " + expected
    with pytest.raises(ConfigError, match=pattern) as info:
        load_global_config(path)
    assert "<unicode string>" not in str(info.value)


def test_unreadable_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read global config .*: Is a directory"):
        load_global_config(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x80\x81 servers: {}\n")
    with pytest.raises(ConfigError, match=r"cannot read global config .*binary\.yaml: not UTF-8 text"):
        load_global_config(binary)


def test_config_from_environment_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_global_config({"servers": {"m": _server(model_name="x")}})
    monkeypatch.setenv(names.ENV_GLOBAL_CONFIG, config.model_dump_json())
    assert global_config_from_environment() == config
    client = ServerClient.load_from_global_config()  # a launched process never asks the head server
    assert client.global_config == config
    monkeypatch.setenv(names.ENV_GLOBAL_CONFIG, json.dumps({"servers": {"m": {"port": 1}}}))
    with pytest.raises(ConfigError, match=r"\$GYM_OBS_GLOBAL_CONFIG"):
        global_config_from_environment()
    monkeypatch.setenv(names.ENV_GLOBAL_CONFIG, "{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        global_config_from_environment()


def test_server_client_addresses() -> None:
    config = parse_global_config(
        {
            "servers": {
                "wild4": _server(host="0.0.0.0", port=1),
                "wild6": _server(host="::", port=2),
                "v6": _server(host="::1", port=3),
                "named": _server(host="model.internal", port=4),
            }
        }
    )
    client = ServerClient(config)
    assert client.base_url("wild4") == "http://127.0.0.1:1"
    assert client.base_url("wild6") == "http://[::1]:2"
    assert client.base_url("v6") == "http://[::1]:3"
    assert client.url("named", "v1/responses") == "http://model.internal:4/v1/responses"
    with pytest.raises(KeyError, match=r"no server named 'nope' in the global config \(known: named, v6"):
        client.base_url("nope")
