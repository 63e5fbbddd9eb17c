"""Telemetry of ``request()``: one CLIENT span per logical request, per-attempt metrics and events.

Hot path (telemetry on): parsing a destination and building metric attribute dicts happen once per
destination and are cached, so a request allocates its span and little else. Nothing here runs while
telemetry is off: ``request()`` checks ``STATE.enabled`` once and takes the plain path.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import aiohttp
from multidict import CIMultiDict
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer
from yarl import URL

from gym_obs.client._attempts import TransportFailureHook, send_with_retries
from gym_obs.client._retry import RetriesExhaustedError, RetryArgs, _Failure
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.metrics import AttributeCache, Instruments
from gym_obs.telemetry.propagation import current_rollout_id, inject_trace_headers, should_propagate
from gym_obs.telemetry.redaction import redact_url
from gym_obs.telemetry.spans import record_exception, set_span_error

if TYPE_CHECKING:
    from gym_obs.client._sessions import _Pool

__all__ = ["Recorder", "destination", "traced_request"]

_perf_counter = time.perf_counter
_time_ns = time.time_ns
_MAX_CACHED: Final = 4096
_EVENT_MESSAGE_CHARS: Final = 500

_KNOWN_METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)


class _Destination:
    """What is known about one origin (``scheme://authority``): its semconv address and port, whether
    trace context may go there, and the attribute dicts of its spans and duration points (built once)."""

    __slots__ = ("address", "attrs", "external_ok", "port", "targets")

    def __init__(self, origin: str) -> None:
        try:
            parsed = URL(origin)
            self.address, self.port = parsed.raw_host or "", parsed.port
        except (ValueError, TypeError):
            self.address, self.port = "", None
        self.targets: object = None  # the propagation_targets value external_ok was computed for
        self.external_ok = False
        # (method, server name, status or error type, or "span") -> attributes
        self.attrs: dict[tuple[str, str, int | str], dict[str, Any]] = {}

    def propagate(self, url: str, internal: bool) -> bool:
        """``should_propagate`` for this origin (it depends on host and port only; gym servers always
        get trace context), cached per value of the allow-list."""
        if internal:
            return True
        targets = STATE.propagation_targets
        if targets is not self.targets:
            self.external_ok = should_propagate(url, internal=False)
            self.targets = targets
        return self.external_ok

    def attributes(self, method: str, server: str, outcome: int | str) -> dict[str, Any]:
        """Span base attributes (``outcome="span"``) or one duration point's attributes."""
        key = (method, server, outcome)
        attrs = self.attrs.get(key)
        if attrs is None:
            attrs = {
                names.ATTR_HTTP_REQUEST_METHOD: method,
                names.ATTR_SERVER_ADDRESS: self.address,
                names.ATTR_SERVER_NAME: server,
            }
            if self.port is not None:
                attrs[names.ATTR_SERVER_PORT] = self.port
            if isinstance(outcome, int):
                attrs[names.ATTR_HTTP_RESPONSE_STATUS_CODE] = outcome
                if outcome >= 400:
                    attrs[names.ATTR_ERROR_TYPE] = str(outcome)
            elif outcome != _SPAN:
                attrs[names.ATTR_ERROR_TYPE] = outcome
            if len(self.attrs) > _MAX_CACHED:
                self.attrs.clear()
            self.attrs[key] = attrs
        return attrs


_SPAN: Final = "span"
_DESTINATIONS: dict[str, _Destination] = {}
_URLS: dict[str, tuple[_Destination, str]] = {}
# (url, method, span name, server name, status) -> final attributes of a span written in one go
_FINAL_ATTRS: dict[tuple[Any, ...], dict[str, Any]] = {}
_RETRY_ATTRS: Final = AttributeCache(names.ATTR_SERVER_NAME, names.ATTR_RETRY_REASON, max_entries=_MAX_CACHED)


def _origin(url: str) -> str:
    start = url.find("://")
    start = start + 3 if start >= 0 else 0
    end = len(url)
    for delimiter in "/?#":
        idx = url.find(delimiter, start)
        if 0 <= idx < end:
            end = idx
    return url[:end]


def destination(url: str) -> _Destination:
    """The cached :class:`_Destination` of ``url``'s origin."""
    origin = _origin(url)
    found = _DESTINATIONS.get(origin)
    if found is None:
        if len(_DESTINATIONS) > _MAX_CACHED:
            _DESTINATIONS.clear()
        found = _DESTINATIONS[origin] = _Destination(origin)
    return found


def _url_info(url: str) -> tuple[_Destination, str]:
    """(destination, redacted url) of ``url``, computed and cached (the same endpoints are called over and
    over; the cache is bounded and cleared when full)."""
    if len(_URLS) > _MAX_CACHED:
        _URLS.clear()
    found = _URLS[url] = (destination(url), redact_url(url))
    return found


def _method_label(method: str) -> str:
    upper = method.upper()
    return upper if upper in _KNOWN_METHODS else "_OTHER"


def _error_type(err: BaseException) -> str:
    return type(err).__qualname__


def _set_status(span: Span, status: int) -> None:
    span.set_attribute(names.ATTR_HTTP_RESPONSE_STATUS_CODE, status)
    if status >= 400:
        set_span_error(span, str(status))


class Recorder:
    """Turns attempts into telemetry: a duration point each, a span event per failure, a retry count.

    A failure opens the request's span (if it is not open yet) and makes it current, so that the retry
    log lines and the transport-failure hook that follow carry its ids.
    """

    __slots__ = ("attempts", "dest", "instruments", "method", "server_name", "span")

    def __init__(
        self,
        span: _RequestSpan | None,
        instruments: Instruments | None,
        method: str,
        dest: _Destination,
        server_name: str,
    ) -> None:
        self.span = span
        self.instruments = instruments
        self.method = method
        self.dest = dest
        self.server_name = server_name
        self.attempts = 0  # attempts started so far (the send loop keeps it current)

    def attempt_ok(self, response: aiohttp.ClientResponse, t0: float) -> None:
        inst = self.instruments
        if inst is not None:
            inst.client_request_duration.record(
                _perf_counter() - t0, self.dest.attributes(self.method, self.server_name, response.status)
            )

    def attempt_failed(
        self,
        err: BaseException,
        t0: float,
        attempt: int,
        failure: _Failure | None,
        backoff_s: float,
        uploaded: bool,
    ) -> None:
        error_type = _error_type(err)
        inst = self.instruments
        if inst is not None:
            inst.client_request_duration.record(
                _perf_counter() - t0, self.dest.attributes(self.method, self.server_name, error_type)
            )
        if self.span is None:
            return
        span = self.span.open()
        if span.is_recording():
            event: dict[str, Any] = {
                names.ATTR_ATTEMPT: attempt,
                names.ATTR_ERROR_TYPE: error_type,
                names.ATTR_BACKOFF_SECONDS: round(backoff_s, 6),
                names.ATTR_BODY_UPLOADED: uploaded,
                names.ATTR_EXCEPTION_MESSAGE: bounded_excerpt(str(err), _EVENT_MESSAGE_CHARS),
            }
            if failure is not None:
                event[names.ATTR_RETRY_REASON] = failure.reason
            span.add_event(names.SPAN_EVENT_ATTEMPT_FAILED, event)

    def retried(self, reason: str) -> None:
        inst = self.instruments
        if inst is not None:
            inst.client_retries.add(1, _RETRY_ATTRS.get(self.server_name, reason))


def _copy_headers(headers: Any) -> CIMultiDict[str]:
    """A copy of the caller's headers (never mutated), keeping repeated fields."""
    if not headers:
        return CIMultiDict()
    return CIMultiDict(headers)


class _RequestSpan:
    """The CLIENT span of one logical request, as ``gym_obs.telemetry.spans.client_span`` would write it
    (redacted ``url.full``, exceptions recorded scrubbed and bounded, cancellation not an error, always
    ended), inline because this is the hottest path gym_obs has.

    It starts at the request's start time in every case, but is only *opened* (started and made current)
    when something needs it: a ``traceparent`` that must name it (opened before attempt 1) or a failed
    attempt (events, correlated retry logs). A request whose first attempt succeeds without either is
    written in one go at the end (:meth:`end_ok`): the same span, for a fraction of the cost.
    """

    __slots__ = ("dest", "label", "method", "name", "rollout_id", "server", "span", "start_ns", "text",
                 "token", "tracer", "url")

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        dest: _Destination,
        method: str,
        label: str,
        server: str,
        text: str,
        url: str,
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.dest = dest
        self.method = method  # as given
        self.label = label  # canonical (or _OTHER)
        self.server = server
        self.text = text  # as given (a cache key only)
        self.url = url  # redacted
        self.rollout_id = current_rollout_id()
        self.span: Span = INVALID_SPAN
        self.token: object = None
        self.start_ns = _time_ns()

    def _attributes(self) -> dict[str, Any]:
        base = self.dest.attributes(self.label, self.server, _SPAN)  # cached, never mutated
        attributes = {**base, names.ATTR_URL_FULL: self.url}
        if self.method != self.label:
            attributes[names.ATTR_HTTP_REQUEST_METHOD_ORIGINAL] = self.method
        if self.rollout_id is not None:
            attributes[names.ATTR_ROLLOUT_ID] = self.rollout_id
        return attributes

    def open(self) -> Span:
        """Start the span (with the request's start time) and make it current; idempotent."""
        if self.token is None:
            self.span = self.tracer.start_span(
                self.name, kind=SpanKind.CLIENT, attributes=self._attributes(), start_time=self.start_ns
            )
            self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def end_ok(self, status: int, attempts: int) -> None:
        """The request got a reply: its status; 4xx/5xx make the span an error."""
        if self.token is None and attempts <= 1:
            self._write_at_once(status)
            return
        span = self.open()
        _set_status(span, status)
        self._end(span, attempts)

    def end_failed(self, exc: BaseException, attempts: int) -> None:
        """The request raised. An exception is recorded and makes the span an error, with the last
        attempt's error type; a cancellation (the caller gave up) only ends it."""
        span = self.open()
        if isinstance(exc, Exception):
            record_exception(span, exc)
            last = exc.last_error_type if isinstance(exc, RetriesExhaustedError) else _error_type(exc)
            set_span_error(span, last)
        self._end(span, attempts)

    def _end(self, span: Span, attempts: int) -> None:
        if attempts > 1:
            span.set_attribute(names.ATTR_HTTP_REQUEST_RESEND_COUNT, attempts - 1)
        otel_context.detach(self.token)  # type: ignore[arg-type]
        self.token = None
        span.end()

    def _write_at_once(self, status: int) -> None:
        """Start and end the span with its final attributes (the same endpoint answering the same status
        gets the same, cached, attribute dict)."""
        key = (self.text, self.method, self.name, self.server, status) if self.rollout_id is None else None
        attributes = _FINAL_ATTRS.get(key) if key is not None else None
        if attributes is None:
            attributes = self._attributes()
            attributes[names.ATTR_HTTP_RESPONSE_STATUS_CODE] = status
            if status >= 400:
                attributes[names.ATTR_ERROR_TYPE] = str(status)
            if key is not None:
                if len(_FINAL_ATTRS) > _MAX_CACHED:
                    _FINAL_ATTRS.clear()
                _FINAL_ATTRS[key] = attributes
        span = self.tracer.start_span(
            self.name, kind=SpanKind.CLIENT, attributes=attributes, start_time=self.start_ns
        )
        if status >= 400:
            span.set_status(Status(StatusCode.ERROR, str(status)))
        span.end()


async def traced_request(
    pool: _Pool,
    method: str,
    url: Any,
    kwargs: dict[str, Any],
    retry_args: RetryArgs,
    read_body: bool,
    hook: TransportFailureHook | None,
    server_name: str | None,
    route: str | None,
) -> aiohttp.ClientResponse:
    """The request as one CLIENT span, retries included, ``traceparent`` injected when allowed.

    The attempts run in the same loop as with telemetry off (``send_with_retries``); this adds the span
    around them, the propagation headers and a recorder for per-attempt metrics and events.
    """
    text = url if isinstance(url, str) else str(url)
    cached = _URLS.get(text)
    if cached is None:
        cached = _url_info(text)
    dest, redacted = cached
    label = method if method in _KNOWN_METHODS else _method_label(method)
    server = server_name or names.EXTERNAL_SERVER_NAME
    tracer = STATE.tracer
    span: _RequestSpan | None = None
    if tracer is not None and STATE.traces_enabled:
        base = label if label != "_OTHER" else "HTTP"
        span = _RequestSpan(
            tracer, f"{base} {route}" if route else base, dest, method, label, server, text, redacted
        )
    recorder = Recorder(span, STATE.instruments, label, dest, server)
    try:
        if retry_args[0] or dest.propagate(text, False):
            if span is not None:
                span.open()  # the traceparent must name this request's span
            headers = _copy_headers(kwargs.get("headers"))
            inject_trace_headers(headers)
            kwargs["headers"] = headers
        if "trace_request_ctx" not in kwargs:
            kwargs["trace_request_ctx"] = server
        response = await send_with_retries(pool, method, url, kwargs, retry_args, read_body, hook, recorder)
    except BaseException as exc:
        if span is not None:
            span.end_failed(exc, recorder.attempts)
        raise
    if span is not None:
        span.end_ok(response.status, recorder.attempts)
    return response
