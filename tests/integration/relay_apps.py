"""Gym servers for the client security regression tests, started in a child process by ``relay_support``.

``RelayServer`` calls an upstream named in its own config (``upstream_url``) and re-raises the upstream's
failure as its own (the hop a hostile peer's report crosses); ``GET /big`` fails with a chain far larger
than a failure header may carry.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse

from gym_obs.client.http_client import raise_boundary_failure, request
from gym_obs.failures.event import NgFailureEvent
from gym_obs.server import SimpleServer
from gym_obs.telemetry.logging import get_logger

_log = get_logger("tests.relay_apps")


class RelayServer(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        upstream = str(self.config.own_config()["upstream_url"])

        @app.post("/relay")
        async def relay() -> dict[str, Any]:
            response = await request("GET", upstream, _max_num_tries=1)
            try:
                await raise_boundary_failure(response)
            except NgFailureEvent as remote:
                _log.warning("upstream_failed", failure=str(remote), kind=remote.failure_kind)
                failed = NgFailureEvent("agent_request_failed", "the upstream failed", boundary="agent")
                raise failed from remote
            return {"ok": True}

        @app.get("/big")
        async def big() -> dict[str, Any]:
            error: NgFailureEvent | None = None
            for i in range(60):
                event = NgFailureEvent(
                    "verifier_error", f"layer {i} " + "x" * 900, boundary="resources_server",
                    details={"layer": i, "note": "y" * 400},
                )
                event.__cause__ = error
                error = event
            assert error is not None
            raise error

        @app.api_route("/redirect-away", methods=["GET", "POST"])
        async def redirect_away() -> RedirectResponse:
            return RedirectResponse(str(self.config.own_config()["redirect_to"]), status_code=307)

        @app.get("/redirect-home")
        async def redirect_home() -> RedirectResponse:
            return RedirectResponse("/echo-headers", status_code=302)

        @app.get("/echo-headers")
        async def echo_headers(request: Request) -> dict[str, str]:
            return {k.lower(): v for k, v in request.headers.items()}

        return app


RELAY_SCRIPT = """
    import json, sys
    from gym_obs.config import parse_global_config
    from tests.integration.relay_apps import RelayServer
    config = parse_global_config(json.loads(sys.argv[1]), source="test")
    RelayServer("relay", config).run_webserver()
"""
