"""The native SERVER span: gym_obs's own pure-ASGI layer, one span and one duration point per request.

Why not opentelemetry-instrumentation-fastapi by default: per request it scans the headers about nine
times, builds the URL twice, matches every route again to find ``http.route``, sets each attribute twice
and records four or five metric points; together about 2.5x what the span itself costs (issue 13). This
layer reads the headers once, takes ``http.route`` from ``scope["route"]`` after the app ran, sets the
request and reply attributes once, when the span ends, and records one
``http.server.request.duration`` point from a cached attribute dict. ``server_instrumentation: contrib``
(config) or ``GYM_OBS_SERVER_INSTRUMENTATION=contrib`` selects the contrib instrumentation instead, for its
extras (``http.server.active_requests``, body-size histograms, header capture); see ``_instrumentation``.

It never records ``url.query`` (so the contrib path's query-hiding is not needed here), scrubs and bounds
``user_agent.original``, scrubs the ``exception`` event at the source (``telemetry.spans.record_exception``)
and does not trace the health routes. The span is current while the app runs (failure events, the session
id and client spans hang off it) and ends when the app returns, so an exception that escapes the app
after FastAPI's error middleware sent the 500 is still recorded on it.

Documented differences from contrib (``tests/integration/test_server_span_conformance.py`` checks the rest
is identical: names, kinds, parent edges, attribute values, the metric's name, unit and attributes):

- instrumentation scope ``gym_obs`` (contrib: ``opentelemetry.instrumentation.fastapi``);
- ``server.address`` and ``server.port`` come from the ``Host`` header, as the semantic conventions say
  (contrib puts the listening socket's ``host:port`` in ``server.address``); no ``client.port`` and no
  ``user_agent.synthetic.type`` (both optional in the conventions);
- ``user_agent.original`` is cut at ``names.MAX_USER_AGENT_CHARS`` after scrubbing;
- an exception that escapes the app after its reply started also sets ``error.type`` (the exception type)
  on the span and the metric point, is recorded as one ``exception`` event (contrib records it twice), and
  the span status description is the type only (contrib: no ``error.type``, ``"<type>: <message>"``);
- the histogram has the registry's buckets (``names.HTTP_DURATION_BUCKETS_S``, up to 60 s; contrib: the
  conventions' advisory buckets, up to 10 s);
- the span starts named ``{METHOD}``, without attributes, and gets its name ``{METHOD} {route}`` and all
  its attributes when it ends (a sampler sees neither; contrib's sees the request attributes and route);
- the span ends when the app returns, background tasks included, as both record the duration point
  (contrib ends its span at the last body message);
- health routes are excluded by exact path (contrib: any path ending in ``/livez`` or ``/readyz``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from time import perf_counter
from typing import Any, Final

from fastapi import FastAPI

try:  # FastAPI >= 0.137.2: included routers' routes with their full templates
    from fastapi.routing import iter_route_contexts
except ImportError:  # pragma: no cover - older FastAPI: the routes are matchable as they are
    iter_route_contexts = None  # type: ignore[assignment]
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import get_global_textmap
from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_obs.server._exchange import Exchange
from gym_obs.server._instrumentation import HEALTH_ROUTES, instrument_app_for_telemetry
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry._types import AttributeValue
from gym_obs.telemetry.metrics import AttributeCache
from gym_obs.telemetry.propagation import context_from_traceparent, current_rollout_id, w3c_default_propagator
from gym_obs.telemetry.redaction import scrub_text
from gym_obs.telemetry.spans import (
    INTERNAL_KIND,
    SERVER_KIND,
    record_exception,
    set_trusted_attributes,
    start_trusted_span,
)

__all__ = ["ServerSpanMiddleware", "add_server_span"]

_log = logging.getLogger("gym_obs.server")

_HOST: Final = 0
_USER_AGENT: Final = 1
_TRACEPARENT: Final = 2
_CONTEXT: Final = 3
_TRACEPARENT_NAME: Final = "traceparent"
# One dict lookup per request header decides whether it is one of the few this layer reads.
_WANTED: Final = {
    b"host": _HOST,
    b"user-agent": _USER_AGENT,
    b"traceparent": _TRACEPARENT,
    b"tracestate": _CONTEXT,
    b"baggage": _CONTEXT,
}
_ROOT: Final = Context()  # no caller context: the span starts a trace (as contrib's extract does)
_NO_ATTRIBUTES: Final[dict[str, AttributeValue]] = {}  # the SERVER span gets its attributes when it ends
_MAX_CACHED: Final = 256  # request shapes and span names remembered (cleared when full)
_MAX_RAW_USER_AGENT: Final = 4 * names.MAX_USER_AGENT_CHARS  # bounds the scrubber's work
_SPAN_NAME_OTHER: Final = "HTTP"  # span name of a request with a method outside the conventions' set
_ERROR_STATUS: Final = 500


def add_server_span(app: ASGIApp, instrumentation: str) -> ASGIApp:
    """``app`` with its SERVER-span layer: the native one (``native``) or contrib's (``contrib``).

    Nothing is added while telemetry is off (off means off). With the ``server`` span group off, the native
    layer records only ``http.server.request.duration`` (whichever instrumentation was chosen): the metric
    keeps flowing, no span is created.
    """
    if instrumentation == names.SERVER_INSTRUMENTATION_CONTRIB and STATE.groups.server:
        if not isinstance(app, FastAPI):
            raise TypeError(f"contrib's SERVER span goes inside a FastAPI app, not around {app!r}")
        instrument_app_for_telemetry(app)
        return app
    if not STATE.enabled:
        return app
    return ServerSpanMiddleware(app)


class ServerSpanMiddleware:
    """One SERVER span (``{METHOD} {route}``) and one ``http.server.request.duration`` point per request.

    Per request it builds no object of its own: the reply status comes from the request's shared
    :class:`~gym_obs.server._exchange.Exchange` (whose ``send`` wrapper the layers already share), the
    request attributes that depend only on the request's shape (method, scheme, version, ``Host``,
    ``User-Agent``) are copied from a per-shape cache, a ``traceparent``-only carrier is parsed by
    ``propagation.context_from_traceparent`` (under the W3C default propagator), and the
    attributes, made valid here, go onto the span in one trusted pass when it ends.
    """

    def __init__(self, app: ASGIApp, *, excluded_paths: Sequence[str] = HEALTH_ROUTES) -> None:
        self.app = app
        self._excluded = frozenset(excluded_paths)
        self._metric_attributes = AttributeCache(
            names.ATTR_HTTP_REQUEST_METHOD,
            names.ATTR_URL_SCHEME,
            names.ATTR_HTTP_ROUTE,
            names.ATTR_HTTP_RESPONSE_STATUS_CODE,
            names.ATTR_ERROR_TYPE,
            names.ATTR_NETWORK_PROTOCOL_VERSION,
        )
        self._shapes: dict[tuple[Any, ...], dict[str, AttributeValue]] = {}
        self._names: dict[tuple[str, str | None], str] = {}
        self._failed_once = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if (kind != "http" and kind != "websocket") or scope["path"] in self._excluded or not STATE.enabled:
            await self.app(scope, receive, send)
            return
        start = perf_counter()
        if kind == "http":
            exchange, send = Exchange.join(scope, send)  # its send notes the reply status
        else:
            exchange = Exchange()  # a websocket that sent a message answered (status 200, as contrib)
            send = _websocket_send(exchange, send)
        try:
            span, attributes, context = self._start(scope)
        except Exception:
            self._telemetry_failed()
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(context) if context is not None else None
        error: Exception | None = None
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            error = exc
            raise
        finally:
            try:
                self._finish(scope, span, attributes, start, exchange.status, error)
            except Exception:
                self._telemetry_failed()
            if token is not None:
                otel_context.detach(token)

    def _start(self, scope: Scope) -> tuple[Span, dict[str, AttributeValue] | None, Context | None]:
        """The request's span (started, not current), its request attributes and the context to make
        current; ``(INVALID_SPAN, None, None)`` when only the metric is recorded."""
        tracer = STATE.tracer
        if not STATE.traces_enabled or tracer is None or not STATE.groups.server:
            return INVALID_SPAN, None, None
        host: bytes | None = None
        agent: bytes | None = None
        traceparent: bytes | None = None
        carrier: dict[str, str] | None = None
        wanted = _WANTED.get
        for key, value in scope["headers"]:
            slot = wanted(key)
            if slot is None:
                continue
            if slot == _HOST:
                host = value
            elif slot == _USER_AGENT:
                agent = value
            elif slot == _TRACEPARENT:
                traceparent = value  # (the last one, as the propagator's carrier dict keeps it)
            else:
                if carrier is None:
                    carrier = {}
                carrier[key.decode("latin-1")] = value.decode("latin-1")
        attributes = self._shape(scope, host, agent).copy()
        attributes[names.ATTR_URL_PATH] = scope["path"]
        client = scope.get("client")
        if client:
            attributes[names.ATTR_CLIENT_ADDRESS] = client[0]
        if trace.get_current_span() is not INVALID_SPAN:
            # Called in-process inside another span (a test client): a child, as contrib does.
            parent = otel_context.get_current()
            kind = INTERNAL_KIND
        else:
            kind = SERVER_KIND
            if carrier is None and w3c_default_propagator():
                parent = (
                    _ROOT if traceparent is None else context_from_traceparent(traceparent.decode("latin-1"))
                )
            else:
                if traceparent is not None:
                    carrier = carrier or {}
                    carrier[_TRACEPARENT_NAME] = traceparent.decode("latin-1")
                parent = get_global_textmap().extract(carrier) if carrier is not None else _ROOT
        # The attributes are set once, with the reply's, when the span ends (one pass, no re-validation).
        method = attributes.get(names.ATTR_HTTP_REQUEST_METHOD)
        name = _span_name(method if isinstance(method, str) else "", None)
        span = start_trusted_span(tracer, name, parent, kind, _NO_ATTRIBUTES)  # a sampled parent: no sampler
        return span, attributes, trace.set_span_in_context(span, parent)

    def _shape(self, scope: Scope, host: bytes | None, agent: bytes | None) -> dict[str, AttributeValue]:
        """The request attributes every request of this shape shares (cached; never mutate the result)."""
        raw_method: str | None = scope.get("method")
        key = (raw_method, scope.get("scheme"), scope.get("http_version"), host, agent, scope.get("server"))
        found = self._shapes.get(key)
        if found is None:
            if len(self._shapes) >= _MAX_CACHED:
                self._shapes.clear()
            found = self._shapes[key] = _shape_attributes(scope, raw_method, host, agent)
        return found

    def _finish(
        self,
        scope: Scope,
        span: Span,
        attributes: dict[str, AttributeValue] | None,
        start: float,
        status: int,
        error: BaseException | None,
    ) -> None:
        """End the span with the reply attributes and record the duration point."""
        route = _route_template(scope)
        error_type: str | None = None
        if status >= _ERROR_STATUS:
            error_type = str(status)
        elif error is not None:
            error_type = type(error).__qualname__
        raw_method: str | None = scope.get("method")
        method = _method(raw_method) if raw_method is not None else ""
        if attributes is not None and span.is_recording():
            if route is not None:
                attributes[names.ATTR_HTTP_ROUTE] = route
            if status:
                attributes[names.ATTR_HTTP_RESPONSE_STATUS_CODE] = status
            if error_type is not None:
                attributes[names.ATTR_ERROR_TYPE] = error_type
            rollout_id = current_rollout_id()
            if rollout_id is not None:
                attributes[names.ATTR_ROLLOUT_ID] = rollout_id
            set_trusted_attributes(span, attributes)
            # A websocket has no method: ``HTTP {route}``, as contrib names it.
            span.update_name(self._name(method or names.HTTP_METHOD_OTHER, route))
            if error is not None:
                record_exception(span, error)
                span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
            elif error_type is not None:
                span.set_status(Status(StatusCode.ERROR))
        if method:  # http only: contrib records no point for websockets either
            instruments = STATE.instruments
            if instruments is not None:
                point = self._metric_attributes.get(
                    method,
                    scope.get("scheme") or "http",
                    route,
                    status or None,
                    error_type,
                    scope.get("http_version") or None,
                )
                instruments.server_request_duration.record(perf_counter() - start, point)
        span.end()

    def _name(self, method: str, route: str | None) -> str:
        key = (method, route)
        found = self._names.get(key)
        if found is None:
            if len(self._names) >= _MAX_CACHED:
                self._names.clear()
            found = self._names[key] = _span_name(method, route)
        return found

    def _telemetry_failed(self) -> None:
        if not self._failed_once:
            self._failed_once = True
            _log.warning("the SERVER span failed; the request is served without it", exc_info=True)


def _websocket_send(exchange: Exchange, send: Send) -> Send:
    async def websocket_send(message: Message) -> None:
        if message["type"] == "websocket.send":
            exchange.status = 200
        await send(message)

    return websocket_send


def _shape_attributes(
    scope: Scope, raw_method: str | None, host: bytes | None, agent: bytes | None
) -> dict[str, AttributeValue]:
    """The request attributes that depend only on the request's shape (see ``ServerSpanMiddleware``)."""
    attributes: dict[str, AttributeValue] = {names.ATTR_URL_SCHEME: scope.get("scheme") or "http"}
    if raw_method is not None:
        method = _method(raw_method)
        attributes[names.ATTR_HTTP_REQUEST_METHOD] = method
        if method != raw_method:
            attributes[names.ATTR_HTTP_REQUEST_METHOD_ORIGINAL] = raw_method
    server = scope.get("server")
    if host is not None:
        address, port = _split_host(host.decode("latin-1"))
        attributes[names.ATTR_SERVER_ADDRESS] = address
        if port is None and server is not None:
            port = server[1]
        if port is not None:
            attributes[names.ATTR_SERVER_PORT] = port
    elif server is not None:
        attributes[names.ATTR_SERVER_ADDRESS] = server[0]
        if server[1] is not None:
            attributes[names.ATTR_SERVER_PORT] = server[1]
    version = scope.get("http_version")
    if version:
        attributes[names.ATTR_NETWORK_PROTOCOL_VERSION] = version
    if agent is not None:
        text = scrub_text(agent[:_MAX_RAW_USER_AGENT].decode("latin-1"))
        attributes[names.ATTR_USER_AGENT_ORIGINAL] = text[: names.MAX_USER_AGENT_CHARS]
    return attributes


