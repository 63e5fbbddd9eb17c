"""RequestObserver: one logical request's telemetry (the CLIENT span, per-attempt metrics and events).

``request()`` builds one observer per request while telemetry is on and hands it to the attempt loop
(``_send``), which calls it per attempt; with telemetry off there is no observer at all. The observer
makes its span current when something needs it and ends it when the request ends: the OTel context is
attached and detached here, nowhere else.

Hot path: parsing a URL and redacting it happen once per URL, attribute dicts once per label combination
(``AttributeCache``), so a request allocates its span and little else.
"""

from __future__ import annotations

import time
from typing import Any, Final

import aiohttp
from multidict import CIMultiDict
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode, Tracer
from yarl import URL

from gym_obs.client._options import KNOWN_METHODS, RequestOptions
from gym_obs.client._retry import Classification, RetriesExhaustedError
from gym_obs.client.model_calls import ModelCallTarget, observe_model_call
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.metrics import AttributeCache, Instruments
from gym_obs.telemetry.propagation import ROLLOUT_ID, inject_trace_headers, should_propagate
from gym_obs.telemetry.redaction import redact_url
from gym_obs.telemetry.spans import (
    CLIENT_KIND,
    record_exception,
    set_span_error,
    set_trusted_attributes,
    start_trusted_span,
)

__all__ = ["RequestObserver"]

_perf_counter = time.perf_counter
_time_ns = time.time_ns
_MAX_CACHED: Final = 4096
_EVENT_MESSAGE_CHARS: Final = 500
_OTHER_METHOD: Final = "_OTHER"

# A duration point: method, destination, gym server name, status (an error status is also error.type) or
# the error type of a failed attempt.
_POINT_ATTRS: Final = AttributeCache(
    names.ATTR_HTTP_REQUEST_METHOD,
    names.ATTR_SERVER_ADDRESS,
    names.ATTR_SERVER_NAME,
    names.ATTR_SERVER_PORT,
    names.ATTR_HTTP_RESPONSE_STATUS_CODE,
    names.ATTR_ERROR_TYPE,
    max_entries=_MAX_CACHED,
)
# A span's attributes at start; the same plus the outcome for a span written in one go.
_SPAN_KEYS: Final = (
    names.ATTR_HTTP_REQUEST_METHOD,
    names.ATTR_SERVER_ADDRESS,
    names.ATTR_SERVER_NAME,
    names.ATTR_SERVER_PORT,
    names.ATTR_URL_FULL,
    names.ATTR_HTTP_REQUEST_METHOD_ORIGINAL,
)
_SPAN_ATTRS: Final = AttributeCache(*_SPAN_KEYS, max_entries=_MAX_CACHED)
_FINAL_ATTRS: Final = AttributeCache(
    *_SPAN_KEYS, names.ATTR_HTTP_RESPONSE_STATUS_CODE, names.ATTR_ERROR_TYPE, max_entries=_MAX_CACHED
)
_STATUS_ATTRS: Final = AttributeCache(names.ATTR_HTTP_RESPONSE_STATUS_CODE, max_entries=_MAX_CACHED)
_RETRY_ATTRS: Final = AttributeCache(names.ATTR_SERVER_NAME, names.ATTR_RETRY_REASON, max_entries=_MAX_CACHED)
_TIMEOUT_ATTRS: Final = AttributeCache(
    names.ATTR_DESTINATION, names.ATTR_SERVER_NAME, max_entries=_MAX_CACHED
)


def _origin(url: str) -> str:
    start = url.find("://")
    start = start + 3 if start >= 0 else 0
    end = len(url)
    for delimiter in "/?#":
        idx = url.find(delimiter, start)
        if 0 <= idx < end:
            end = idx
    return url[:end]


class _Destination:
    """What is known about one URL: its semconv address and port, its redacted form, and whether trace
    context may go there (it depends on host and port only; cached per value of the allow-list)."""

    __slots__ = ("address", "external_ok", "port", "targets", "url")

    def __init__(self, text: str) -> None:
        try:
            parsed = URL(_origin(text))
            self.address, self.port = parsed.raw_host or "", parsed.port
        except (ValueError, TypeError):
            self.address, self.port = "", None
        self.url = redact_url(text)
        self.targets: object = None  # the propagation_targets value external_ok was computed for
        self.external_ok = False

    def may_propagate(self, text: str) -> bool:
        """``should_propagate`` for a non-gym destination."""
        targets = STATE.propagation_targets
        if targets is not self.targets:
            self.external_ok = should_propagate(text, internal=False)
            self.targets = targets
        return self.external_ok


# URL text -> its _Destination: the same endpoints are called over and over (bounded, cleared when full).
_DESTINATIONS: dict[str, _Destination] = {}


