"""Which servers get the model-call layer: model servers or an explicit switch, only with telemetry on."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI

from gym_obs.config import ConfigError, parse_global_config
from gym_obs.server import SimpleServer
from gym_obs.server.model_calls import ModelCallMiddleware, install_model_calls, model_call_config
from gym_obs.telemetry.testing import Capture


class _Server(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        return FastAPI()


def _layers(server_type: str, **own: Any) -> list[type]:
    config = parse_global_config(
        {"servers": {"s": {"entrypoint": "x.y:Z", "server_type": server_type, "port": 29790, **own}}}
    )
    app = _Server("s", config).build_app()
    while not isinstance(app, FastAPI):
        app = app.app  # type: ignore[attr-defined]
    return [m.cls for m in app.user_middleware]  # type: ignore[misc]


def test_telemetry_off_installs_nothing() -> None:
    assert ModelCallMiddleware not in _layers("responses_api_models")
    assert ModelCallMiddleware not in _layers("resources_servers", model_calls={"enabled": True})


def test_model_servers_get_the_layer_inside_the_failure_reply_layer(telemetry: Capture) -> None:
    layers = _layers("responses_api_models")
    assert ModelCallMiddleware in layers
    names = [cls.__name__ for cls in layers]
    # the failure reply is a step of the gym layers' one frame (RequestSteps), outer first
    assert names.index("RequestSteps") < names.index("ModelCallMiddleware")
    assert ModelCallMiddleware not in _layers("resources_servers")
    assert ModelCallMiddleware in _layers("resources_servers", model_calls={"enabled": True})
    assert ModelCallMiddleware not in _layers("responses_api_models", model_calls={"enabled": False})


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"provider": "Open AI!"}, "provider"),
        ({"model_allow_list": "gpt"}, "model_allow_list"),
        ({"bogus": 1}, "bogus"),
        ("yes", "value"),
    ],
)
def test_bad_model_call_config_is_a_clear_error_naming_the_key(raw: Any, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"servers\.s\.model_calls: {key}"):
        model_call_config("responses_api_models", {"model_calls": raw}, where="servers.s")


def test_install_refuses_when_telemetry_is_off() -> None:
    app = FastAPI()
    assert not install_model_calls(app, server_name="s", server_type="responses_api_models", own_config={})
    assert app.user_middleware == []
