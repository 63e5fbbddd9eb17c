"""The agent's view of a model call: GenAI attributes on its CLIENT span, the GenAI client metrics, the tally.

**Which requests.** While telemetry is on, ``request()`` asks :func:`observe_model_call` about every request:
a URL whose path ends in one of the three dialect routes (``/v1/chat/completions``, ``/v1/responses``,
``/v1/messages``, whatever prefix comes before: ``/ng-rollout/<id>``, ``/ng-trace/...``, a gateway's base
path) is a model call unless the caller's :class:`ModelCallTarget` says it is not. ``ServerClient`` passes
the destination's target from the global config, by the rule the destination's own model-call layer follows
(``model_calls.enabled``, else ``server_type: responses_api_models``), so both ends of a hop agree on which
calls are model calls; it also carries the destination's provider and model allow-list. Any other request
costs this one suffix check. Telemetry off: ``request()`` never gets here.

**Lifetime.** A reply's usage is known only once the caller read it, so a model call's CLIENT span (handed
over by the request observer, no longer current) stays open after ``request()`` returns and ends exactly
once, at the first of:

- the reply read whole or streamed: :func:`~gym_obs.client.errors.get_response_json`, :func:`iter_sse_data`,
  or aiohttp's own ``read()`` / ``json()`` / ``text()``: the reply's facts go on the span, the metrics and
  the rollout's tally (a body aiohttp already read inside ``request()``, ``_read_body=True``, is read at
  once);
- the response let go: ``release()``, ``close()``, ``async with``; before the reply's last byte this is
  outcome ``cancelled``, after it ``ok`` with usage unknown (counted once as unparsable ``unread``, e.g. a
  stream iterated by hand over ``response.content``);
- the connection let go before the whole reply arrived (a read error, a response collected mid-reply):
  aiohttp's connection release callback; ``cancelled``, or ``exception`` when the reply broke;
- the response object collected with nothing said (``weakref.finalize``): as if let go then.

aiohttp has no public per-response hook for the first two: the response is watched
(``client/_reply_watch.py``), for model calls only. The span and the
duration end at the reply's last byte when it is known (aiohttp's end-of-payload release), so a caller that
reads late does not stretch them. A reply with an error status (>= 400) or a request that raised ends its
call at once. Nothing here holds the response strongly (a weak reference, a finalizer, the connection's
callback, the response's own watcher attribute), so dropping a response still frees it.

**Never in the way.** The reply's bytes are the caller's: parsing for telemetry happens after the caller's
read, on bounded input (a JSON reply over ``MAX_JSON_BYTES`` or an SSE event over the parser's line limit is
skipped and counted as ``too_large``), and a failure in here is logged once and swallowed.

**Semantic conventions** (GenAI, development status), and where gym_obs differs:

- the span is the HTTP CLIENT span (``POST /v1/responses``), not a separate ``{operation} {model}`` span:
  one span per hop, named by route like every other; the GenAI attributes are the same as the model
  server's SERVER span (``server/model_calls.py``);
- ``gen_ai.operation.name`` is the dialect (``chat`` | ``responses`` | ``messages``), as on the server;
- ``gen_ai.provider.name`` (required by the conventions) is set only where known (the destination's
  ``model_calls.provider``, or the caller's target): a guessed provider would be a wrong one;
- model names go on metrics only through the destination's allow-list (else ``other``; no label without a
  list), as one label ``gen_ai.request.model`` (request model, else response model), as the server does;
  ``gen_ai.response.model`` is on the span only (label rule);
- ``gen_ai.token.type`` adds gym's ``reasoning`` and ``cached_input`` to ``input`` | ``output``;
- metrics also carry ``gym.server.name`` and ``gym.gen_ai.outcome`` (ok | upstream_error | exception |
  cancelled), as the server's do; ``error.type`` is the status code or the exception's class name;
- ``gen_ai.client.operation.time_to_first_chunk`` counts the first chunk that carries generated content
  (the server's TTFT), not the first chunk of any kind; it is also the span event ``gym.gen_ai.first_token``.

Strings from the reply (model, id) are bounded, must be printable and are scrubbed before they reach a span.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from opentelemetry.trace import Span

from gym_obs.client._reply_watch import unwatch, watch, watcher_of
from gym_obs.config import MODEL_CALLS_CONFIG_KEY, model_calls_enabled
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.genai import (
    MAX_LINE_BYTES,
    ReplyFacts,
    SseEvents,
    clean_name,
    span_text,
    update_from_event,
)
from gym_obs.telemetry.metrics import AttributeCache, Instruments
from gym_obs.telemetry.preaggregated import bound_series
from gym_obs.telemetry.spans import record_exception, set_span_error, set_trusted_attributes
from gym_obs.telemetry.tally import RolloutTally, current_rollout
from gym_obs.telemetry.usual_reply import read_json_reply

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_SSE_EVENT_BYTES",
    "NOT_A_MODEL_CALL",
    "ModelCallTarget",
    "SseEventTooLarge",
    "iter_sse_data",
    "json_reply_read",
    "model_call_target",
    "observe_model_call",
]

#: A JSON reply larger than this is not parsed for telemetry (``too_large``); the caller still gets it all.
MAX_JSON_BYTES: Final = 8 * 1024 * 1024
#: :func:`iter_sse_data` refuses an event larger than this (the reader must stay bounded).
MAX_SSE_EVENT_BYTES: Final = 64 * 1024 * 1024

_MAX_ALLOW_LIST: Final = 256
_MAX_PROVIDER_CHARS: Final = 64
_MAX_CACHED: Final = 1024
_OK: Final = names.GEN_AI_OUTCOME_OK
_ROUTES: Final = (
    (names.GEN_AI_ROUTE_CHAT, names.GEN_AI_OPERATION_CHAT),
    (names.GEN_AI_ROUTE_RESPONSES, names.GEN_AI_OPERATION_RESPONSES),
    (names.GEN_AI_ROUTE_MESSAGES, names.GEN_AI_OPERATION_MESSAGES),
)
_SUFFIXES: Final = tuple(s for route, _ in _ROUTES for s in (route, route + "/"))

# After a stream's first content event, the events that can still change the facts (one C-level search per
# event; the rest are deltas): chat chunks with a non-null usage or finish reason, the Responses final or
# error events, Anthropic's message_delta or error.
_LATE_EVENT: Final = {
    names.GEN_AI_OPERATION_CHAT: re.compile(rb'"(?:usage|finish_reason)"\s*:\s*[^\sn]'),
    names.GEN_AI_OPERATION_RESPONSES: re.compile(rb'"(?:response\.(?:completed|incomplete|failed)|error)"'),
    names.GEN_AI_OPERATION_MESSAGES: re.compile(rb'"(?:message_delta|error)"'),
}

_log = logging.getLogger("gym_obs.client")
_failed_once = False
_perf_counter = time.perf_counter


@dataclass(frozen=True, slots=True)
class ModelCallTarget:
    """What a caller knows about a model endpoint (``request(..., _model_call=...)``).

    ``enabled=False``: requests to it are never model calls, whatever their route. ``provider`` is the
    ``gen_ai.provider.name``; ``model_allow_list`` the model names allowed as a metric label.
    """

    enabled: bool = True
    provider: str | None = None
    model_allow_list: frozenset[str] = frozenset()


NOT_A_MODEL_CALL: Final = ModelCallTarget(enabled=False)
_UNKNOWN: Final = ModelCallTarget()


def model_call_target(server_type: str, own_config: Mapping[str, Any]) -> ModelCallTarget:
    """The target a gym server's config describes: the rule its own model-call layer follows, read leniently
    (the server validates its config strictly when it starts; a caller only takes what is well formed)."""
    raw = own_config.get(MODEL_CALLS_CONFIG_KEY)
    section: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    if not model_calls_enabled(server_type, section.get("enabled")):
        return NOT_A_MODEL_CALL
    provider = section.get("provider")
    allowed = section.get("model_allow_list")
    models = (
        frozenset(m for m in allowed[:_MAX_ALLOW_LIST] if isinstance(m, str) and clean_name(m) == m)
        if isinstance(allowed, list)
        else frozenset()
    )
    known = isinstance(provider, str) and provider.isprintable() and len(provider) <= _MAX_PROVIDER_CHARS
    return ModelCallTarget(True, provider if known else None, models)


def _operation(url: str) -> str | None:
    """The dialect a URL's path ends in, else None (a suffix check: what every other request pays)."""
    if not url.endswith(_SUFFIXES):
        if "?" not in url and "#" not in url:
            return None
        url = url.partition("?")[0].partition("#")[0]
        if not url.endswith(_SUFFIXES):
            return None
    path = url.rstrip("/")
    for route, operation in _ROUTES:
        if path.endswith(route):
            return operation
    return None  # pragma: no cover - a suffix matched above


