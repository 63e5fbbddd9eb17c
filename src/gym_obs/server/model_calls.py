"""Model-call telemetry for model servers: GenAI metrics and span attributes read off the reply as it passes.

A pure ASGI layer, installed only on model servers (``server_type: responses_api_models`` or
``model_calls: {enabled: true}`` in the server's own config) and only when telemetry is on. It sits inside
the SERVER span (and inside the failure-reply layer, so a handler's exception is seen as one), recognises
the dialect by route and watches what the handler sends:

- a JSON reply is kept (bounded) and read once after its last byte went out;
- a streamed SSE reply is read event by event only until its first content event (time to first token),
  then only a reference to each later chunk is kept in a small ring, and the ring's last events (where
  usage and finish reasons live) are read once after the last byte went out.

No byte is held back or delayed: every message is passed on as it comes. Under gym's own SERVER span (it
ends when the app returns) the reply is read and recorded after the app returned; under a span that ends
with the last body message (contrib's), the final bytes go out, then the reply is read, then the end of the
body. The metric points of a call go in at once, to series bound once per label combination (one exemplar
decision per call, on the latency points). Nothing here raises into the reply path; a reply that cannot be
read costs its token metrics and is counted once as unparsable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Final

from opentelemetry.trace import Span
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_obs.config import MODEL_CALLS_CONFIG_KEY, ConfigError, model_calls_enabled
from gym_obs.server._model_call_points import TOKEN_SPAN_KEYS
from gym_obs.server._model_call_read import event_data, late_event
from gym_obs.server._model_call_shape import CallShapes
from gym_obs.server._model_call_span import ends_with_the_app, server_span
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.genai import (
    ROUTE_OPERATIONS,
    ReplyFacts,
    SseEvents,
    dialect_for_path,
    model_from_request_body,
    update_from_event,
)
from gym_obs.telemetry.metrics import Instruments
from gym_obs.telemetry.spans import set_trusted_attributes
from gym_obs.telemetry.usual_reply import read_json_reply

__all__ = [
    "ModelCallConfig",
    "ModelCallMiddleware",
    "install_model_calls",
    "model_call_config",
]


#: A JSON reply larger than this is not read (``too_large``); its bytes still pass untouched.
MAX_JSON_BYTES: Final = 8 * 1024 * 1024
#: Request bytes searched for the ``"model"`` field (a prompt can be large; the field is usually early).
MAX_REQUEST_SCAN_BYTES: Final = 1024 * 1024
#: Before the first content event at most this many stream bytes are read event by event.
MAX_HEAD_BYTES: Final = 4 * 1024 * 1024
#: After content started, the stream's last chunks are kept (a reference to each body, in a ring bounded by
#: count, so a chunk costs one append and no arithmetic) and the final events (usage, finish reasons) are read
#: from at most the last ``TAIL_BYTES`` of them. The ring holds only bodies already passed on; its count
#: covers final events split into small pieces. A Responses stream repeats the whole output in its final
#: ``response.completed`` event, so it reads more.
TAIL_CHUNKS: Final = 1024
TAIL_BYTES: Final = 64 * 1024
RESPONSES_TAIL_BYTES: Final = 1024 * 1024
#: Only the stream's last events are read at its end: usage and finish reasons are there.
TAIL_EVENTS: Final = 16

_START: Final = "http.response.start"
_BODY: Final = "http.response.body"
_CONTENT_TYPE: Final = b"content-type"  # 12 bytes

_WAITING, _JSON, _HEAD, _TAIL, _PASS = range(5)

_log = logging.getLogger("gym_obs.server")
_failed_once = False


class ModelCallConfig(BaseModel):
    """``model_calls`` in a server's own config: the switch, the provider and the model allow-list."""

    # protected_namespaces=(): ``model_allow_list`` is a field, not pydantic's (2.9 warns otherwise).
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    enabled: bool | None = None  # None: on for server_type responses_api_models
    provider: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_.]{0,63}$")
    model_allow_list: list[str] = Field(default_factory=list, max_length=256)


def model_call_config(
    server_type: str, own_config: Mapping[str, Any], *, where: str = "server"
) -> ModelCallConfig | None:
    """The server's model-call config when the layer applies to it, else None; bad config is a clear error."""
    raw = own_config.get(MODEL_CALLS_CONFIG_KEY)
    try:
        config = ModelCallConfig.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{where}.{MODEL_CALLS_CONFIG_KEY}: {problems}") from None
    return config if model_calls_enabled(server_type, config.enabled) else None


