"""Servers for the runtime-completeness tests (sessions, third-party clients, subprocess agents, profiling).

Imported by launched child processes through their ``entrypoint`` (``tests.integration.runtime_apps:...``).
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, Request

from gym_obs.server import SimpleServer
from gym_obs.server.sessions import SESSION_ID_KEY, OwnedSessionRouting, current_session_id
from gym_obs.telemetry import names
from gym_obs.telemetry.logging import get_logger
from gym_obs.telemetry.propagation import current_rollout_id

_log = get_logger("tests.runtime_apps")


class SessionCounterServer(SimpleServer):
    """A stateful resources server: a per-session step counter in process memory.

    Sessions are named by the signed token (cookie or header) or, for callers that pick their own episode
    ids, by the ``episode_id`` field of the JSON body. Safe under several workers only because every
    session's requests are routed to the worker owning it.
    """

    routes_sessions_to_owner = True

    def owned_session_routing(self) -> OwnedSessionRouting:
        return OwnedSessionRouting(json_field="episode_id")

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        steps: dict[str, int] = {}

        @app.post("/step")
        async def step(request: Request) -> dict[str, Any]:
            session_id = request.session[SESSION_ID_KEY]
            assert session_id == current_session_id()
            steps[session_id] = steps.get(session_id, 0) + 1
            _log.info("step", count=steps[session_id])
            return {
                "session_id": session_id,
                "count": steps[session_id],
                "pid": os.getpid(),
                "forwarded": request.headers.get(names.SESSION_FORWARDED_HEADER) is not None,
            }

        return app


class StatelessCounterServer(SessionCounterServer):
    """Keeps state per process but does not route sessions: must be refused more than one worker."""

    routes_sessions_to_owner = False

    def multiple_workers_unsupported_reason(self) -> str | None:
        return "step counters live in this process's memory"


class RuntimeModelServer(SimpleServer):
    """responses_api_models: echoes the rollout it was called in; ``GET /burn`` spends CPU."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/responses")
        async def responses(body: dict[str, Any]) -> dict[str, Any]:
            return {"output": f"echo {body.get('input')}", "rollout_id": current_rollout_id()}

        @app.get("/burn")
        async def burn() -> dict[str, int]:
            return {"total": _burn_cpu(200_000)}

        return app


def _burn_cpu(n: int) -> int:
    return sum(i * i for i in range(n))