def observe_model_call(
    url: str,
    target: ModelCallTarget | None,
    payload: object,
    address: str,
    port: int | None,
    server: str,
) -> _ModelCall | None:
    """A model call starting now, or None for any other request (see the module docstring)."""
    last = url[-1:]
    if last != "s" and last != "/" and "?" not in url and "#" not in url:
        return None  # every dialect route ends in "s": what most other requests pay
    if target is not None and not target.enabled:
        return None
    operation = _operation(url)
    if operation is None:
        return None
    try:
        model = clean_name(payload.get("model")) if isinstance(payload, dict) else None
        return _ModelCall(operation, target or _UNKNOWN, model, address, port, server)
    except Exception:
        _internal_failure()
        return None


# Every label value is bounded: the operation, the configured provider, an allow-listed model or "other",
# the destination (the deployment's servers), the gym server name, the outcome, an error class or status.
_BASE_KEYS: Final = (
    names.ATTR_GEN_AI_OPERATION_NAME,
    names.ATTR_GEN_AI_PROVIDER_NAME,
    names.ATTR_GEN_AI_REQUEST_MODEL,
    names.ATTR_SERVER_ADDRESS,
    names.ATTR_SERVER_PORT,
    names.ATTR_SERVER_NAME,
)
_BASE: Final = AttributeCache(*_BASE_KEYS, max_entries=_MAX_CACHED)
_WITH_OUTCOME: Final = AttributeCache(
    *_BASE_KEYS, names.ATTR_GEN_AI_OUTCOME, names.ATTR_ERROR_TYPE, max_entries=_MAX_CACHED
)
_WITH_TOKEN: Final = AttributeCache(*_BASE_KEYS, names.ATTR_GEN_AI_TOKEN_TYPE, max_entries=_MAX_CACHED)
_WITH_REASON: Final = AttributeCache(
    *_BASE_KEYS, names.ATTR_GEN_AI_UNPARSABLE_REASON, max_entries=_MAX_CACHED
)
# A usual call's three points (its duration, its input and output token counts) as bound series, per label
# combination, with the instruments they were bound on; None where an instrument is not pre-aggregated (a
# configured view selects it, or the meter is not the SDK's): those calls take the general steps.
_USUAL_POINTS: dict[tuple[Any, ...], tuple[Instruments, tuple[Any, Any, Any] | None]] = {}