def install_model_calls(
    app: Any, *, server_name: str, server_type: str, own_config: Mapping[str, Any], where: str = "server"
) -> bool:
    """Add the layer to a Starlette/FastAPI ``app`` when it applies and telemetry is on; True if added."""
    config = model_call_config(server_type, own_config, where=where)
    if config is None or not STATE.enabled:
        return False
    app.add_middleware(
        ModelCallMiddleware,
        server_name=server_name,
        provider=config.provider,
        model_allow_list=config.model_allow_list,
    )
    return True


class _Call(ReplyFacts):
    """One model call: what was sent so far, and the facts read from it (a call is its reply's facts: one
    object per call, not two)."""

    __slots__ = (
        "_receive",
        "_send",
        "complete",
        "disconnected",
        "ended",
        "first_token_at",
        "head_bytes",
        "json_body",
        "json_bytes",
        "layer",
        "mode",
        "operation",
        "recorded",
        "request_model",
        "scanned",
        "span",
        "sse",
        "started",
        "status",
        "tail",
    )

    # set in _start for the reply's kind only (a call pays for its own kind); ended in _final (read only then)
    ended: float
    json_body: bytes | list[bytes] | None  # a JSON reply's body: its one part (the usual), or its parts
    json_bytes: int
    head_bytes: int
    tail: deque[bytes] | None

    def begin(
        self,
        operation: str,
        receive: Receive,
        send: Send,
        span: Span | None,
        layer: ModelCallMiddleware,
    ) -> _Call:
        """Set up a call made by ``object.__new__`` (``_Call(...)`` with an ``__init__`` costs a class call
        and a C-level frame more per request); returns it."""
        self.operation = operation
        self.layer = layer  # told when the reply is out, under a span that ends with it (see _split)
        self._receive = receive
        self._send = send
        self.span = span
        self.started = _perf_counter()  # (ended: set when the final body message is handed on)
        self.mode = _WAITING
        self.status = self.scanned = 0
        self.complete = self.disconnected = self.recorded = False
        _facts_init(self)  # (a module constant: an attribute read off a class is not specialised)
        self.first_token_at: float | None = None
        self.request_model: str | None = None
        self.sse: SseEvents | None = None  # a streamed reply's reader
        return self

    async def receive(self) -> Message:
        message = await self._receive()
        kind = message["type"]
        if kind == "http.request":
            if self.request_model is None and self.scanned < MAX_REQUEST_SCAN_BYTES:
                body = message.get("body", b"")
                self.scanned += len(body)
                self.request_model = model_from_request_body(body)
        elif kind == "http.disconnect":
            self.disconnected = True
        return message

    def send(self, message: Message) -> Awaitable[None]:
        """Look at ``message`` and pass it on untouched (the inner send's awaitable is returned as is)."""
        mode = self.mode
        if mode == _TAIL:  # the hot path of a stream: keep a reference to the body, nothing else
            if message.get("more_body", False):
                self.tail.append(message.get("body", b""))  # type: ignore[union-attr]
                return self._send(message)
            if message["type"] != _BODY:
                return self._send(message)
            self.tail.append(message.get("body", b""))  # type: ignore[union-attr]
            return self._final(message)
        if mode == _JSON:
            if message["type"] != _BODY:
                return self._send(message)
            body = message.get("body", b"")  # a JSON reply's body: kept, bounded
            if body:
                self.json_bytes += len(body)
                if self.json_bytes <= MAX_JSON_BYTES:
                    kept = self.json_body
                    if kept is None:  # the usual reply: one part, kept as it is (no list, no join)
                        self.json_body = body
                    elif isinstance(kept, list):
                        kept.append(body)
                    else:
                        self.json_body = [kept, body]
                else:
                    self._too_large()
            if message.get("more_body", False):
                return self._send(message)
            return self._final(message)
        else:
            try:
                kind = message["type"]
                if kind == _START:
                    self._start(message)
                    return self._send(message)
                if kind == _BODY and mode == _HEAD:
                    self._head(message.get("body", b""))
            except Exception:
                _internal_failure()
                self.mode = _PASS
        if message["type"] == _BODY and not message.get("more_body", False):
            return self._final(message)
        return self._send(message)

    def _final(self, message: Message) -> Awaitable[None]:
        """The final body message: the reply is complete when it goes out (the call's duration ends here).
        Under gym's SERVER span (it ends when the app returns) or none, the reply is read and recorded after
        the app returns; under another (contrib's ends with the last body message), see :meth:`_split`."""
        self.complete = True
        self.ended = _perf_counter()
        span = self.span
        if span is None or ends_with_the_app(span):
            return self._send(message)
        return self._split(message)

    async def _split(self, message: Message) -> None:
        """For a SERVER span that ends when the end of the body passes: the final bytes go out first, then
        the reply is read and the span told, then the end of the body goes out."""
        body = message.get("body", b"")
        if body:
            await self._send({"type": _BODY, "body": body, "more_body": True})
            message = {"type": _BODY, "body": b"", "more_body": False}
        try:
            self.layer._complete(self)
        except Exception:
            _internal_failure()
        self.mode = _PASS
        await self._send(message)

    def _too_large(self) -> None:
        self.flag(names.GEN_AI_UNPARSABLE_TOO_LARGE)
        self.json_body = None
        self.mode = _PASS

    def _start(self, message: Message) -> None:
        status = message.get("status", 200)
        if type(status) is not int:
            status = int(status)
        self.status = status
        if status >= 400:
            self.mode = _PASS
            return
        content_type = b""
        for key, value in message.get("headers", ()):
            # header names are lower case in ASGI; another case costs a lower() only for a name of this length
            if key == _CONTENT_TYPE or (len(key) == 12 and key.lower() == _CONTENT_TYPE):
                content_type = value
                break
        kind = _REPLY_KINDS.get(content_type)  # (an odd value misses, or fails as _reply_kind would)
        if kind is None:
            kind = _reply_kind(content_type)
        if kind == _HEAD:
            self.sse, self.head_bytes, self.tail = SseEvents(), 0, None
        elif kind == _JSON:
            self.json_body, self.json_bytes = None, 0
        else:
            self.flag(names.GEN_AI_UNPARSABLE_CONTENT_TYPE)
        self.mode = kind

    def _head(self, body: bytes) -> None:
        """Read events until the first content event; then switch to the ring of references."""
        sse = self.sse
        assert sse is not None
        self.head_bytes += len(body)
        for data in sse.feed(body):
            if update_from_event(self.operation, data, self) and self.first_token_at is None:
                self.first_token_at = now = time.perf_counter()
                self.content_started = True
                span = self.span
                if span is not None:
                    span.add_event(
                        names.SPAN_EVENT_GEN_AI_FIRST_TOKEN,
                        {names.ATTR_GEN_AI_TIME_TO_FIRST_TOKEN: now - self.started},
                    )
        if self.content_started or self.head_bytes > MAX_HEAD_BYTES:
            self.tail = deque(maxlen=TAIL_CHUNKS)
            self.mode = _TAIL

    # -- after the last byte -------------------------------------------------------------------------------

    def read_stream(self) -> None:
        """Read what was kept of a streamed reply: its last events (called once, by _record)."""
        sse = self.sse
        if sse is None:
            return
        truncated = sse.pending
        if self.tail:
            truncated = self._read_tail(sse)
        if self.complete and truncated:
            self.flag(names.GEN_AI_UNPARSABLE_TRUNCATED)
        if sse.dropped:
            self.flag(names.GEN_AI_UNPARSABLE_TOO_LARGE)
        if not self.has_usage:
            self.flag(names.GEN_AI_UNPARSABLE_MISSING_USAGE)

    def _read_tail(self, sse: SseEvents) -> bool:
        """Read the last ``TAIL_EVENTS`` events of what was kept, joining only the chunks they are in (never
        the whole stream event by event); True when the stream ended inside an event."""
        tail = self.tail
        assert tail is not None
        self.tail = None
        operation = self.operation
        chunks = list(tail)
        trimmed = len(chunks) == tail.maxlen  # older chunks may have left the ring
        first = 0
        if not trimmed and sse.pending:
            # the head's reader stopped inside an event: its chunks finish it (and any event it runs into)
            while first < len(chunks) and sse.pending:
                for event in sse.feed(chunks[first]):
                    if late_event(operation, event):
                        update_from_event(operation, event, self)
                first += 1
            if sse.pending:
                return True
        limit = RESPONSES_TAIL_BYTES if operation == names.GEN_AI_OPERATION_RESPONSES else TAIL_BYTES
        picked: list[bytes] = []
        size = events = 0
        at = len(chunks)
        while at > first:  # from the end: the chunks that hold the last events (or the byte limit)
            at -= 1
            body = chunks[at]
            picked.append(body)
            size += len(body)
            events += body.count(b"\n\n")  # CR forms and split separators only undercount: more is read
            if events > TAIL_EVENTS or size > limit:
                break
        trimmed = trimmed or at > first
        picked.reverse()
        data = b"".join(picked)
        if len(data) > limit:
            data = data[len(data) - limit :]
            trimmed = True
        if data.find(b"\r") >= 0:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        blocks = data.split(b"\n\n")  # one C call; the last piece is what follows the last event
        rest = blocks.pop()
        if trimmed and len(blocks) <= TAIL_EVENTS:
            blocks = blocks[1:]  # the first piece may start mid-event
        for block in blocks[-TAIL_EVENTS:]:
            if late_event(operation, block):  # a byte search before any per-line work
                payload = event_data(block)
                if payload is not None:
                    update_from_event(operation, payload, self)
        return bool(rest.strip())

    def outcome(self, error: BaseException | None) -> str:
        if self.complete:  # the whole reply went out: what the app did after it is not the call's outcome
            error = None
        if error is not None:
            if isinstance(error, asyncio.CancelledError) or self.disconnected or _is_disconnect(error):
                return names.GEN_AI_OUTCOME_CANCELLED
            return names.GEN_AI_OUTCOME_EXCEPTION
        if self.status == 0:
            return names.GEN_AI_OUTCOME_EXCEPTION
        if not self.complete:
            return names.GEN_AI_OUTCOME_CANCELLED
        if self.status >= 400:
            return names.GEN_AI_OUTCOME_UPSTREAM_ERROR
        return names.GEN_AI_OUTCOME_OK


