"""gym_obs: an observability-first client/server runtime for multi-process rollout systems.

The names here are what a handler author imports. They load lazily (PEP 562) so that ``import gym_obs``
and ``gym-obs --version`` do not pay for FastAPI, aiohttp and the OpenTelemetry SDK until they are used.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("gym-obs")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

if TYPE_CHECKING:
    from gym_obs.client.concurrency import TimedSemaphore
    from gym_obs.client.http_client import (
        format_exception_with_response_body,
        get_response_json,
        raise_boundary_failure,
        raise_for_status,
        request,
    )
    from gym_obs.client.server_client import ServerClient
    from gym_obs.failures import (
        FailureReport,
        ForeignFailure,
        NgFailureEvent,
        failure_report_for,
        read_report_from_row,
        store_report_on_row,
    )
    from gym_obs.server import (
        RolloutOmitted,
        SimpleServer,
        current_rollout,
        launch,
        rollout_route,
        rollout_scope,
    )
    from gym_obs.telemetry.logging import configure_logging, get_logger
    from gym_obs.telemetry.propagation import current_rollout_id, rollout_context
    from gym_obs.telemetry.setup import setup_telemetry, shutdown_telemetry

_EXPORTS: dict[str, str] = {
    "FailureReport": "gym_obs.failures",
    "ForeignFailure": "gym_obs.failures",
    "NgFailureEvent": "gym_obs.failures",
    "ServerClient": "gym_obs.client.server_client",
    "RolloutOmitted": "gym_obs.server",
    "SimpleServer": "gym_obs.server",
    "TimedSemaphore": "gym_obs.client.concurrency",
    "configure_logging": "gym_obs.telemetry.logging",
    "current_rollout": "gym_obs.server",
    "current_rollout_id": "gym_obs.telemetry.propagation",
    "failure_report_for": "gym_obs.failures",
    "format_exception_with_response_body": "gym_obs.client.http_client",
    "get_logger": "gym_obs.telemetry.logging",
    "get_response_json": "gym_obs.client.http_client",
    "launch": "gym_obs.server",
    "raise_boundary_failure": "gym_obs.client.http_client",
    "raise_for_status": "gym_obs.client.http_client",
    "read_report_from_row": "gym_obs.failures",
    "request": "gym_obs.client.http_client",
    "rollout_context": "gym_obs.telemetry.propagation",
    "rollout_route": "gym_obs.server",
    "rollout_scope": "gym_obs.server",
    "setup_telemetry": "gym_obs.telemetry.setup",
    "shutdown_telemetry": "gym_obs.telemetry.setup",
    "store_report_on_row": "gym_obs.failures",
}

__all__ = [
    "FailureReport",
    "ForeignFailure",
    "NgFailureEvent",
    "RolloutOmitted",
    "ServerClient",
    "SimpleServer",
    "TimedSemaphore",
    "__version__",
    "configure_logging",
    "current_rollout",
    "current_rollout_id",
    "failure_report_for",
    "format_exception_with_response_body",
    "get_logger",
    "get_response_json",
    "launch",
    "raise_boundary_failure",
    "raise_for_status",
    "read_report_from_row",
    "request",
    "rollout_context",
    "rollout_route",
    "rollout_scope",
    "setup_telemetry",
    "shutdown_telemetry",
    "store_report_on_row",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gym_obs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
