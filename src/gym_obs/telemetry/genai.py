"""The model-call vocabulary: which dialect a route speaks, and what a reply says about tokens and finishing.

Three dialects are recognised by route (``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``, with
or without the ``/ng-rollout/<id>`` prefix). A reply -- one JSON document, or the events of a streamed SSE
reply -- is reduced to :class:`ReplyFacts`: token counts by type, normalised finish reasons (a bounded set),
the response model and id, whether content has started, and at most one ``problem`` (why the reply could not
be read). Everything here is pure and never raises: remote replies are hostile input, and a reply that
cannot be read costs its metric, never the reply.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

import orjson

from gym_obs.telemetry import names
from gym_obs.telemetry.redaction import is_plain_word, scrub_text, scrub_word

__all__ = [
    "CHAT_FINISH",
    "MAX_NAME_CHARS",
    "MAX_TOKENS",
    "ONE_FINISH",
    "ROUTE_OPERATIONS",
    "TOOL_ITEMS",
    "ReplyFacts",
    "SseEvents",
    "dialect_for_path",
    "facts_from_data",
    "facts_from_json",
    "model_from_request_body",
    "update_from_event",
]

#: More tokens than this in one call is not a real count (a bug or hostile input): the value is dropped.
MAX_TOKENS: Final = 100_000_000
_MAX_FINISH_REASONS: Final = 64
#: A model name or reply id longer than this is not put on a span.
MAX_NAME_CHARS: Final = 256
#: A line longer than this (one SSE ``data:`` line) is not parsed: its event is skipped as too large.
MAX_LINE_BYTES: Final = 4 * 1024 * 1024

#: The three dialect routes -> their operation (what :func:`dialect_for_path` finds first).
ROUTE_OPERATIONS: Final = {
    names.GEN_AI_ROUTE_CHAT: names.GEN_AI_OPERATION_CHAT,
    names.GEN_AI_ROUTE_RESPONSES: names.GEN_AI_OPERATION_RESPONSES,
    names.GEN_AI_ROUTE_MESSAGES: names.GEN_AI_OPERATION_MESSAGES,
}
_ROLLOUT_PREFIX: Final = re.compile(r"^/" + names.ROLLOUT_PATH_SEGMENT + r"/[^/]+(?=/)")

#: A chat choice's ``finish_reason`` -> its normalised reason (any other value: ``other``).
CHAT_FINISH: Final = {
    "stop": names.GEN_AI_FINISH_STOP,
    "length": names.GEN_AI_FINISH_LENGTH,
    "tool_calls": names.GEN_AI_FINISH_TOOL_CALL,
    "function_call": names.GEN_AI_FINISH_TOOL_CALL,
    "content_filter": names.GEN_AI_FINISH_CONTENT_FILTER,
    "error": names.GEN_AI_FINISH_ERROR,
}
_MESSAGES_FINISH: Final = {
    "end_turn": names.GEN_AI_FINISH_STOP,
    "stop_sequence": names.GEN_AI_FINISH_STOP,
    "max_tokens": names.GEN_AI_FINISH_LENGTH,
    "model_context_window_exceeded": names.GEN_AI_FINISH_LENGTH,
    "tool_use": names.GEN_AI_FINISH_TOOL_CALL,
    "refusal": names.GEN_AI_FINISH_CONTENT_FILTER,
}
_RESPONSES_INCOMPLETE: Final = {
    "max_output_tokens": names.GEN_AI_FINISH_LENGTH,
    "content_filter": names.GEN_AI_FINISH_CONTENT_FILTER,
}
#: The Responses output item types that are tool calls (a completed reply with one finished to call it).
TOOL_ITEMS: Final = frozenset(
    {"function_call", "custom_tool_call", "mcp_call", "computer_call", "local_shell_call", "shell_call"}
)
_RESPONSES_FINAL_EVENTS: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
_RESPONSES_START_EVENTS: Final = frozenset({"response.created", "response.in_progress"})

#: The finish reasons of a single choice, one shared tuple per normalised reason.
ONE_FINISH: Final = {reason: (reason,) for reason in names.GEN_AI_FINISH_REASONS}

#: The first ``"model"`` key of a request, and its value when that is a plain string (else group 1 is None).
_MODEL_VALUE: Final = re.compile(rb'"model"(?:\s*:\s*"([^"\\\x00-\x1f]{1,256})")?')


def dialect_for_path(path: str) -> str | None:
    """The operation (``chat`` | ``responses`` | ``messages``) a request path speaks, else None."""
    operation = ROUTE_OPERATIONS.get(path)
    if operation is not None:
        return operation
    if path.endswith("/") and len(path) > 1:
        return dialect_for_path(path.rstrip("/"))
    if path.startswith("/" + names.ROLLOUT_PATH_SEGMENT + "/"):
        return ROUTE_OPERATIONS.get(_ROLLOUT_PREFIX.sub("", path, count=1).rstrip("/") or "/")
    return None


def clean_name(value: object) -> str | None:
    """A model name or id fit for a span: a printable string of bounded length, else None."""
    if type(value) is str and 0 < len(value) <= MAX_NAME_CHARS:  # the usual case, in fewer steps
        return value if value.isprintable() else None
    if not isinstance(value, str) or not value:
        return None
    if len(value) > MAX_NAME_CHARS:
        value = value[:MAX_NAME_CHARS]
    return value if value.isprintable() else None


# Scrubbed names and ids for spans (model names repeat; a scrub costs microseconds); cleared when full.
_SCRUBBED: dict[str, str] = {}
_MAX_SCRUBBED: Final = 1024
# A request's raw model value -> its clean name ("" for none); bounded like _SCRUBBED.
_REQUEST_MODELS: dict[bytes, str] = {}


def span_text(value: str | None) -> str | None:
    """A model name from a request or reply (already :func:`clean_name`-ed), scrubbed for a span: it is text
    a peer chose, so it may carry a secret like any other (cached: names repeat)."""
    if value is None:
        return None
    found = _SCRUBBED.get(value)
    if found is None:
        if len(_SCRUBBED) >= _MAX_SCRUBBED:
            _SCRUBBED.clear()
        found = _SCRUBBED[value] = scrub_text(value)
    return found


def span_id(value: str | None) -> str | None:
    """A reply's id for a span, scrubbed like :func:`span_text` but never cached (ids are unique per call:
    a cache would only churn), through the word-sized scrubber ids fit."""
    return None if value is None else scrub_word(value)


def model_from_request_body(body: bytes) -> str | None:
    """The request's ``"model": "..."`` (at the first ``"model"`` in ``body``), without parsing the JSON."""
    try:
        match = _MODEL_VALUE.search(body)  # one C call: the first "model", with its value when it has one
        if match is None:
            return None
        raw = match.group(1)
        if raw is None:
            return None
        name = _REQUEST_MODELS.get(raw)
        if name is None:  # model names repeat: decoded and checked once
            if len(_REQUEST_MODELS) >= _MAX_SCRUBBED:
                _REQUEST_MODELS.clear()
            name = _REQUEST_MODELS[raw] = clean_name(raw.decode("utf-8", "replace")) or ""
        return name or None
    except Exception:  # pragma: no cover - a regex on bytes does not fail; defensive
        return None