_OK: Final = names.GEN_AI_OUTCOME_OK
_facts_init: Final = ReplyFacts.__init__
_new: Final = object.__new__
_perf_counter: Final = time.perf_counter

#: A reply's content type -> how it is read (_HEAD: a stream, _JSON, _PASS: not); the app's own values.
_REPLY_KINDS: dict[bytes, int] = {}


def _reply_kind(content_type: bytes) -> int:
    """How a reply of ``content_type`` is read (remembered: three bytes calls cost more than a lookup)."""
    lowered = content_type.lower()  # find, not ``in``: on bytes that first tries its operand as an int
    kind = _PASS if lowered.find(b"json") < 0 else _JSON
    if lowered.startswith(b"text/event-stream"):
        kind = _HEAD
    if type(content_type) is bytes:
        if len(_REPLY_KINDS) >= 64:
            _REPLY_KINDS.clear()
        _REPLY_KINDS[content_type] = kind
    return kind


def _is_disconnect(error: BaseException) -> bool:
    """The caller went away while the reply was being sent (uvicorn's and Starlette's ways of saying so)."""
    return isinstance(error, OSError) or type(error).__name__ in ("ClientDisconnect", "ClientDisconnected")


def _internal_failure() -> None:
    global _failed_once
    if not _failed_once:
        _failed_once = True
        _log.warning("model-call telemetry failed; the reply is unaffected", exc_info=True)


