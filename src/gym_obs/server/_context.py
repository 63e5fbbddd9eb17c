"""Path and rollout context: the outermost gym layer of a request, and the one outside the SERVER span.

It must run before the span's instrumentation extracts the trace context (it turns the
``/ng-trace/<traceparent>`` segment into a header) and before routing (the span gets the route template, not
a path with ids). It also creates the request's :class:`~gym_obs.server._exchange.Exchange`, the one object
the layers inside share, and, when the SERVER span is contrib's (``server_instrumentation: contrib``), hides
the query string from it (see ``_instrumentation``; the failure-reply layer gives it back to the handlers).
The native span (``_span``) never reads the query, so nothing is hidden for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_obs.server._exchange import EXCHANGE_SCOPE_KEY, Exchange
from gym_obs.server._instrumentation import hide_from_instrumentation
from gym_obs.server._native_telemetry import NATIVE_TELEMETRY_SCOPE_KEY
from gym_obs.telemetry import inflight, names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.propagation import ROLLOUT_ID, parse_path_segments

__all__ = ["PathContext", "PathContextMiddleware"]

_SEGMENT_MARK: Final = "/ng-"
_TRACEPARENT: Final = names.TRACEPARENT_HEADER.encode("latin-1")
_ROLLOUT_HEADER: Final = names.ROLLOUT_ID_HEADER.lower().encode("latin-1")
_MAX_ROLLOUT_ID_CHARS: Final = 256
_PROPAGATOR: Final = TraceContextTextMapPropagator()


def _header_rollout_id(value: bytes) -> str | None:
    """The rollout id an ``X-NG-Rollout-Id`` header value names, if it is a valid one."""
    text = value.decode("latin-1").strip()
    if text and len(text) <= _MAX_ROLLOUT_ID_CHARS and text.isprintable():
        return text
    return None


class PathContext:
    """What the context layer does to a request, shared by its two forms: :class:`PathContextMiddleware`
    (a frame of its own, outside the SERVER span) and a step of the gym layers' one frame (``_steps``),
    which ``SimpleServer`` uses when no layer sits between the two (telemetry off).

    ``hide_query``: with telemetry on, hide the query string (and a secret-looking User-Agent) from the
    SERVER-span instrumentation inside; only for stacks where ``FailureReplyMiddleware`` runs inside the
    instrumentation and gives them back (``SimpleServer`` builds exactly that).

    ``control``: the app answering gym's control routes (``control_paths``, HTTP), asked before anything
    else; ``SimpleServer`` runs its control layer here when no other layer sits between the two (one
    frame less per request), the same as wrapping this layer in it.
    """

    __slots__ = ("control", "control_paths", "hide_query")

    def __init__(
        self, *, hide_query: bool = False, control: ASGIApp | None = None, control_paths: Iterable[str] = ()
    ) -> None:
        self.hide_query = hide_query
        self.control = control
        self.control_paths = frozenset(control_paths) if control is not None else frozenset()

    def open(self, scope: Scope, exchange: Exchange) -> str | None:
        """Mark the request as excluded from FastAPI's built-in telemetry, strip the path segments, index
        the headers on ``exchange`` (for the layers inside); the request's rollout id, if it has one."""
        scope[NATIVE_TELEMETRY_SCOPE_KEY] = None
        rollout_id: str | None = None
        if _SEGMENT_MARK in scope["path"]:
            rollout_id = PathContextMiddleware._strip(scope)
        if self.hide_query and STATE.enabled:
            hide_from_instrumentation(scope)
        # The headers by name, built once (in C) for this layer and the ones inside (the sessions step).
        headers = scope["headers"]
        by_name = exchange.headers_by_name = dict(headers)
        if rollout_id is None and _ROLLOUT_HEADER in by_name:  # (of several, the first one counts)
            rollout_id = _header_rollout_id(next(v for k, v in headers if k == _ROLLOUT_HEADER))
        return rollout_id

    def around(self, app: ASGIApp) -> PathContextMiddleware:
        """This context as a frame of its own around ``app``."""
        return PathContextMiddleware(app, context=self)


class PathContextMiddleware:
    """Strip ``/ng-trace/<traceparent>`` and ``/ng-rollout/<id>``; join the trace; set the rollout context.

    A real ``traceparent`` header wins over the segment (a malformed one does not: the segment replaces it);
    the segment is stripped even when traces are off.
    The rollout id comes from the path prefix, else from the ``X-NG-Rollout-Id`` header. Also marks the
    request as excluded from FastAPI's built-in telemetry (see ``_native_telemetry``) and gives it the
    exchange the layers inside share. ``hide_query``, ``control``, ``control_paths``: see
    :class:`PathContext` (or pass one as ``context``).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        hide_query: bool = False,
        control: ASGIApp | None = None,
        control_paths: Iterable[str] = (),
        context: PathContext | None = None,
    ) -> None:
        self.app = app
        if context is None:
            context = PathContext(hide_query=hide_query, control=control, control_paths=control_paths)
        self.context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        context = self.context
        if kind == "http" and scope["path"] in context.control_paths and context.control is not None:
            await context.control(scope, receive, send)
            return
        exchange = scope[EXCHANGE_SCOPE_KEY] = Exchange()
        send = exchange.bind(send)  # the one send wrapper of the layers inside
        rollout_id = context.open(scope, exchange)
        if rollout_id is None:
            await self.app(scope, receive, send)
            return
        # Every hop of a rollout carries its id: the context variable directly, not a generator-based
        # context manager (``propagation.rollout_context``), which costs several times more per request.
        token = ROLLOUT_ID.set(rollout_id)
        try:
            with inflight.rollout(rollout_id):  # in-flight table (agents only)
                await self.app(scope, receive, send)
        finally:
            ROLLOUT_ID.reset(token)

    @staticmethod
    def _strip(scope: Scope) -> str | None:
        """Strip the segments from ``path`` and ``raw_path``; returns the segment's rollout id.

        The segments are read from ``raw_path`` (still percent-encoded) when the server gives it: a rollout
        id is percent-encoded in the URL (``a/b`` travels as ``a%2Fb``), and splitting the decoded path would
        cut such an id at its slash and route the request to the wrong path.
        """
        raw: bytes | None = scope.get("raw_path")
        if raw:
            raw_text = raw.decode("latin-1").partition("?")[0]
            parsed = parse_path_segments(raw_text)
            if parsed.path == raw_text:
                return None
            scope["raw_path"] = parsed.path.encode("latin-1")
            scope["path"] = unquote(parsed.path)
        else:
            path: str = scope["path"]
            parsed = parse_path_segments(path)
            if parsed.path == path:
                return None
            scope["path"] = parsed.path
        traceparent = parsed.traceparent
        if traceparent is not None and STATE.traces_enabled:
            headers = scope["headers"]
            # A real, valid header wins; a malformed one is replaced by the segment.
            if not any(key == _TRACEPARENT and _valid_header(value) for key, value in headers):
                kept = [(key, value) for key, value in headers if key != _TRACEPARENT]
                kept.append((_TRACEPARENT, traceparent.encode("latin-1")))
                scope["headers"] = kept
        return parsed.rollout_id


def _valid_header(value: bytes) -> bool:
    """Whether a ``traceparent`` request header carries a usable span context (as the propagator reads it)."""
    context = _PROPAGATOR.extract({names.TRACEPARENT_HEADER: value.decode("latin-1")})
    return trace.get_current_span(context).get_span_context().is_valid
