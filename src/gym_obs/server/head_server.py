"""HeadServer: the one fixed address every process knows; serves the global config and who is up.

Processes find each other through it (``ServerClient.load_from_global_config``), humans read the config as
YAML, and ``/readyz`` answers 200 only once every configured server answers its own ``/readyz``, so a
harness has a single place to wait on. It is control plane only: no tracing, no failure reports.

The global config is served without its secrets (``_served_config``: ``session_secret`` and every
secret-looking key become ``[REDACTED]``); launched servers get theirs from the launcher through their
environment, never from here. The head server still binds to loopback unless configured otherwise: the
served config maps the whole deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import aiohttp
import yaml
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from gym_obs.client import server_base_url
from gym_obs.config import GlobalConfig, ServerInstanceConfig
from gym_obs.server._access_log import install_query_free_access_log
from gym_obs.server._native_telemetry import disable_native_telemetry, drop_exception_observer
from gym_obs.server._served_config import served_config
from gym_obs.server.uvicorn import bind_listen_socket, build_uvicorn_config, serve_uvicorn
from gym_obs.telemetry.settings import TelemetryConfig
from gym_obs.telemetry.setup import setup_telemetry

__all__ = ["HEAD_SERVER_NAME", "HEAD_SERVER_ROUTES", "HeadServer", "ServerStatus"]

ServerStatus = Literal["starting", "ready", "not_ready", "unreachable"]

HEAD_SERVER_NAME: Final = "head_server"

HEAD_SERVER_ROUTES: Final = (
    "/global_config",
    "/global_config.yaml",
    "/server_instances",
    "/livez",
    "/readyz",
)
_POLL_TIMEOUT_S: Final = 1.0
_FAST_POLL_S: Final = 0.25  # until everything is ready: readiness is what callers wait on
_SLOW_POLL_S: Final = 2.0

@dataclass
class _Instance:
    name: str
    config: ServerInstanceConfig
    url: str
    status: ServerStatus = "starting"
    ready_once: bool = False
    pid: int | None = None
    checked_at: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server_type": self.config.server_type,
            "entrypoint": self.config.entrypoint,
            "host": self.config.host,
            "port": self.config.port,
            "url": self.url,
            "num_workers": self.config.num_workers,
            "status": self.status,
            "pid": self.pid,
            "checked_at": self.checked_at,
        }


class HeadServer:
    """Serves the global config (JSON and YAML), ``/server_instances``, ``/livez`` and ``/readyz``."""

    def __init__(self, config: GlobalConfig, *, poll_servers: bool = True) -> None:
        self.config = config
        self._poll_servers = poll_servers
        self._instances = {
            name: _Instance(name, server, server_base_url(server.host, server.port))
            for name, server in config.servers.items()
        }

    # -- status ---------------------------------------------------------------------------------------------

    def all_ready(self) -> bool:
        return all(instance.status == "ready" for instance in self._instances.values())

    async def _check(self, session: aiohttp.ClientSession, instance: _Instance) -> None:
        status: ServerStatus
        try:
            async with session.get(instance.url + "/readyz") as response:
                body = await response.json(content_type=None) if response.status in (200, 503) else None
                status = "ready" if response.status == 200 else "not_ready"
                if isinstance(body, dict) and isinstance(body.get("pid"), int):
                    instance.pid = body["pid"]
        except (TimeoutError, aiohttp.ClientError, ValueError):
            status = "unreachable"
        if status == "ready":
            instance.ready_once = True
        elif not instance.ready_once:
            status = "starting"
        instance.status = status
        instance.checked_at = time.time()

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self._check(session, instance) for instance in self._instances.values()))

    async def _poll_forever(self) -> None:
        timeout = aiohttp.ClientTimeout(total=_POLL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(_SLOW_POLL_S if self.all_ready() else _FAST_POLL_S)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(self._poll_forever()) if self._poll_servers and self._instances else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # -- app ------------------------------------------------------------------------------------------------

    def build_app(self) -> FastAPI:
        app = FastAPI(title="gym_obs head server", lifespan=self._lifespan, docs_url=None, redoc_url=None)
        disable_native_telemetry(app)
        drop_exception_observer(app)
        install_query_free_access_log()
        config_json = served_config(self.config)
        config_yaml = yaml.safe_dump(config_json, sort_keys=False)

        @app.get("/global_config")
        async def global_config() -> JSONResponse:
            return JSONResponse(config_json)

        @app.get("/global_config.yaml")
        async def global_config_yaml() -> PlainTextResponse:
            return PlainTextResponse(config_yaml, media_type="application/yaml")

        @app.get("/server_instances")
        async def server_instances() -> JSONResponse:
            return JSONResponse([instance.as_json() for instance in self._instances.values()])

        @app.get("/livez")
        async def livez() -> JSONResponse:
            return JSONResponse({"status": "ok", "pid": os.getpid(), "ppid": os.getppid()})

        @app.get("/readyz")
        async def readyz() -> JSONResponse:
            waiting = [name for name, instance in self._instances.items() if instance.status != "ready"]
            if waiting:
                return JSONResponse({"status": "starting", "waiting_for": waiting}, status_code=503)
            return JSONResponse({"status": "ready", "pid": os.getpid(), "ppid": os.getppid()})

        return app

    def run_webserver(self) -> None:
        """Serve until SIGINT/SIGTERM on the configured head address."""
        # Control plane: no spans or metrics, but log lines carry the name like every other server's.
        setup_telemetry(HEAD_SERVER_NAME, HEAD_SERVER_NAME, config=TelemetryConfig(enabled=False))
        head = self.config.head_server
        listen = ServerInstanceConfig.model_construct(  # the head is not a gym server: no server_type check
            entrypoint="gym_obs.server.head_server:HeadServer",
            server_type=HEAD_SERVER_NAME,
            host=head.host,
            port=head.port,
        )
        app = self.build_app()
        uvicorn_config = build_uvicorn_config(app, listen, self.config.client, where=HEAD_SERVER_NAME)
        sock = bind_listen_socket(head.host, head.port, where=HEAD_SERVER_NAME)
        serve_uvicorn(uvicorn_config, sock)