def _usual_points(instruments: Instruments, labels: tuple[Any, ...]) -> tuple[Any, Any, Any] | None:
    found = _USUAL_POINTS.get(labels)
    if found is not None and found[0] is instruments:
        return found[1]
    series = (
        bound_series(instruments.gen_ai_client_duration, _WITH_OUTCOME.get(*labels, _OK, None)),
        bound_series(instruments.gen_ai_client_tokens, _WITH_TOKEN.get(*labels, names.GEN_AI_TOKEN_INPUT)),
        bound_series(instruments.gen_ai_client_tokens, _WITH_TOKEN.get(*labels, names.GEN_AI_TOKEN_OUTPUT)),
    )
    points = series if None not in series else None
    if len(_USUAL_POINTS) >= _MAX_CACHED:
        _USUAL_POINTS.clear()
    _USUAL_POINTS[labels] = (instruments, points)
    return points


class _ModelCall:
    """One model call from request to end (see the module docstring); ends exactly once."""

    __slots__ = (
        "address", "ended", "eof_at", "eof_ns", "facts", "finalizer", "first_at", "operation", "port",
        "ref", "request_model", "server", "span", "started", "streamed", "tally", "target",
    )  # fmt: skip

    def __init__(
        self,
        operation: str,
        target: ModelCallTarget,
        request_model: str | None,
        address: str,
        port: int | None,
        server: str,
    ) -> None:
        self.operation = operation
        self.target = target
        self.request_model = request_model
        self.address = address
        self.port = port
        self.server = server
        self.started = _perf_counter()
        self.facts = ReplyFacts()
        self.span: Span | None = None
        self.ref: weakref.ref[aiohttp.ClientResponse] | None = None
        self.finalizer: weakref.finalize[Any, Any] | None = None
        self.eof_at: float | None = None
        self.eof_ns: int | None = None
        self.first_at: float | None = None
        self.streamed = False
        self.ended = False
        self.tally: RolloutTally | None = current_rollout()
        if self.tally is not None:
            self.tally.call_started()

    # -- how request() ended -------------------------------------------------------------------------------

    def request_failed(self, error: BaseException, span: Span) -> None:
        """The request raised: the observer records the exception and ends ``span`` after this."""
        cancelled = isinstance(error, asyncio.CancelledError)
        outcome = names.GEN_AI_OUTCOME_CANCELLED if cancelled else names.GEN_AI_OUTCOME_EXCEPTION
        self._end(outcome, None if cancelled else type(error).__qualname__, span, own_span=False)

    def replied(self, response: aiohttp.ClientResponse, span: Span) -> None:
        """A reply came: an error status ends the call now (the observer ends ``span``); a success keeps the
        call, and ``span``, open until the reply is read or let go."""
        status = response.status
        if status >= 400:
            self._end(names.GEN_AI_OUTCOME_UPSTREAM_ERROR, str(status), span, own_span=False)
            return
        self.span = span
        try:
            self.ref = weakref.ref(response)
            # the end of last resort: the stdlib's finalizer registry keeps it alive, cycles included
            self.finalizer = finalizer = weakref.finalize(response, self._collected)
            finalizer.atexit = False
            connection = response.connection
            if connection is None:  # the whole reply is already here (and the connection back in the pool)
                self._mark_eof()
            else:
                connection.add_callback(self._released)
            # aiohttp read the body inside request() (``_read_body=True``): read it now. aiohttp has no public
            # way to ask; its private ``_body`` is read defensively, as ``errors.read_error_body`` does.
            body = getattr(response, "_body", None)
            if isinstance(body, bytes):
                self.body_read(body, response.content_type)
                return
            watch(response, self)
        except Exception:
            _internal_failure()
            self._end(names.GEN_AI_OUTCOME_OK, None, span, own_span=True)

    # -- the reply (the helpers, or aiohttp's own read) -----------------------------------------------------

    def body_read(self, body: bytes, content_type: str) -> None:
        """The whole body was read at once (``get_response_json``, ``read()``, ``json()``, ``text()``)."""
        if self.ended:
            return
        facts = self.facts
        try:
            if len(body) > MAX_JSON_BYTES:
                facts.flag(names.GEN_AI_UNPARSABLE_TOO_LARGE)
            elif content_type == "text/event-stream":  # a stream read whole: its events, no first-token time
                self.streamed = True
                reader = SseEvents()
                for data in reader.feed(body):
                    update_from_event(self.operation, data, facts)
                self.stream_done(reader.pending or reader.dropped)
                return
            else:
                read_json_reply(self.operation, body, facts)
        except Exception:
            _internal_failure()
        self._finish(names.GEN_AI_OUTCOME_OK)

    def let_go(self) -> None:
        """The caller released or closed the response (after its connection's callback, if any, ran)."""
        if self.ended:
            return
        if self.eof_at is None:
            self._finish(names.GEN_AI_OUTCOME_CANCELLED)
        else:
            self.facts.flag(names.GEN_AI_UNPARSABLE_UNREAD)
            self._finish(names.GEN_AI_OUTCOME_OK)

    def events(self, batch: list[bytes]) -> None:
        """SSE events the caller is about to get: the first content event's time, usage and finish reasons."""
        facts = self.facts
        try:
            for data in batch:
                if len(data) > MAX_LINE_BYTES:
                    facts.flag(names.GEN_AI_UNPARSABLE_TOO_LARGE)
                elif self.first_at is None:
                    if update_from_event(self.operation, data, facts):
                        self._first_content()
                elif _LATE_EVENT[self.operation].search(data):  # after the first content, only these matter
                    update_from_event(self.operation, data, facts)
        except Exception:
            _internal_failure()

    def _first_content(self) -> None:
        now = _perf_counter()
        if self.eof_at is not None and self.eof_at < now:
            now = self.eof_at  # the whole reply was here before the caller read it: it came by then
        self.first_at = now
        self.facts.content_started = True
        span = self.span
        if span is not None and span.is_recording():
            span.add_event(
                names.SPAN_EVENT_GEN_AI_FIRST_TOKEN,
                {names.ATTR_GEN_AI_TIME_TO_FIRST_TOKEN: now - self.started},
            )

    def stream_done(self, truncated: bool) -> None:
        if self.ended:
            return
        if truncated:
            self.facts.flag(names.GEN_AI_UNPARSABLE_TRUNCATED)
        if not self.facts.has_usage:
            self.facts.flag(names.GEN_AI_UNPARSABLE_MISSING_USAGE)
        self._finish(names.GEN_AI_OUTCOME_OK)

    def read_failed(self, error: BaseException) -> None:
        """Reading the reply raised: a cancellation is ``cancelled``, anything else ``exception``."""
        if self.ended:
            return
        if isinstance(error, asyncio.CancelledError | GeneratorExit):
            self._finish(names.GEN_AI_OUTCOME_CANCELLED)
        else:
            self._finish(names.GEN_AI_OUTCOME_EXCEPTION, type(error).__qualname__, error)

    # -- aiohttp's signals ---------------------------------------------------------------------------------

    def _mark_eof(self) -> None:
        if self.eof_at is None:
            self.eof_at = _perf_counter()
            self.eof_ns = time.time_ns()

    def _released(self) -> None:
        """The connection was let go: at the reply's end (its last byte arrived), or before it."""
        try:
            response = self.ref() if self.ref is not None else None
            content = response.content if response is not None else None
            if content is not None and content.is_eof() and content.exception() is None:
                self._mark_eof()
                return
            problem = content.exception() if content is not None else None
            if problem is None or type(problem) is aiohttp.ClientConnectionError:  # the caller let go
                self._finish(names.GEN_AI_OUTCOME_CANCELLED)
            else:  # the reply broke (the server went away mid-body, a bad chunk)
                self._finish(names.GEN_AI_OUTCOME_EXCEPTION, type(problem).__qualname__)
        except Exception:
            _internal_failure()

    def _collected(self) -> None:
        """The response was collected and nothing said how its reply ended: as if let go now."""
        try:
            self.let_go()
        except Exception:  # pragma: no cover - let_go guards itself; a weakref callback must not raise
            _internal_failure()

    # -- the end -------------------------------------------------------------------------------------------

    def _finish(
        self, outcome: str, error_type: str | None = None, error: BaseException | None = None
    ) -> None:
        """End a call whose span is ours (a reply came), and let go of the response."""
        if self.ended:
            return
        if self.finalizer is not None:
            self.finalizer.detach()
        response = self.ref() if self.ref is not None else None
        if response is not None:
            unwatch(response)
        span = self.span
        if span is not None and error is not None and span.is_recording():
            record_exception(span, error)
        self._end(outcome, error_type, span, own_span=True)

    def _end(self, outcome: str, error_type: str | None, span: Span | None, *, own_span: bool) -> None:
        """Metrics, the tally and the span's attributes, once; ends ``span`` when ``own_span``."""
        if self.ended:
            return
        self.ended = True
        try:
            ended = self.eof_at if self.eof_at is not None else _perf_counter()
            ok = outcome == names.GEN_AI_OUTCOME_OK
            facts = self.facts
            tally = self.tally
            if tally is not None:
                tally.call_ended(ended)
                if ok:
                    tally.add_usage(facts.input_tokens, facts.output_tokens)
                    if self.first_at is not None:
                        tally.add_ttft(self.first_at - self.started)
            instruments = STATE.instruments
            if STATE.enabled and instruments is not None:
                self._record(instruments, outcome, error_type, ended - self.started, ok)
            if span is not None and span.is_recording():
                set_trusted_attributes(span, self._span_attributes(outcome, ok))
                if error_type is not None and own_span:
                    set_span_error(span, error_type)
        except Exception:
            _internal_failure()
        if own_span and span is not None:
            span.end(end_time=self.eof_ns if outcome == names.GEN_AI_OUTCOME_OK else None)

    def _labels(self) -> tuple[str | int | None, ...]:
        target = self.target
        model: str | None = None
        if target.model_allow_list:
            model = self.request_model or self.facts.response_model
            if model not in target.model_allow_list:
                model = names.GEN_AI_MODEL_OTHER
        return (self.operation, target.provider, model, self.address, self.port, self.server)

    def _record(
        self, instruments: Instruments, outcome: str, error_type: str | None, seconds: float, ok: bool
    ) -> None:
        labels = self._labels()
        facts = self.facts
        given, made = facts.input_tokens, facts.output_tokens
        pre = instruments.pre
        if (
            ok
            and error_type is None
            and pre is not None
            and self.first_at is None
            and facts.problem is None
            and given is not None
            and made is not None
            and facts.reasoning_tokens is None
            and facts.cached_input_tokens is None
        ):
            # the usual call (a whole reply with both counts and nothing else): what the steps below record
            # for it, in one go (one exemplar decision for its points, one lock)
            points = _usual_points(instruments, labels)
            if points is not None:
                duration, input_tokens, output_tokens = points
                exemplar = pre.exemplar()
                pre.add_all(
                    (
                        (duration, seconds, exemplar),
                        (input_tokens, given, exemplar),
                        (output_tokens, made, exemplar),
                    )
                )
                return
        instruments.gen_ai_client_duration.record(seconds, _WITH_OUTCOME.get(*labels, outcome, error_type))
        if not ok:
            return
        for token_type, count in facts.tokens():
            instruments.gen_ai_client_tokens.record(count, _WITH_TOKEN.get(*labels, token_type))
        if self.first_at is not None:
            instruments.gen_ai_client_ttfc.record(self.first_at - self.started, _BASE.get(*labels))
        if facts.problem is not None:
            instruments.gen_ai_client_unparsable.add(1, _WITH_REASON.get(*labels, facts.problem))

    def _span_attributes(self, outcome: str, ok: bool) -> dict[str, Any]:
        facts = self.facts
        attributes: dict[str, Any] = {
            names.ATTR_GEN_AI_OPERATION_NAME: self.operation,
            names.ATTR_GEN_AI_OUTCOME: outcome,
            names.ATTR_GEN_AI_STREAMED: self.streamed,
        }
        optional = (
            (names.ATTR_GEN_AI_PROVIDER_NAME, self.target.provider),
            (names.ATTR_GEN_AI_REQUEST_MODEL, span_text(self.request_model)),
            (names.ATTR_GEN_AI_RESPONSE_MODEL, span_text(facts.response_model)),
            (names.ATTR_GEN_AI_RESPONSE_ID, facts.span_response_id()),
            (names.ATTR_GEN_AI_USAGE_INPUT_TOKENS, facts.input_tokens),
            (names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS, facts.output_tokens),
            (names.ATTR_GEN_AI_USAGE_REASONING_TOKENS, facts.reasoning_tokens),
            (names.ATTR_GEN_AI_USAGE_CACHED_INPUT_TOKENS, facts.cached_input_tokens),
            (names.ATTR_GEN_AI_UNPARSABLE_REASON, facts.problem if ok else None),
        )
        for key, value in optional:
            if value is not None:
                attributes[key] = value
        if facts.finish_reasons:
            attributes[names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS] = tuple(facts.finish_reasons)
        return attributes