def _destination(text: str) -> _Destination:
    found = _DESTINATIONS.get(text)
    if found is None:
        if len(_DESTINATIONS) > _MAX_CACHED:
            _DESTINATIONS.clear()
        found = _DESTINATIONS[text] = _Destination(text)
    return found


def _error_type(err: BaseException) -> str:
    return type(err).__qualname__


def _copy_headers(headers: Any) -> CIMultiDict[str]:
    """A copy of the caller's headers (never mutated), keeping repeated fields."""
    if not headers:
        return CIMultiDict()
    return CIMultiDict(headers)


class RequestObserver:
    """The telemetry of one logical request: a duration point per attempt, a span event per failed
    attempt, a retry count per re-send, and one CLIENT span around them all.

    The span is written as ``gym_obs.telemetry.spans.client_span`` would (redacted ``url.full``,
    exceptions recorded scrubbed and bounded, cancellation not an error, always ended), inline because
    this is the hottest path gym_obs has. It starts at the request's start time in every case, but is
    only *opened* (started and made current) when something needs it: a ``traceparent`` that must name it
    (before attempt 1) or a failed attempt (events, and retry logs and the transport-failure hook that
    carry its ids). A request whose first attempt succeeds without either is written in one go at the end:
    the same span, for a fraction of the cost.
    """

    __slots__ = (
        "attempts", "dest", "instruments", "internal", "label", "method", "model_call", "name",
        "rollout_id", "server", "span", "start_ns", "text", "token", "tracer",
    )

    def __init__(
        self,
        method: str,
        url: Any,
        options: RequestOptions,
        model_target: ModelCallTarget | None = None,
        payload: object = None,
    ) -> None:
        self.text = text = url if isinstance(url, str) else str(url)
        found = _DESTINATIONS.get(text)
        self.dest = found if found is not None else _destination(text)
        self.method = method  # as given
        upper = method if method in KNOWN_METHODS else method.upper()
        self.label = upper if upper in KNOWN_METHODS else _OTHER_METHOD  # canonical
        self.server = options.server_name or names.EXTERNAL_SERVER_NAME
        self.internal = options.internal
        self.instruments: Instruments | None = STATE.instruments
        self.attempts = 0  # attempts started so far (the attempt loop keeps it current)
        tracer = STATE.tracer
        # No CLIENT span when tracing is off or the http_client span group is: the metrics still flow.
        traced = tracer is not None and STATE.traces_enabled and STATE.groups.http_client
        self.tracer: Tracer | None = tracer if traced else None
        self.span: Span = INVALID_SPAN
        self.token: object = None
        self.name = ""
        self.rollout_id: str | None = None
        self.start_ns = 0
        if self.tracer is not None:
            base = self.label if self.label != _OTHER_METHOD else "HTTP"
            self.name = f"{base} {options.route}" if options.route else base
            self.rollout_id = ROLLOUT_ID.get()
            self.start_ns = _time_ns()
        # A model call (one suffix check for any other request): its span outlives request() (model_calls).
        at = self.dest
        self.model_call = observe_model_call(text, model_target, payload, at.address, at.port, self.server)

    # -- before the first attempt --------------------------------------------------------------------------

    def prepare(self, kwargs: dict[str, Any], options: RequestOptions) -> None:
        """Inject trace context where it may go (gym servers and the allow-list) and label the pool-wait
        trace with the gym server name."""
        if options.internal or self.dest.may_propagate(self.text):
            headers = _copy_headers(kwargs.get("headers"))
            # The traceparent must name this request's span (without one: the current span, if any).
            inject_trace_headers(headers, self._open() if self.tracer is not None else None)
            kwargs["headers"] = headers
        if "trace_request_ctx" not in kwargs:
            kwargs["trace_request_ctx"] = self.server

    # -- per attempt (called by the attempt loop) ----------------------------------------------------------

    def attempt_ok(self, response: aiohttp.ClientResponse, t0: float) -> None:
        inst = self.instruments
        if inst is not None:
            status = response.status
            dest = self.dest
            inst.client_request_duration.record(
                _perf_counter() - t0,
                _POINT_ATTRS.get(
                    self.label, dest.address, self.server, dest.port, status,
                    str(status) if status >= 400 else None,
                ),
            )

    def attempt_failed(
        self,
        err: BaseException,
        t0: float,
        attempt: int,
        failure: Classification | None,
        backoff_s: float,
        uploaded: bool,
    ) -> None:
        error_type = _error_type(err)
        inst = self.instruments
        if inst is not None:
            dest = self.dest
            inst.client_request_duration.record(
                _perf_counter() - t0,
                _POINT_ATTRS.get(self.label, dest.address, self.server, dest.port, None, error_type),
            )
            if isinstance(err, TimeoutError):  # aiohttp's connect/read timeouts (asyncio.TimeoutError)
                destination = names.DESTINATION_INTERNAL if self.internal else names.DESTINATION_EXTERNAL
                inst.client_timeouts.add(1, _TIMEOUT_ATTRS.get(destination, self.server))
        if self.tracer is None:
            return
        span = self.open()
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
            inst.client_retries.add(1, _RETRY_ATTRS.get(self.server, reason))

    # -- the span ------------------------------------------------------------------------------------------

    def _original_method(self) -> str | None:
        return self.method if self.method != self.label else None

    def _attributes(self) -> dict[str, Any]:
        dest = self.dest
        attributes = _SPAN_ATTRS.get(
            self.label, dest.address, self.server, dest.port, dest.url, self._original_method()
        )
        if self.rollout_id is not None:
            attributes = {**attributes, names.ATTR_ROLLOUT_ID: self.rollout_id}
        return attributes

    def open(self) -> Span:
        """Start the span (with the request's start time) and make it current; idempotent. Only called
        while tracing (``tracer`` set)."""
        if self.token is None:
            self._open()
        return self.span

    def _open(self) -> otel_context.Context:
        """Start the span and make it current; return the context it is current in. The current context is
        read once and given to the SDK (parent, sampler, the span's context), which would read it thrice."""
        assert self.tracer is not None and self.token is None
        parent = otel_context.get_current()
        span = self.span = start_trusted_span(
            self.tracer, self.name, parent, CLIENT_KIND, self._attributes(), self.start_ns
        )
        context = trace.set_span_in_context(span, parent)
        self.token = otel_context.attach(context)
        return context

    def end_ok(self, status: int) -> None:
        """The request got a reply: its status; 4xx/5xx make the span an error."""
        if self.tracer is None:
            return
        if self.token is None:
            if self.attempts <= 1:
                self._write_at_once(status)
                return
            self._open()
        span = self.span
        set_trusted_attributes(span, _STATUS_ATTRS.get(status))
        if status >= 400:
            set_span_error(span, str(status))
        self._end(span)

    def end_reply(self, response: aiohttp.ClientResponse) -> None:
        """The request got a reply: :meth:`end_ok`, except that a model call's span (a success) stays open
        for the model call to end once its reply is read or let go (``model_calls``)."""
        call = self.model_call
        status = response.status
        if call is None:
            self.end_ok(status)
            return
        if self.tracer is None:
            call.replied(response, INVALID_SPAN)
            return
        span = self.open()
        if status >= 400:
            call.replied(response, span)
            self.end_ok(status)
            return
        set_trusted_attributes(span, _STATUS_ATTRS.get(status))
        if self.attempts > 1:
            span.set_attribute(names.ATTR_HTTP_REQUEST_RESEND_COUNT, self.attempts - 1)
        otel_context.detach(self.token)  # type: ignore[arg-type]
        self.token = None
        call.replied(response, span)  # the call ends the span (at once if the body was already read)

    def end_failed(self, exc: BaseException) -> None:
        """The request raised. An exception is recorded and makes the span an error, with the last
        attempt's error type; a cancellation (the caller gave up) only ends it."""
        if self.model_call is not None:
            self.model_call.request_failed(exc, INVALID_SPAN if self.tracer is None else self.open())
        if self.tracer is None:
            return
        span = self.open()
        if isinstance(exc, Exception):
            record_exception(span, exc)
            last = exc.last_error_type if isinstance(exc, RetriesExhaustedError) else _error_type(exc)
            set_span_error(span, last)
        self._end(span)

    def _end(self, span: Span) -> None:
        if self.attempts > 1:
            span.set_attribute(names.ATTR_HTTP_REQUEST_RESEND_COUNT, self.attempts - 1)
        otel_context.detach(self.token)  # type: ignore[arg-type]
        self.token = None
        span.end()

    def _write_at_once(self, status: int) -> None:
        """Start and end the span with its final attributes (the same endpoint answering the same status
        gets the same, cached, attribute dict)."""
        assert self.tracer is not None
        error = str(status) if status >= 400 else None
        if self.rollout_id is None:
            dest = self.dest
            attributes = _FINAL_ATTRS.get(
                self.label, dest.address, self.server, dest.port, dest.url, self._original_method(),
                status, error,
            )
        else:
            attributes = {**self._attributes(), names.ATTR_HTTP_RESPONSE_STATUS_CODE: status}
            if error is not None:
                attributes[names.ATTR_ERROR_TYPE] = error
        span = start_trusted_span(self.tracer, self.name, None, CLIENT_KIND, attributes, self.start_ns)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()
