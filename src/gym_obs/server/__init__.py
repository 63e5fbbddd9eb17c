"""The FastAPI/uvicorn server runtime: SimpleServer, HeadServer, the launcher and the gym middlewares."""

from __future__ import annotations

from gym_obs.server._context import PathContextMiddleware
from gym_obs.server._disconnect import DisconnectCancelMiddleware
from gym_obs.server._failure_reply import FailureReplyMiddleware, boundary_for_server_type
from gym_obs.server._instrumentation import instrument_app_for_telemetry
from gym_obs.server._profiler import ServerProfiler
from gym_obs.server.base_server import BaseServer, SimpleServer, load_server
from gym_obs.server.head_server import HeadServer
from gym_obs.server.launcher import Launch, LaunchError, launch
from gym_obs.server.ops import UlimitResult, set_ulimit
from gym_obs.server.rollouts import (
    RolloutOmitted,
    RolloutTally,
    current_rollout,
    rollout_route,
    rollout_scope,
)
from gym_obs.server.sessions import (
    SESSION_ID_KEY,
    OwnedSessionRouting,
    SessionMiddleware,
    current_session_id,
)
from gym_obs.server.uvicorn import (
    KeepaliveHttpToolsProtocol,
    ServerStartupError,
    validate_forwarded_allow_ips,
)

__all__ = [
    "SESSION_ID_KEY",
    "BaseServer",
    "DisconnectCancelMiddleware",
    "FailureReplyMiddleware",
    "HeadServer",
    "KeepaliveHttpToolsProtocol",
    "Launch",
    "LaunchError",
    "OwnedSessionRouting",
    "PathContextMiddleware",
    "RolloutOmitted",
    "RolloutTally",
    "ServerProfiler",
    "ServerStartupError",
    "SessionMiddleware",
    "SimpleServer",
    "UlimitResult",
    "boundary_for_server_type",
    "current_rollout",
    "current_session_id",
    "instrument_app_for_telemetry",
    "launch",
    "load_server",
    "rollout_route",
    "rollout_scope",
    "set_ulimit",
    "validate_forwarded_allow_ips",
]