class ReplyFacts:
    """What one reply said. Counts are validated ints or None; ``problem`` is the first reason it failed."""

    __slots__ = (
        "_finish_by_index",
        "_finish_index",
        "_finish_reason",
        "_plain_id",
        "cached_input_tokens",
        "content_started",
        "input_tokens",
        "output_tokens",
        "problem",
        "reasoning_tokens",
        "response_id",
        "response_model",
    )

    def __init__(self) -> None:
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.reasoning_tokens: int | None = None
        self.cached_input_tokens: int | None = None
        # One choice's finish reason (the usual case) is kept in two fields; a second choice's makes the dict.
        self._finish_index = 0
        self._finish_reason: str | None = None
        self._finish_by_index: dict[int, str] | None = None
        self.response_model: str | None = None
        self.response_id: str | None = None
        self._plain_id: str | None = None  # response_id when it is a plain word (its own scrub)
        self.content_started = False
        self.problem: str | None = None

    def flag(self, problem: str) -> None:
        """Remember why the reply could not be read fully (the first reason wins)."""
        if self.problem is None:
            self.problem = problem

    def tokens(self) -> Iterator[tuple[str, int]]:
        """(token type, count) for every count the reply reported."""
        for token_type, value in (
            (names.GEN_AI_TOKEN_INPUT, self.input_tokens),
            (names.GEN_AI_TOKEN_OUTPUT, self.output_tokens),
            (names.GEN_AI_TOKEN_REASONING, self.reasoning_tokens),
            (names.GEN_AI_TOKEN_CACHED_INPUT, self.cached_input_tokens),
        ):
            if value is not None:
                yield token_type, value

    @property
    def has_usage(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None

    @property
    def finish_reasons(self) -> list[str]:
        """The normalised finish reason of each choice, in the order the choices first reported one."""
        return list(self.finish_tuple())

    def finish_tuple(self) -> tuple[str, ...]:
        """:attr:`finish_reasons` as a tuple; a single reason's is one shared tuple per reason (what a span
        attribute holds: no new object per reply)."""
        by_index = self._finish_by_index
        if by_index is not None:
            return tuple(by_index.values())
        reason = self._finish_reason
        if reason is None:
            return ()
        return ONE_FINISH.get(reason) or (reason,)

    def add_finish(self, reason: str, index: int = 0) -> None:
        """Record choice ``index``'s finish reason (bounded; the last report for an index wins)."""
        by_index = self._finish_by_index
        if by_index is None:
            if self._finish_reason is None or self._finish_index == index:
                self._finish_index, self._finish_reason = index, reason
                return
            by_index = self._finish_by_index = {self._finish_index: self._finish_reason}
        if index in by_index or len(by_index) < _MAX_FINISH_REASONS:
            by_index[index] = reason

    def note_model(self, value: object) -> None:
        if self.response_model is None:
            self.response_model = clean_name(value)

    def note_id(self, value: object) -> None:
        """The reply's id, when none was seen yet: cleaned (a plain word, the usual id, is known clean and
        scrubbed in one test: :func:`~gym_obs.telemetry.redaction.is_plain_word`)."""
        if self.response_id is None:
            if type(value) is str and 0 < len(value) <= MAX_NAME_CHARS and is_plain_word(value):
                self.response_id = self._plain_id = value
            else:
                self.response_id = clean_name(value)

    def span_response_id(self) -> str | None:
        """:attr:`response_id` for a span: :func:`span_id` of it (a plain word is its own)."""
        value = self.response_id
        return value if value is self._plain_id else span_id(value)


# --- token counts ------------------------------------------------------------------------------------------


def _count(facts: ReplyFacts, container: object, key: str) -> int | None:
    """``container[key]`` as a valid token count; a present but invalid value flags ``invalid_usage``."""
    if type(container) is not dict:
        return None
    value = container.get(key)
    if value is None:
        return None
    if type(value) is int and 0 <= value <= MAX_TOKENS:
        return value
    facts.flag(names.GEN_AI_UNPARSABLE_INVALID_USAGE)
    return None


#: The OpenAI usage keys: (input, output, input details, output details), per dialect.
_CHAT_USAGE: Final = (
    "prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details",
)
_RESPONSES_USAGE: Final = ("input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details")


def _openai_usage(facts: ReplyFacts, usage: object, keys: tuple[str, str, str, str]) -> None:
    if usage is None:
        return
    if type(usage) is not dict:
        facts.flag(names.GEN_AI_UNPARSABLE_INVALID_USAGE)
        return
    input_key, output_key, input_details, output_details = keys
    # the two counts every reply has, checked in place (what _count does, without its call)
    value = usage.get(input_key)
    if value is not None:
        if type(value) is int and 0 <= value <= MAX_TOKENS:
            facts.input_tokens = value
        else:
            facts.flag(names.GEN_AI_UNPARSABLE_INVALID_USAGE)
    value = usage.get(output_key)
    if value is not None:
        if type(value) is int and 0 <= value <= MAX_TOKENS:
            facts.output_tokens = value
        else:
            facts.flag(names.GEN_AI_UNPARSABLE_INVALID_USAGE)
    details = usage.get(input_details)
    if details is not None:
        value = _count(facts, details, "cached_tokens")
        if value is not None:
            facts.cached_input_tokens = value
    details = usage.get(output_details)
    if details is not None:
        value = _count(facts, details, "reasoning_tokens")
        if value is not None:
            facts.reasoning_tokens = value


def _messages_usage(facts: ReplyFacts, usage: object) -> None:
    """Anthropic counts cached input apart from ``input_tokens``; the semconv input count includes it."""
    if usage is None:
        return
    if not isinstance(usage, dict):
        facts.flag(names.GEN_AI_UNPARSABLE_INVALID_USAGE)
        return
    fresh = _count(facts, usage, "input_tokens")
    read = _count(facts, usage, "cache_read_input_tokens")
    written = _count(facts, usage, "cache_creation_input_tokens")
    if fresh is not None:
        facts.input_tokens = min(fresh + (read or 0) + (written or 0), MAX_TOKENS)
    if read is not None:
        facts.cached_input_tokens = read
    output = _count(facts, usage, "output_tokens")
    if output is not None:
        facts.output_tokens = output


# --- whole replies -----------------------------------------------------------------------------------------


def _chat_choices(facts: ReplyFacts, choices: object) -> None:
    if type(choices) is not list:
        return
    for position, choice in enumerate(
        choices if len(choices) <= _MAX_FINISH_REASONS else choices[:_MAX_FINISH_REASONS]
    ):
        if type(choice) is dict:
            reason = choice.get("finish_reason")
            if reason is not None:
                index = choice.get("index")
                facts.add_finish(
                    CHAT_FINISH.get(reason, names.GEN_AI_FINISH_OTHER)
                    if type(reason) is str
                    else names.GEN_AI_FINISH_OTHER,
                    index if type(index) is int else position,
                )


def _responses_object(facts: ReplyFacts, response: object) -> None:
    if not isinstance(response, dict):
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        return
    facts.note_model(response.get("model"))
    facts.note_id(response.get("id"))
    _openai_usage(facts, response.get("usage"), _RESPONSES_USAGE)
    status = response.get("status")
    if status == "completed":
        output = response.get("output")
        calls = isinstance(output, list) and any(
            isinstance(item, dict) and item.get("type") in TOOL_ITEMS for item in output
        )
        facts.add_finish(names.GEN_AI_FINISH_TOOL_CALL if calls else names.GEN_AI_FINISH_STOP)
    elif status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        facts.add_finish(
            _RESPONSES_INCOMPLETE.get(reason, names.GEN_AI_FINISH_OTHER)
            if isinstance(reason, str)
            else names.GEN_AI_FINISH_OTHER
        )
    elif status == "failed":
        facts.add_finish(names.GEN_AI_FINISH_ERROR)
    elif status is not None:
        facts.add_finish(names.GEN_AI_FINISH_OTHER)


def _messages_stop(facts: ReplyFacts, reason: object) -> None:
    if reason is not None:
        facts.add_finish(
            _MESSAGES_FINISH.get(reason, names.GEN_AI_FINISH_OTHER)
            if isinstance(reason, str)
            else names.GEN_AI_FINISH_OTHER
        )


def facts_from_json(operation: str, body: bytes, facts: ReplyFacts | None = None) -> ReplyFacts:
    """Read one JSON reply of ``operation``'s dialect. Never raises; problems are flagged on the facts."""
    facts = facts if facts is not None else ReplyFacts()
    try:
        data = orjson.loads(body)
    except Exception:
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        return facts
    return facts_from_data(operation, data, facts)


def facts_from_data(operation: str, data: object, facts: ReplyFacts) -> ReplyFacts:
    """:func:`facts_from_json` for a reply already parsed (``orjson.loads`` of its body)."""
    try:
        if type(data) is not dict:  # what orjson makes of a JSON object
            facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        elif operation == names.GEN_AI_OPERATION_CHAT:
            _identify(facts, data)
            _chat_choices(facts, data.get("choices"))
            _openai_usage(facts, data.get("usage"), _CHAT_USAGE)
        elif operation == names.GEN_AI_OPERATION_RESPONSES:
            _responses_object(facts, data)
        else:
            _identify(facts, data)
            _messages_stop(facts, data.get("stop_reason"))
            _messages_usage(facts, data.get("usage"))
    except Exception:  # pragma: no cover - every access above is type-checked; defensive
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
    if facts.problem is None and facts.input_tokens is None and facts.output_tokens is None:
        facts.flag(names.GEN_AI_UNPARSABLE_MISSING_USAGE)
    return facts


def _identify(facts: ReplyFacts, reply: dict[str, Any]) -> None:
    """The reply's model and id (the first ones seen win)."""
    if facts.response_model is None:
        facts.response_model = clean_name(reply.get("model"))
    if facts.response_id is None:
        facts.note_id(reply.get("id"))


# --- streamed replies --------------------------------------------------------------------------------------


class SseEvents:
    """An incremental, bounded SSE reader: feed body chunks, get each complete event's ``data`` bytes.

    Holds at most one unfinished line (plus the current event's data lines); a line longer than
    ``max_line_bytes`` is dropped (its event flagged ``too_large``) instead of growing the buffer.
    """

    __slots__ = (
        "_after_cr",
        "_data",
        "_data_bytes",
        "_max",
        "_partial",
        "_partial_bytes",
        "_skipping",
        "dropped",
        "events_seen",
    )

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._partial: list[bytes] = []
        self._partial_bytes = 0
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._max = max_line_bytes
        self._skipping = False
        self._after_cr = False
        self.dropped = False  # some event was too large to read
        self.events_seen = 0

    @property
    def pending(self) -> bool:
        """Whether an event was started but not finished (the stream would be truncated if it ended now)."""
        return bool(self._partial) or bool(self._data) or self._skipping

    def feed(self, chunk: bytes) -> list[bytes]:
        """The ``data`` of every event completed by ``chunk`` (multi-line data joined with newlines)."""
        done: list[bytes] = []
        if not chunk:
            return done
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across chunks: its line already ended
        # find, not ``in``: on bytes ``in`` first tries its operand as an int (an exception each time)
        if chunk.find(b"\n") < 0 and chunk.find(b"\r") < 0:
            # still inside one line: keep the piece (no copy) unless the line grew too long
            if not self._skipping:
                self._partial.append(chunk)
                self._partial_bytes += len(chunk)
                if self._partial_bytes > self._max:
                    self._drop_line()
            return done
        self._after_cr = chunk.endswith(b"\r")
        partial = self._partial
        buffer = b"".join((*partial, chunk)) if partial else chunk
        if buffer.find(b"\r") >= 0:
            # CRLF and a lone CR end lines too
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        last = lines.pop()
        for line in lines:
            self._line(line, done)
        self._partial = [last] if last else []
        self._partial_bytes = len(last)
        if len(last) > self._max:
            self._drop_line()
        return done

    def _drop_line(self) -> None:
        self._skipping = True
        self.dropped = True
        self._partial = []
        self._partial_bytes = 0

    def _line(self, line: bytes, done: list[bytes]) -> None:
        if not line:
            if self._skipping:
                self._skipping = False
                self._data.clear()
                self._data_bytes = 0
            elif self._data:
                done.append(b"\n".join(self._data) if len(self._data) > 1 else self._data[0])
                self._data = []
                self._data_bytes = 0
            self.events_seen += 1
            return
        if self._skipping:
            return
        if line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            self._data_bytes += len(value)
            if self._data_bytes > self._max:
                self._skipping = True
                self.dropped = True
                self._data.clear()
                return
            self._data.append(value)
        # event:, id:, retry: and comments carry nothing the facts need (the JSON data names its type)


def update_from_event(operation: str, data: bytes, facts: ReplyFacts) -> bool:
    """Fold one SSE event's data into ``facts``; True when it carried generated content (first-token time).

    Never raises: a malformed event flags ``malformed`` and is skipped.
    """
    if data == b"[DONE]":
        return False
    try:
        event = orjson.loads(data)
    except Exception:
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        return False
    if not isinstance(event, dict):
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        return False
    try:
        if operation == names.GEN_AI_OPERATION_CHAT:
            return _chat_event(event, facts)
        if operation == names.GEN_AI_OPERATION_RESPONSES:
            return _responses_event(event, facts)
        return _messages_event(event, facts)
    except Exception:  # pragma: no cover - every access is type-checked; defensive
        facts.flag(names.GEN_AI_UNPARSABLE_MALFORMED)
        return False


def _chat_event(event: dict[str, Any], facts: ReplyFacts) -> bool:
    facts.note_model(event.get("model"))
    facts.note_id(event.get("id"))
    content = False
    choices = event.get("choices")
    if isinstance(choices, list):
        for choice in choices[:_MAX_FINISH_REASONS]:
            if isinstance(choice, dict):
                delta = choice.get("delta")
                if isinstance(delta, dict) and (
                    delta.get("content")
                    or delta.get("tool_calls")
                    or delta.get("reasoning_content")
                    or delta.get("reasoning")
                    or delta.get("refusal")
                ):
                    content = True
        _chat_choices(facts, choices)
    usage = event.get("usage")
    if usage is not None:
        _openai_usage(facts, usage, _CHAT_USAGE)
    return content


def _responses_event(event: dict[str, Any], facts: ReplyFacts) -> bool:
    kind = event.get("type")
    if not isinstance(kind, str):
        return False
    if kind.endswith(".delta"):
        return True
    if kind in _RESPONSES_FINAL_EVENTS:
        _responses_object(facts, event.get("response"))
    elif kind in _RESPONSES_START_EVENTS:
        response = event.get("response")
        if isinstance(response, dict):
            facts.note_model(response.get("model"))
            facts.note_id(response.get("id"))
    elif kind == "error":
        facts.add_finish(names.GEN_AI_FINISH_ERROR)
    return False


def _messages_event(event: dict[str, Any], facts: ReplyFacts) -> bool:
    kind = event.get("type")
    if kind == "content_block_delta":
        return True
    if kind == "message_start":
        message = event.get("message")
        if isinstance(message, dict):
            facts.note_model(message.get("model"))
            facts.note_id(message.get("id"))
            _messages_usage(facts, message.get("usage"))
    elif kind == "message_delta":
        delta = event.get("delta")
        if isinstance(delta, dict):
            _messages_stop(facts, delta.get("stop_reason"))
        usage = event.get("usage")
        if isinstance(usage, dict):
            # output_tokens here is the final total; input counts appear only in newer API versions
            if usage.get("input_tokens") is not None:
                _messages_usage(facts, usage)
            else:
                output = _count(facts, usage, "output_tokens")
                if output is not None:
                    facts.output_tokens = output
    elif kind == "error":
        facts.add_finish(names.GEN_AI_FINISH_ERROR)
    return False
