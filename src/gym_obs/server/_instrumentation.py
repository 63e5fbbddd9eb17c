"""The one SERVER span per request: opentelemetry-instrumentation-fastapi, configured once per app.

Why contrib and not FastAPI's built-in telemetry: the span shape stays the same across FastAPI versions,
the receive/send sub-spans (two extra INTERNAL spans per message) can be excluded, health routes are not
traced, and it is the instrumentation the rest of the ecosystem expects. The built-in telemetry is turned
off separately (``_native_telemetry``); together that leaves exactly one SERVER span per request.

The instrumentation records the raw query string (``url.query``, and ``http.target``/``http.url`` in the old
conventions) and the raw ``User-Agent`` when it starts the span, before any hook runs. So it is shown a
private view of the request: :func:`hide_from_instrumentation` (outside it, in the path middleware) blanks
the query and scrubs the User-Agent in the scope, and :func:`restore_after_instrumentation` (inside it, first
thing in the failure-reply layer) puts the originals back, so handlers see the request as it was sent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping, Sequence
from typing import Any, Final

from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.propagation import current_rollout_id
from gym_obs.telemetry.redaction import scrub_text

__all__ = [
    "HEALTH_ROUTES",
    "hide_from_instrumentation",
    "instrument_app_for_telemetry",
    "restore_after_instrumentation",
]

HEALTH_ROUTES: Final = ("/livez", "/readyz")
_SEMCONV_ENV: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
_HIDDEN_QUERY: Final = "gym_obs.hidden_query_string"
_HIDDEN_HEADERS: Final = "gym_obs.hidden_headers"
_USER_AGENT: Final = b"user-agent"

_log = logging.getLogger("gym_obs.server")


def hide_from_instrumentation(scope: MutableMapping[str, Any]) -> None:
    """Blank the query string and scrub the User-Agent in ``scope`` for the SERVER-span instrumentation.

    Costs a dict lookup and one pass over the headers when the request has neither to hide.
    """
    query = scope.get("query_string")
    if query:
        scope[_HIDDEN_QUERY] = query
        scope["query_string"] = b""
    headers = scope.get("headers")
    if not headers:
        return
    for index, (key, value) in enumerate(headers):
        if key == _USER_AGENT:
            text = value.decode("latin-1")
            clean = scrub_text(text)
            if clean != text:
                view = list(headers)
                view[index] = (key, clean.encode("latin-1", "replace"))
                scope[_HIDDEN_HEADERS] = headers
                scope["headers"] = view
            return


def restore_after_instrumentation(scope: MutableMapping[str, Any]) -> None:
    """Undo :func:`hide_from_instrumentation` (a no-op when nothing was hidden)."""
    query = scope.pop(_HIDDEN_QUERY, None)
    if query is not None:
        scope["query_string"] = query
    headers = scope.pop(_HIDDEN_HEADERS, None)
    if headers is not None:
        scope["headers"] = headers


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