class ModelCallMiddleware:
    """The model-call layer (pure ASGI; see the module docstring), added by :func:`install_model_calls`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        server_name: str | None = None,
        provider: str | None = None,
        model_allow_list: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.server_name = server_name
        self.provider = provider
        self._shapes = CallShapes(provider, model_allow_list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = None
        if scope["type"] == "http":  # a dialect route as it is, else dialect_for_path's other forms
            path = scope["path"]
            operation = ROUTE_OPERATIONS.get(path) or dialect_for_path(path)
        instruments = STATE.instruments
        if operation is None or instruments is None or not STATE.enabled:
            await self.app(scope, receive, send)
            return
        call = _new(_Call).begin(operation, receive, send, server_span(), self)
        error: BaseException | None = None
        try:
            await self.app(scope, call.receive, call.send)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if not call.recorded:
                try:
                    self._record(call, error, instruments)
                except Exception:
                    _internal_failure()

    def _complete(self, call: _Call) -> None:
        """The reply's bytes are out, its end is not: record everything while the SERVER span is open."""
        instruments = STATE.instruments
        if instruments is not None:
            self._record(call, None, instruments)

    def _record(self, call: _Call, error: BaseException | None, instruments: Instruments) -> None:
        """Metrics and SERVER-span attributes of one call (once: after its last byte, else when it ended)."""
        call.recorded = True
        if call.complete:  # the usual call: its whole reply went out
            ended = call.ended
            outcome = _OK if 0 < call.status < 400 else call.outcome(error)
        else:
            ended = time.perf_counter()
            outcome = call.outcome(error)
        usual = None
        if call.mode == _JSON:
            usual = read_json_reply(call.operation, call.json_body, call)
        else:
            call.read_stream()
        asked, answered = call.request_model, call.response_model
        key = (self.server_name or STATE.server_name or "", call.operation, asked, answered)
        shape = self._shapes.get(key)
        if shape is None or shape.instruments is not instruments:
            shape = self._shapes.make(key, instruments)
        points = shape.points
        # an exemplar (one decision per call) on the latency points only: the span carries the counts too
        pre = instruments.pre
        span = call.span
        exemplar = pre.exemplar_for(span) if pre is not None else None
        if usual is not None and outcome == _OK:
            # the usual chat or Responses reply (read_json_reply's: both counts, one finish reason, no
            # problem): what the general steps below record for it, in one go
            given: Any = call.input_tokens  # ints here (Any: the facts' fields are typed for any reply)
            made: Any = call.output_tokens
            reply_id: Any = call.span_response_id()  # a str here (a plain word is its own scrub)
            tokens = points.tokens
            points.emit(
                [
                    (points.duration[outcome], ended - call.started, exemplar),
                    (tokens[0], given, None),
                    (tokens[1], made, None),
                    (points.finishes[usual[0]], 1, None),
                ]
            )
            if span is not None:
                set_trusted_attributes(
                    span,
                    {
                        names.ATTR_GEN_AI_OPERATION_NAME: call.operation,
                        names.ATTR_GEN_AI_OUTCOME: outcome,
                        names.ATTR_GEN_AI_STREAMED: False,
                        names.ATTR_GEN_AI_USAGE_INPUT_TOKENS: given,
                        names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS: made,
                        names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS: usual,
                        **shape.names,
                        names.ATTR_GEN_AI_RESPONSE_ID: reply_id,
                    },
                )
            return
        measurements = [(points.duration[outcome], ended - call.started, exemplar)]
        attributes: dict[str, Any] = {
            names.ATTR_GEN_AI_OPERATION_NAME: call.operation,
            names.ATTR_GEN_AI_OUTCOME: outcome,
            names.ATTR_GEN_AI_STREAMED: call.sse is not None,
        }
        ok = outcome == names.GEN_AI_OUTCOME_OK
        if ok and call.first_token_at is not None:
            measurements.append((points.ttft, call.first_token_at - call.started, exemplar))
        tokens = points.tokens
        count = call.input_tokens
        if count is not None:
            measurements.append((tokens[0], count, None))
            attributes[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] = count
        count = call.output_tokens
        if count is not None:
            measurements.append((tokens[1], count, None))
            attributes[names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS] = count
        if call.reasoning_tokens is not None or call.cached_input_tokens is not None:  # the rarer two
            counts = (call.reasoning_tokens, call.cached_input_tokens)
            for point, name, count in zip(tokens[2:], TOKEN_SPAN_KEYS[2:], counts, strict=True):
                if count is not None:
                    measurements.append((point, count, None))
                    attributes[name] = count
        reasons = call.finish_tuple()
        if reasons:  # normalised by genai: always of the fixed set
            for reason in reasons:
                measurements.append((points.finishes[reason], 1, None))
            attributes[names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS] = reasons
        problem = call.problem if ok else None
        if problem is not None:
            measurements.append((points.unparsable[problem], 1, None))
        points.emit(measurements)
        if span is not None:
            # the provider, then the names (the request's, the reply's model: scrubbed, in the shape), the id
            if problem is None:
                attributes.update(shape.names)
            else:
                if self.provider is not None:
                    attributes[names.ATTR_GEN_AI_PROVIDER_NAME] = self.provider
                attributes[names.ATTR_GEN_AI_UNPARSABLE_REASON] = problem
                attributes.update(shape.models)
            if call.response_id is not None:  # text a peer chose, unique per call: scrubbed here
                attributes[names.ATTR_GEN_AI_RESPONSE_ID] = call.span_response_id()
            set_trusted_attributes(span, attributes)
