"""What every demo server shares: its own-config model, the fault middleware, per-process telemetry tweaks.

Demo servers are ordinary ``SimpleServer`` subclasses: they get the runtime's middlewares, SERVER span and
failure replies exactly like a user's server. The harness adds two things only: a ``FaultMiddleware``
(innermost, so the runtime sees injected faults as real ones) and, when asked, a per-process Prometheus port
(one global telemetry section cannot give each process its own port).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

import aiohttp
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp

from gym_obs.client.http_client import (
    RetriesExhaustedError,
    close_global_aiohttp_client,
    configure_global_aiohttp_client,
)
from gym_obs.config import ConfigError
from gym_obs.failures import NgFailureEvent
from gym_obs.failures.kinds import Boundary, Stage
from gym_obs.harness.fault_middleware import ControlRoute, FaultMiddleware
from gym_obs.harness.faults import FaultSelector, format_validation_error, parse_fault_plan
from gym_obs.server import SimpleServer
from gym_obs.telemetry.setup import setup_telemetry

__all__ = [
    "ROLE_SERVER_TYPES",
    "HarnessServer",
    "OwnConfig",
    "failure_for_call",
]

Role = Literal["agent", "model", "resources"]
ROLE_SERVER_TYPES: Final[dict[str, str]] = {
    "agent": "responses_api_agents",
    "model": "responses_api_models",
    "resources": "resources_servers",
}
_SERVER_ERROR_KINDS: Final = {"model": "provider_unavailable", "agent": "agent_run_error"}


class OwnConfig(BaseModel):
    """Keys every demo server accepts in its own section of the global config."""

    # protected_namespaces=(): the demo model's ``model_calls`` is a field, not pydantic's (2.9 warns).
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    fault_plan: dict[str, Any] | None = None
    prometheus_port: int | None = Field(default=None, ge=1, le=65535)
    seed: int | None = None


class HarnessServer(SimpleServer):
    """Base of the demo servers: validated own config, faults, optional per-process Prometheus port."""

    role: ClassVar[Role]
    settings_model: ClassVar[type[OwnConfig]] = OwnConfig
    hooked_routes: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, server_name: str, global_config: Any) -> None:
        super().__init__(server_name, global_config)
        try:
            self.settings = self.settings_model.model_validate(self.config.own_config())
        except ValidationError as exc:
            raise ConfigError(f"{self.where}: {format_validation_error(exc)}") from None
        self.faults = FaultSelector(
            self.role, server_name, parse_fault_plan(self.settings.fault_plan), seed=self.settings.seed
        )

    def build_app(self) -> ASGIApp:
        if self.settings.prometheus_port is not None:
            # setup_telemetry is once per process: this call decides, the runtime's later call reuses it.
            telemetry = self.global_config.telemetry
            exporters = [e for e in (telemetry.metrics_exporter or "").split(",") if e.strip()]
            config = telemetry.model_copy(
                update={
                    "metrics_exporter": ",".join([*exporters, "prometheus"]),
                    "prometheus_host": self.config.host,
                    "prometheus_port": self.settings.prometheus_port,
                }
            )
            self.telemetry = setup_telemetry(self.server_name, self.server_type, config=config)
        configure_global_aiohttp_client(self.global_config.client)
        return ControlRoute(super().build_app(), self.faults)  # control calls: no SERVER span, no metric

    def new_app(self) -> FastAPI:
        """A FastAPI app with the fault middleware installed and the client pools closed on shutdown."""
        app = FastAPI(title=f"gym_obs demo {self.role} ({self.server_name})", openapi_url=None)
        app.add_middleware(FaultMiddleware, selector=self.faults, hooked_routes=self.hooked_routes)
        app.router.add_event_handler("shutdown", close_global_aiohttp_client)
        return app


def failure_for_call(
    err: BaseException, *, role: str, stage: Stage, what: str, boundary: Boundary | None = None
) -> NgFailureEvent:
    """The event an agent raises (``from err``) when its call to ``role`` failed, as a real agent would.

    A failure the callee reported is wrapped as ``agent_request_failed`` so the chain keeps the callee's
    event as cause; an HTTP error without a report or a transport error is the callee boundary's failure.
    """
    if boundary is None:
        boundary = "model" if role == "model" else "resources_server"
    if isinstance(err, NgFailureEvent):
        return NgFailureEvent("agent_request_failed", f"{what} failed", boundary="agent", stage=stage)
    if isinstance(err, aiohttp.ClientResponseError):
        status = err.status
        if status == 429:
            kind = "provider_quota_exhausted"
        elif status >= 500:
            kind = _SERVER_ERROR_KINDS.get(role, "environment_server_failed")
        else:
            kind = "protocol_violation"
        return NgFailureEvent(
            kind, f"{what}: HTTP {status}", boundary=boundary, stage=stage, http_status=status
        )
    if isinstance(err, RetriesExhaustedError) and err.__cause__ is not None:
        err = err.__cause__  # classify by the last attempt's error
    if isinstance(err, TimeoutError):
        kind = "agent_timeout" if role == "agent" else "transport_timeout"
    elif isinstance(err, aiohttp.ClientConnectorError):
        kind = "transport_unreachable"
    elif isinstance(err, aiohttp.ClientError | OSError):
        kind = "transport_peer_drop"
    elif isinstance(err, ValueError):
        kind = "protocol_violation"
    else:
        kind = "internal_error"
    return NgFailureEvent(kind, f"{what}: {type(err).__name__}", boundary=boundary, stage=stage)
