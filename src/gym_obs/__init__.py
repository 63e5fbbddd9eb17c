"""gym_obs: an observability-first client/server runtime for multi-process rollout systems.

The names here are what a handler author imports. They load lazily (PEP 562) so that ``import gym_obs``
and ``gym-obs --version`` do not pay for FastAPI, aiohttp and the OpenTelemetry SDK until they are used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gym_obs._version import __version__

if TYPE_CHECKING:
    from gym_obs.client import (
        ServerClient,
        TimedSemaphore,
        format_exception_with_response_body,
        get_response_json,
        iter_sse_data,
        raise_boundary_failure,
        raise_for_status,
        request,
    )
    from gym_obs.failures import (
        FailureReport,
        ForeignFailure,
        NgFailureEvent,
        caused_by,
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
    "RolloutOmitted": "gym_obs.server",
    "ServerClient": "gym_obs.client",
    "SimpleServer": "gym_obs.server",
    "TimedSemaphore": "gym_obs.client",
    "caused_by": "gym_obs.failures",
    "configure_logging": "gym_obs.telemetry.logging",
    "current_rollout": "gym_obs.server",
    "current_rollout_id": "gym_obs.telemetry.propagation",
    "failure_report_for": "gym_obs.failures",
    "format_exception_with_response_body": "gym_obs.client",
    "get_logger": "gym_obs.telemetry.logging",
    "get_response_json": "gym_obs.client",
    "iter_sse_data": "gym_obs.client",
    "launch": "gym_obs.server",
    "raise_boundary_failure": "gym_obs.client",
    "raise_for_status": "gym_obs.client",
    "read_report_from_row": "gym_obs.failures",
    "request": "gym_obs.client",
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
    "caused_by",
    "configure_logging",
    "current_rollout",
    "current_rollout_id",
    "failure_report_for",
    "format_exception_with_response_body",
    "get_logger",
    "get_response_json",
    "iter_sse_data",
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
