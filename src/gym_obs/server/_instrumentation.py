"""The one SERVER span per request: opentelemetry-instrumentation-fastapi, configured once per app.

Why contrib and not FastAPI's built-in telemetry: the span shape stays the same across FastAPI versions,
the receive/send sub-spans (two extra INTERNAL spans per message) can be excluded, health routes are not
traced, and it is the instrumentation the rest of the ecosystem expects. The built-in telemetry is turned
off separately (``_native_telemetry``); together that leaves exactly one SERVER span per request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, Final

from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.propagation import current_rollout_id

__all__ = ["HEALTH_ROUTES", "instrument_app_for_telemetry"]

HEALTH_ROUTES: Final = ("/livez", "/readyz")
_SEMCONV_ENV: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"

_log = logging.getLogger("gym_obs.server")


def _server_request_hook(span: Any, scope: dict[str, Any]) -> None:
    """Runs inside the SERVER span: the rollout context is already set by the path middleware."""
    rollout_id = current_rollout_id()
    if rollout_id is not None and span is not None and span.is_recording():
        span.set_attribute(names.ATTR_ROLLOUT_ID, rollout_id)


def _excluded_urls(routes: Sequence[str]) -> str:
    # Matched with re.search against the full URL without query: anchor on the path end.
    return ",".join(f"{route}$" for route in routes)


def instrument_app_for_telemetry(app: Any, *, excluded_routes: Sequence[str] = HEALTH_ROUTES) -> bool:
    """Add the FastAPI SERVER-span instrumentation to ``app``; True when it is in place.

    Does nothing when telemetry is off (off means off). Never raises: a server keeps serving without
    spans rather than failing to start because of its instrumentation.
    """
    if not STATE.enabled:
        return False
    try:
        # Stable HTTP semantic conventions (http.server.request.duration in seconds, url.path, ...)
        # unless the operator chose otherwise; read once per process by the instrumentation.
        os.environ.setdefault(_SEMCONV_ENV, "http")
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(
            app,
            server_request_hook=_server_request_hook,
            excluded_urls=_excluded_urls(excluded_routes),
            exclude_spans=["receive", "send"],
        )
    except Exception:
        _log.warning("FastAPI instrumentation failed; serving without SERVER spans", exc_info=True)
        return False
    return True
