"""HeadServer in process: config as JSON and YAML, instances with status, readiness gated on every server."""

from __future__ import annotations

import aiohttp
import httpx
import yaml

from gym_obs.cli import build_parser
from gym_obs.config import parse_global_config
from gym_obs.server import HeadServer

CONFIG = parse_global_config(
    {
        "head_server": {"port": 24700},
        "servers": {
            "model": {
                "entrypoint": "a.b:M",
                "server_type": "responses_api_models",
                "port": 24701,
                "model_name": "m",
            },
            "env": {
                "entrypoint": "a.b:E",
                "server_type": "resources_servers",
                "host": "0.0.0.0",
                "port": 24702,
            },
        },
    }
)


async def test_config_instances_and_readiness() -> None:
    head = HeadServer(CONFIG, poll_servers=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(head.build_app()), base_url="http://h"
    ) as http:
        assert (await http.get("/global_config")).json() == CONFIG.model_dump(mode="json")
        as_yaml = await http.get("/global_config.yaml")
        assert as_yaml.headers["content-type"].startswith("application/yaml")
        assert yaml.safe_load(as_yaml.text) == CONFIG.model_dump(mode="json")
        instances = (await http.get("/server_instances")).json()
        assert [(i["name"], i["status"], i["url"]) for i in instances] == [
            ("model", "starting", "http://127.0.0.1:24701"),
            ("env", "starting", "http://127.0.0.1:24702"),
        ]
        not_ready = await http.get("/readyz")
        assert not_ready.status_code == 503 and not_ready.json()["waiting_for"] == ["model", "env"]
        assert (await http.get("/livez")).status_code == 200


async def test_nothing_listening_keeps_servers_starting() -> None:
    head = HeadServer(CONFIG)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        await head.poll_once(session)
    assert not head.all_ready()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(head.build_app()), base_url="http://h"
    ) as http:
        statuses = {i["name"]: i["status"] for i in (await http.get("/server_instances")).json()}
    assert statuses == {"model": "starting", "env": "starting"}


async def test_no_servers_is_ready() -> None:
    head = HeadServer(parse_global_config({}), poll_servers=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(head.build_app()), base_url="http://h"
    ) as http:
        assert (await http.get("/readyz")).status_code == 200


def test_cli_has_a_serve_command() -> None:
    args = build_parser().parse_args(["serve", "config.yaml", "--ready-timeout", "5"])
    assert str(args.config) == "config.yaml" and args.ready_timeout == 5.0 and callable(args.handler)
