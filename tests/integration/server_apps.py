"""Demo servers for the server-runtime tests: an agent that calls a model and a resources server.

Imported by launched child processes through their ``entrypoint`` (``tests.integration.server_apps:...``),
so everything here must work in a fresh process with only the global config.
"""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

from fastapi import FastAPI

from gym_obs.client.boundary import raise_boundary_failure
from gym_obs.failures.event import NgFailureEvent
from gym_obs.server import SimpleServer
from gym_obs.telemetry.logging import get_logger
from gym_obs.telemetry.propagation import current_rollout_id

_log = get_logger("tests.server_apps")

SECRET = "hunter2-very-secret"


class DemoModelServer(SimpleServer):
    """responses_api_models: ``POST /v1/responses``; fails the first ``fail_times`` attempts per key."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        attempts: dict[str, int] = {}

        @app.post("/v1/responses")
        async def responses(body: dict[str, Any]) -> dict[str, Any]:
            key = str(body.get("key", ""))
            attempt = attempts[key] = attempts.get(key, 0) + 1
            if attempt <= int(body.get("fail_times", 0)):
                raise NgFailureEvent(
                    "provider_unavailable",
                    f"attempt {attempt}: overloaded",
                    boundary="model",
                    http_status=503,
                )
            return {
                "output": f"echo {body.get('input')}",
                "attempt": attempt,
                "rollout_id": current_rollout_id(),
            }

        return app


class DemoResourcesServer(SimpleServer):
    """resources_servers: ``POST /verify`` (may explode), ``POST /slow`` (for disconnect tests)."""

    def multiple_workers_unsupported_reason(self) -> str | None:
        return "episode state lives in this process's memory"

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        slow: dict[str, str] = {}

        @app.post("/verify")
        async def verify(body: dict[str, Any]) -> dict[str, Any]:
            _log.info("verifying", explode=bool(body.get("explode")))
            if body.get("explode"):
                raise ValueError(f"verifier database unreachable (password={SECRET})")
            return {"reward": 1.0, "rollout_id": current_rollout_id()}

        @app.post("/slow")
        async def slow_handler(body: dict[str, Any]) -> dict[str, Any]:
            key = str(body["key"])
            slow[key] = "started"
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                slow[key] = "cancelled"
                raise
            slow[key] = "finished"
            return {"done": True}

        @app.get("/slow_status/{key}")
        async def slow_status(key: str) -> dict[str, Any]:
            return {"status": slow.get(key)}

        return app


class DemoAgentServer(SimpleServer):
    """responses_api_agents: ``POST /run`` calls the model (retrying its failures), then the resources."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.post("/run")
        async def run(body: dict[str, Any]) -> dict[str, Any]:
            _log.info("running", model_fail_times=body.get("model_fail_times", 0))
            model: dict[str, Any] = {}
            for attempt in range(3):
                response = await self.server_client.post(
                    "model",
                    "/v1/responses",
                    json={
                        "input": body.get("input"),
                        "key": body.get("key"),
                        "fail_times": body.get("model_fail_times", 0),
                    },
                    _route="/v1/responses",
                )
                try:
                    await raise_boundary_failure(response)
                except NgFailureEvent:
                    if attempt == 2:
                        raise
                    continue  # recovered below: the failure stays in this request's report
                model = await response.json()
                break
            response = await self.server_client.post(
                "resources", "/verify", json={"explode": body.get("explode", False)}, _route="/verify"
            )
            await raise_boundary_failure(response)
            verified = await response.json()
            return {"model": model, "verified": verified, "rollout_id": current_rollout_id()}

        return app


class BrokenServer(SimpleServer):
    """Fails while building its app: the launcher must report it with the tail of its log."""

    def setup_webserver(self) -> FastAPI:
        raise RuntimeError("model weights not found at /nonexistent/weights.bin")


class NeverReadyServer(SimpleServer):
    """Starts and answers /livez, but /readyz stays 503 (a model that never finishes loading)."""

    def is_ready(self) -> bool:
        _log.info("still loading the weights")
        return False

    def setup_webserver(self) -> FastAPI:
        return FastAPI()


LOG_CANARY = "sk-live-LOGCANARY0123456789abcdef"


class LoggingServer(SimpleServer):
    """resources_servers: ``POST /log`` logs a line carrying a secret and answers with its trace ids."""

    def setup_webserver(self) -> FastAPI:
        from gym_obs.telemetry.spans import current_ids

        app = FastAPI()
        log = get_logger("tests.logging_server")

        @app.post("/log")
        async def write_log(body: dict[str, Any]) -> dict[str, Any]:
            secret = {"api_key": LOG_CANARY, "detail": f"token={LOG_CANARY}"}
            log.warning("handled a request", n=body.get("n"), **secret)
            trace_id, span_id = current_ids()
            return {"trace_id": trace_id, "span_id": span_id}

        return app


class FrozenHeapServer(SimpleServer):
    """Reports how many objects its process froze at startup (``gym_obs.server._heap``)."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.get("/frozen")
        async def frozen() -> dict[str, int]:
            return {"frozen": gc.get_freeze_count(), "pid": os.getpid()}

        return app
