"""Demo resources server: ``POST /verify`` scores a rollout inside a per-rollout session.

The caller names its session in the JSON body (``session_id``: the agent uses its rollout id, a
caller-chosen episode id as the runtime's session routing understands it); a session resolved by the
runtime's session middleware is used otherwise. The id keys a bounded state dict, the way a stateful
environment keeps per-episode state. A verifier exception becomes
``verifier_error`` at boundary ``resources_server`` with the exception as its explicit cause.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from opentelemetry import trace
from pydantic import Field

from gym_obs.failures import NgFailureEvent
from gym_obs.harness.fault_middleware import raise_injected_fault
from gym_obs.harness.servers._common import HarnessServer, OwnConfig
from gym_obs.server.sessions import SESSION_ID_KEY, OwnedSessionRouting, current_session_id
from gym_obs.telemetry import names

__all__ = ["ResourcesServer", "ResourcesSettings"]

VERIFY_ROUTE = "/verify"


class ResourcesSettings(OwnConfig):
    max_sessions: int = Field(default=10_000, ge=1)


def verify(response_text: str, expected: str) -> float:
    """The verifier: full reward when the expected answer appears in the response."""
    raise_injected_fault()  # where a real verifier's bug would surface
    return 1.0 if expected and expected in response_text else 0.0


class ResourcesServer(HarnessServer):
    """Keeps one state entry per session (bounded, oldest evicted) and verifies answers."""

    role: ClassVar = "resources"
    settings_model: ClassVar = ResourcesSettings
    hooked_routes: ClassVar = frozenset({VERIFY_ROUTE})

    def owned_session_routing(self) -> OwnedSessionRouting:
        """Sessions are named by the caller (the rollout id in the body), so no token has to travel back."""
        return OwnedSessionRouting(json_field=SESSION_ID_KEY)

    def multiple_workers_unsupported_reason(self) -> str | None:
        return "sessions live in process memory; a second worker would split a session's state"

    def setup_webserver(self) -> FastAPI:
        settings = self.settings
        assert isinstance(settings, ResourcesSettings)
        sessions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        app = self.new_app()

        @app.post(VERIFY_ROUTE)
        async def verify_route(request: Request) -> dict[str, Any]:
            body = await request.json()
            if not isinstance(body, dict):
                body = {}
            session_id = str(body.get(SESSION_ID_KEY) or current_session_id() or "anonymous")[:256]
            trace.get_current_span().set_attribute(names.ATTR_SESSION_ID, session_id)  # no-op when off
            state = sessions.pop(session_id, None) or {"verifications": 0}
            sessions[session_id] = state
            while len(sessions) > settings.max_sessions:
                sessions.popitem(last=False)
            try:
                reward = verify(str(body.get("response", "")), str(body.get("expected", "")))
            except Exception as err:
                raise NgFailureEvent(
                    "verifier_error",
                    f"verifier raised {type(err).__name__}",
                    boundary="resources_server",
                    stage="verification",
                ) from err
            state["verifications"] += 1
            state["reward"] = reward
            return {"reward": reward, "session_id": session_id, "verifications": state["verifications"]}

        return app
