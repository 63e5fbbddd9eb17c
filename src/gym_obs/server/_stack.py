"""The layers of a gym server, in the order a request passes them: declared here, built from this order.

Outermost first (``LAYER_ORDER``); why each sits where it does:

- ``control``        gym's own control routes (``/_gym/inflight``): answered before anything else, from any
                     worker, with no span, no session, no failure log (by the context layer's frame, first,
                     when no owner routing sits between them)
- ``owner_routing``  under several workers, forwards a session's request to the worker owning it; outside
                     all telemetry, so a forwarded request has its one SERVER span at the owner
- ``context``        strips ``/ng-trace``/``/ng-rollout``, sets the rollout context, creates the request's
                     exchange (``_exchange``); before the span, which extracts the trace context from the
                     header this layer writes and names itself after the route without ids
- ``span``           the one SERVER span: the native layer (``_span``) around the app, or the contrib FastAPI
                     instrumentation inside it (``server_instrumentation: contrib``)
- ``sessions``       inside the span (the session id goes on it), outside the failure reply (the session is
                     current while a failure is logged, and a failure reply hands back a new token)
- ``failure_reply``  failure log, ``X-NG-Failure-Report``, exception -> failure reply; inside the span so
                     events carry its ids
- ``disconnect``     caller gone before the reply -> handler cancelled; inside the failure reply, which then
                     sends nothing
- ``model_calls``    GenAI metrics off the reply of a model server; inside the failure reply, so it sees
                     the handler's exceptions

Layers after ``span`` are FastAPI middlewares of the app; ``span`` and the ones before it wrap the app's
middleware stack from outside (contrib's instrumentation does the same from inside FastAPI).
``sessions``, ``failure_reply`` and ``disconnect`` (``STEP_LAYERS``) are given as step objects, not
installers: they run as steps of one frame (``_steps.RequestSteps``), one FastAPI middleware where the
outermost of them sits, in this same order. ``context`` may be given as a step too (a
``_context.PathContext``) when no layer sits between it and the app (no ``span``: telemetry off); then
the one frame starts with it, inside FastAPI's error middleware and before routing. ``SimpleServer`` then
lifts that frame to the top of the app's stack, in place of FastAPI's frames that do nothing for a gym
request, with Starlette's error layer as its outermost step and its exception layer as its innermost
(``_server_errors.steps_on_top``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from fastapi import FastAPI
from starlette.types import ASGIApp

from gym_obs.server._steps import RequestSteps

__all__ = ["LAYER_ORDER", "STEP_LAYERS", "Install", "build_stack", "fastapi_middleware"]

LAYER_ORDER: Final = (
    "control",
    "owner_routing",
    "context",
    "span",
    "sessions",
    "failure_reply",
    "disconnect",
    "model_calls",
)

#: the layers run as steps of one frame, by the name of their ``RequestSteps`` argument (``context``: when
#: given as a step object, not as an installer)
STEP_LAYERS: Final = {
    "context": "context",
    "sessions": "sessions",
    "failure_reply": "failures",
    "disconnect": "disconnect",
}

Install = Callable[[ASGIApp], ASGIApp]
"""Puts one layer around (or into) the app built so far and returns the result."""


def fastapi_middleware(middleware: type, **options: Any) -> Install:
    """An :data:`Install` adding ``middleware`` as the outermost of the FastAPI app's own middlewares."""

    def install(app: ASGIApp) -> ASGIApp:
        if not isinstance(app, FastAPI):
            raise TypeError(f"{middleware.__name__} goes inside the FastAPI app, not around {app!r}")
        app.add_middleware(middleware, **options)  # type: ignore[arg-type]
        return app

    return install


def build_stack(app: FastAPI, layers: Mapping[str, Any]) -> ASGIApp:
    """``app`` with ``layers`` (by name; ``None`` or absent: not in this server) installed in
    :data:`LAYER_ORDER`, innermost first: an :data:`Install` for each layer, a step object for each of
    :data:`STEP_LAYERS` (they are installed together, as one frame, where the outermost of them sits;
    ``context`` may be either)."""
    unknown = set(layers) - set(LAYER_ORDER)
    if unknown:
        raise ValueError(f"layers not in LAYER_ORDER: {sorted(unknown)}")
    given = {name for name in STEP_LAYERS if _is_step(layers.get(name))}
    steps = {STEP_LAYERS[name]: layers[name] for name in given}
    outermost_step = next((name for name in LAYER_ORDER if name in given), None)
    built: ASGIApp = app
    for name in reversed(LAYER_ORDER):
        install: Install | None
        if name in given:
            install = fastapi_middleware(RequestSteps, **steps) if name == outermost_step else None
        else:
            install = layers.get(name)
        if install is not None:
            built = install(built)
    return built


def _is_step(layer: object) -> bool:
    """A step object (not an installer, which is callable; ``None``: the layer is absent)."""
    return layer is not None and not callable(layer)
