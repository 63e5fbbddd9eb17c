"""Switch off FastAPI's built-in OpenTelemetry so each request has exactly one SERVER span.

FastAPI >= 0.165 traces, meters and logs every request by itself as soon as a global OpenTelemetry
provider is installed (``FastAPI.__call__`` -> ``NativeTelemetry``). gym servers get their SERVER span
from gym_obs's own layer (``_span``) or, when chosen, opentelemetry-instrumentation-fastapi (one span shape
across versions, health routes excluded), so the built-in one must never run: it would add a second
SERVER span (always, or whenever the contrib middleware is not in the built stack: instrumentation off or
failed, mounted sub-apps), emit spans while gym telemetry is off, and log exception messages with stack
traces.

Two independent switches, both no-ops on FastAPI versions without the feature:
- the app's telemetry config is turned off (``enabled()`` becomes False, so ``__call__`` goes straight to
  Starlette and the lifespan never auto-configures exporters);
- the outermost gym middleware puts ``scope["fastapi.telemetry"] = None`` on every request, which is how
  FastAPI itself marks a request as excluded (it also covers FastAPI apps mounted inside the server).

With both, the exception observer FastAPI puts in every app's middleware stack (it hands an unhandled
exception to the request's telemetry, which such a request has none of) is a frame every request passes
for nothing; :func:`drop_exception_observer` builds a gym server's stack without it.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.types import ASGIApp

NATIVE_TELEMETRY_SCOPE_KEY: Final = "fastapi.telemetry"

#: FastAPI's exception observer, by its type's module and name
EXCEPTION_OBSERVER: Final = ("fastapi.telemetry._asgi", "ExceptionTelemetryMiddleware")
_OFF: Final = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
    "auto_configure": False,
}


def disable_native_telemetry(app: Any) -> bool:
    """Turn FastAPI's built-in telemetry off for ``app``; True when the running FastAPI has it."""
    config = getattr(app, "_telemetry", None)
    if not isinstance(config, dict):
        return False
    config.update(_OFF)
    return True


def frame_kind(frame: object) -> tuple[str, str]:
    """The module and name of a middleware stack frame's type: how FastAPI's own frames are known here (by
    name, not imported: a FastAPI version without one does not fail)."""
    return type(frame).__module__, type(frame).__qualname__


def drop_exception_observer(app: Any) -> None:
    """Build ``app``'s middleware stack without FastAPI's exception observer
    (``ExceptionTelemetryMiddleware``): for a gym server's app, whose requests all carry
    ``scope["fastapi.telemetry"] = None``, it observes nothing. A no-op on FastAPI versions without it,
    or a stack where it is not found."""
    build = getattr(app, "build_middleware_stack", None)
    if build is None:
        return

    def build_without_observer() -> ASGIApp:
        stack: ASGIApp = build()
        outer: Any = stack
        inner: Any = getattr(outer, "app", None)
        while inner is not None:
            if frame_kind(inner) == EXCEPTION_OBSERVER and hasattr(inner, "app"):
                outer.app = inner.app
                break
            outer, inner = inner, getattr(inner, "app", None)
        return stack

    app.build_middleware_stack = build_without_observer
