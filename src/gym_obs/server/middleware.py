"""Pure ASGI middlewares of a gym server (never BaseHTTPMiddleware: no extra task, no body buffering).

Order, outermost first, as ``SimpleServer.build_app`` assembles it::

    PathContextMiddleware       /ng-trace and /ng-rollout segments, rollout context  (outside the span)
      FastAPI + contrib instrumentation: the one SERVER span
        FailureReplyMiddleware  failure log, X-NG-Failure-Report, exception -> failure reply, and
                                (DisconnectCancelMiddleware fused in) caller gone -> handler cancelled
          the server's own middlewares and routes

The path middleware must run before the instrumentation extracts the trace context (it turns the
``/ng-trace/<traceparent>`` segment into a header) and before routing (the span gets the route template,
not a path with ids). The failure middleware runs inside the span so events carry its ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from gym_obs.server._disconnect import DisconnectCancelMiddleware
from gym_obs.server._failure_reply import FailureReplyMiddleware, boundary_for_server_type
from gym_obs.server._native_telemetry import NATIVE_TELEMETRY_SCOPE_KEY
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.propagation import parse_path_segments, rollout_context

__all__ = [
    "DisconnectCancelMiddleware",
    "FailureReplyMiddleware",
    "PathContextMiddleware",
    "boundary_for_server_type",
]

_SEGMENT_MARK: Final = "/ng-"
_TRACEPARENT: Final = names.TRACEPARENT_HEADER.encode("latin-1")
_ROLLOUT_HEADER: Final = names.ROLLOUT_ID_HEADER.lower().encode("latin-1")
_MAX_ROLLOUT_ID_CHARS: Final = 256


def _header_rollout_id(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for key, value in headers:
        if key == _ROLLOUT_HEADER:
            text = value.decode("latin-1").strip()
            if text and len(text) <= _MAX_ROLLOUT_ID_CHARS and text.isprintable():
                return text
            return None
    return None


class PathContextMiddleware:
    """Strip ``/ng-trace/<traceparent>`` and ``/ng-rollout/<id>``; join the trace; set the rollout context.

    A real ``traceparent`` header wins over the segment; the segment is stripped even when traces are off.
    The rollout id comes from the path prefix, else from the ``X-NG-Rollout-Id`` header. Also marks the
    request as excluded from FastAPI's built-in telemetry (see ``_native_telemetry``).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        scope[NATIVE_TELEMETRY_SCOPE_KEY] = None
        rollout_id: str | None = None
        path: str = scope["path"]
        if _SEGMENT_MARK in path:
            parsed = parse_path_segments(path)
            if parsed.path != path:
                self._strip(scope, parsed.path, parsed.traceparent)
                rollout_id = parsed.rollout_id
        if rollout_id is None:
            rollout_id = _header_rollout_id(scope["headers"])
            if rollout_id is None:
                await self.app(scope, receive, send)
                return
        with rollout_context(rollout_id):
            await self.app(scope, receive, send)

    @staticmethod
    def _strip(scope: Scope, path: str, traceparent: str | None) -> None:
        scope["path"] = path
        raw = scope.get("raw_path")
        if raw:
            scope["raw_path"] = parse_path_segments(raw.decode("latin-1")).path.encode("latin-1")
        if traceparent is None or not STATE.traces_enabled:
            return
        headers = list(scope["headers"])
        if any(key == _TRACEPARENT for key, _ in headers):
            return  # a real header wins
        headers.append((_TRACEPARENT, traceparent.encode("latin-1")))
        scope["headers"] = headers