def _method(raw: str) -> str:
    """``http.request.method``: the conventions' name (upper case), else ``_OTHER``."""
    if raw in names.KNOWN_HTTP_METHODS:
        return raw
    upper = raw.upper()
    return upper if upper in names.KNOWN_HTTP_METHODS else names.HTTP_METHOD_OTHER


def _span_name(method: str, route: str | None) -> str:
    if method == names.HTTP_METHOD_OTHER:
        method = _SPAN_NAME_OTHER
    return f"{method} {route}" if route else method


def _route_template(scope: Scope) -> str | None:
    """``http.route``: the template of the route that handled the request (after the app ran), else None.

    FastAPI puts the route it chose in ``scope["route"]``; for a route of an included router the full
    template (prefix included) is on FastAPI's effective route context. A mounted app's route is prefixed
    with the mount's template. A request a middleware answered before routing (a fault, an auth refusal)
    has no ``scope["route"]``: its route is looked up as contrib does for every request.
    """
    route: Any = scope.get("route")
    if route is None:
        return _matching_route(scope)
    if isinstance(route, Mount):  # the mounted app found no route of its own
        return route.path
    path: str | None = None
    fastapi_scope = scope.get("fastapi")
    if isinstance(fastapi_scope, dict):
        path = getattr(fastapi_scope.get("effective_route_context"), "path", None)
    if not isinstance(path, str):
        path = getattr(route, "path", None)
        if not isinstance(path, str):
            return None
    root_path: str = scope.get("root_path") or ""
    if root_path and root_path != (scope.get("app_root_path") or ""):
        path = _mount_template(scope) + path
    return path


