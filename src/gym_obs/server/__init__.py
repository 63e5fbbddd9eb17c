"""The FastAPI/uvicorn server runtime: SimpleServer, HeadServer, the launcher and the gym middlewares."""

from __future__ import annotations

from gym_obs.server._instrumentation import instrument_app_for_telemetry
from gym_obs.server.base_server import BaseServer, SimpleServer, load_server
from gym_obs.server.head_server import HeadServer
from gym_obs.server.launcher import Launch, LaunchError, launch
from gym_obs.server.middleware import (
    DisconnectCancelMiddleware,
    FailureReplyMiddleware,
    PathContextMiddleware,
    boundary_for_server_type,
)
from gym_obs.server.uvicorn import (
    KeepaliveHttpToolsProtocol,
    ServerStartupError,
    validate_forwarded_allow_ips,
)

__all__ = [
    "BaseServer",
    "DisconnectCancelMiddleware",
    "FailureReplyMiddleware",
    "HeadServer",
    "KeepaliveHttpToolsProtocol",
    "Launch",
    "LaunchError",
    "PathContextMiddleware",
    "ServerStartupError",
    "SimpleServer",
    "boundary_for_server_type",
    "instrument_app_for_telemetry",
    "launch",
    "load_server",
    "validate_forwarded_allow_ips",
]