def _live(response: aiohttp.ClientResponse) -> _ModelCall | None:
    """The model call whose reply ``response`` is, while it is open (the response knows; no registry)."""
    call = watcher_of(response)
    if isinstance(call, _ModelCall) and not call.ended:
        return call
    return None


def json_reply_read(response: aiohttp.ClientResponse, body: bytes) -> None:
    """``get_response_json`` read ``response``'s whole body: end its model call, if it is one."""
    call = _live(response)
    if call is not None:
        call.body_read(body, response.content_type)


class SseEventTooLarge(ValueError):
    """An SSE event grew past :func:`iter_sse_data`'s ``max_event_bytes``."""


async def iter_sse_data(
    response: aiohttp.ClientResponse, *, max_event_bytes: int = MAX_SSE_EVENT_BYTES
) -> AsyncIterator[bytes]:
    """The ``data`` of each event of a ``text/event-stream`` reply, as it arrives (bytes; multi-line data
    joined with newlines, ``[DONE]`` included; ``event:``/``id:`` lines and comments are not passed on).

    For a model call, the events also give its CLIENT span, metrics and the current rollout's tally their
    first-content time, usage and finish reasons (see the module docstring). An event larger than
    ``max_event_bytes`` raises :class:`SseEventTooLarge`: the reader stays bounded. The caller owns the
    response: release it when done.
    """
    call = _live(response)
    if call is not None:
        call.streamed = True
    events = SseEvents(max_event_bytes)
    try:
        async for chunk in response.content.iter_any():
            batch = events.feed(chunk)
            if events.dropped:
                raise SseEventTooLarge(f"an SSE event is larger than {max_event_bytes} bytes")
            if batch:
                if call is not None:
                    call.events(batch)
                for data in batch:
                    yield data
    except BaseException as exc:
        if call is not None:
            call.read_failed(exc)
        raise
    if call is not None:
        call.stream_done(events.pending)


def _internal_failure() -> None:
    global _failed_once
    if not _failed_once:
        _failed_once = True
        _log.warning("model-call telemetry failed; the reply is unaffected", exc_info=True)