def _matching_route(scope: Scope) -> str | None:
    """The template of the app's route that matches the request (a full match, else a partial one)."""
    routes: Any = getattr(scope.get("app"), "routes", None)
    if not routes:
        return None
    found: str | None = None
    contexts = iter_route_contexts(routes) if iter_route_contexts is not None else routes
    for candidate in contexts:
        match, _ = candidate.matches(scope)
        if match is Match.FULL:
            path = getattr(candidate, "path", None)
            return path if isinstance(path, str) else None
        if match is Match.PARTIAL and found is None:
            path = getattr(candidate, "path", None)
            found = path if isinstance(path, str) else None
    return found


def _mount_template(scope: Scope) -> str:
    """The template of the outermost mount the request went through (``""`` when it cannot be told)."""
    router: Any = scope.get("router")
    app_root: str = scope.get("app_root_path") or ""
    mounted: str = scope.get("root_path") or ""
    remainder = mounted[len(app_root) :] if mounted.startswith(app_root) else mounted
    for candidate in getattr(router, "routes", ()):
        if isinstance(candidate, Mount) and candidate.path_regex.match(remainder + "/"):
            return candidate.path
    return ""


def _split_host(value: str) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6]:port`` too) as the conventions' ``server.address`` and ``server.port``."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end > 0:
            address, rest = value[1:end], value[end + 1 :]
            port = rest[1:] if rest.startswith(":") else ""
            return address, int(port) if port.isdigit() else None
    address, sep, port = value.rpartition(":")
    if sep and port.isdigit() and ":" not in address:
        return address, int(port)
    return value, None
