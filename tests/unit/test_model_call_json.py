"""The model-call layer's JSON reader and its usual-reply record step give what the general ones give.

The layer reads the usual chat reply (one choice with a finish reason, both counts, no details, a printable
model, a plain-word id) and the usual Responses object (completed, both counts, no details, named) in one
frame and records it in one step; everything else goes through genai's
general reader and the general record step. These tests hold the fast paths to the general ones: reply by
reply on the facts (hostile variants of the usual reply included), and call by call on what a span and the
metrics get.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace

from gym_obs.server.model_calls import ModelCallMiddleware
from gym_obs.telemetry import names
from gym_obs.telemetry.genai import MAX_TOKENS, ReplyFacts, facts_from_json
from gym_obs.telemetry.testing import Capture
from gym_obs.telemetry.usual_reply import read_json_reply

CHAT_REASONS = {"stop": "stop", "length": "length"}
CHAT, RESPONSES, MESSAGES = (
    names.GEN_AI_OPERATION_CHAT, names.GEN_AI_OPERATION_RESPONSES, names.GEN_AI_OPERATION_MESSAGES
)


def _usual() -> dict[str, Any]:
    return {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(reply: dict[str, Any]) -> None:
        *parents, last = path
        target: Any = reply
        for key in parents:
            target = target[key]
        target[last] = value

    return change


def _drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def change(reply: dict[str, Any]) -> None:
        *parents, last = path
        target: Any = reply
        for key in parents:
            target = target[key]
        del target[last]

    return change


def _usage_changes(counted_in: str, counted_out: str) -> dict[str, Callable[[dict[str, Any]], None]]:
    """One change each to the ``usage`` block of a dialect whose two counts are ``counted_in`` and
    ``counted_out`` (``prompt_tokens`` / ``completion_tokens`` in chat, ``input_tokens`` / ``output_tokens``
    in Responses), each with its ``<count>_details``."""
    in_word, out_word = counted_in.split("_")[0], counted_out.split("_")[0]
    in_details, out_details = f"{counted_in}_details", f"{counted_out}_details"
    return {
        "no usage": _drop(("usage",)),
        "usage null": _set(("usage",), None),
        "usage a list": _set(("usage",), [3, 2]),
        f"no {in_word} count": _drop(("usage", counted_in)),
        f"no {out_word} count": _drop(("usage", counted_out)),
        "count a bool": _set(("usage", counted_in), True),
        "count a float": _set(("usage", counted_out), 2.0),
        "count negative": _set(("usage", counted_in), -1),
        "count at the limit": _set(("usage", counted_in), MAX_TOKENS),
        "count over the limit": _set(("usage", counted_out), MAX_TOKENS + 1),
        "count a str": _set(("usage", counted_in), "3"),
        "details null": _set(("usage", in_details), None),
        "cached details": _set(("usage", in_details), {"cached_tokens": 1}),
        "reasoning details": _set(("usage", out_details), {"reasoning_tokens": 1}),
        "empty details": _set(("usage", out_details), {}),
        "bad details": _set(("usage", out_details), {"reasoning_tokens": -4}),
    }


# One change each to the usual reply: the ones the fast path takes, and the ones it must leave to genai.
CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "usual": lambda reply: None,
    "finish length": _set(("choices", 0, "finish_reason"), "length"),
    "finish unknown": _set(("choices", 0, "finish_reason"), "weird"),
    "finish null": _set(("choices", 0, "finish_reason"), None),
    "finish not a str": _set(("choices", 0, "finish_reason"), ["stop"]),
    "finish a number": _set(("choices", 0, "finish_reason"), 7),
    "no finish": _drop(("choices", 0, "finish_reason")),
    "index 3": _set(("choices", 0, "index"), 3),
    "index a bool": _set(("choices", 0, "index"), True),
    "index a str": _set(("choices", 0, "index"), "0"),
    "no index": _drop(("choices", 0, "index")),
    "two choices": _set(("choices",), [{"finish_reason": "stop"}, {"index": 1, "finish_reason": "length"}]),
    "no choices": _set(("choices",), []),
    "choice not a dict": _set(("choices",), ["stop"]),
    "choices a dict": _set(("choices",), {"0": {"finish_reason": "stop"}}),
    **_usage_changes("prompt_tokens", "completion_tokens"),
    "model empty": _set(("model",), ""),
    "model unprintable": _set(("model",), "m\x00"),
    "model long": _set(("model",), "m" * 257),
    "model at the limit": _set(("model",), "m" * 256),
    "model a number": _set(("model",), 7),
    "no model": _drop(("model",)),
    "model a secret": _set(("model",), "sk-" + "A" * 24),
    "id empty": _set(("id",), ""),
    "id with a space": _set(("id",), "chat cmpl"),
    "id a key": _set(("id",), "sk-" + "B" * 24),
    "id base62": _set(("id",), "chatcmpl-AbCxYzKg"),
    "id long": _set(("id",), "c" * 257),
    "id at the limit": _set(("id",), "c" * 256),
    "id unicode": _set(("id",), "chatcmpl-é"),
    "id a number": _set(("id",), 12),
    "no id": _drop(("id",)),
}
#: The changes the fast path takes (any other reply is read by genai's general reader).
USUAL: frozenset[str] = frozenset(
    {
        "usual", "finish length", "finish unknown", "index 3", "index a bool", "index a str", "no index",
        "details null", "count at the limit", "model at the limit", "model a secret", "id at the limit",
        "id with a space", "id a key", "id base62", "id unicode",
    }
)
def _usual_response() -> dict[str, Any]:
    return {
        "id": "resp_0123456789abcdef",
        "object": "response",
        "model": "m",
        "status": "completed",
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
        ],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
    }


_NAMES = ("model", "id", "no model", "no id")
# One change each to the usual Responses object (its model and id changes are the chat reply's).
RESPONSE_CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "usual": lambda reply: None,
    "a tool call": _set(("output",), [{"type": "message"}, {"type": "function_call", "name": "f"}]),
    "an odd item after a tool call": _set(("output",), [{"type": "mcp_call"}, {"type": ["x"]}]),
    "output empty": _set(("output",), []),
    "item not a dict": _set(("output",), ["function_call"]),
    "item type a list": _set(("output", 0, "type"), ["function_call"]),
    "item type a number": _set(("output", 0, "type"), 7),
    "item type null": _set(("output", 0, "type"), None),
    "no item type": _drop(("output", 0, "type")),
    "no output": _drop(("output",)),
    "output a dict": _set(("output",), {"type": "function_call"}),
    "status incomplete": _set(("status",), "incomplete"),
    "status failed": _set(("status",), "failed"),
    "status in progress": _set(("status",), "in_progress"),
    "status a number": _set(("status",), 7),
    "no status": _drop(("status",)),
    **_usage_changes("input_tokens", "output_tokens"),
    **{name: change for name, change in CHANGES.items() if name.startswith(_NAMES)},
}
RESPONSE_USUAL: frozenset[str] = frozenset(
    {
        "usual", "a tool call", "an odd item after a tool call", "output empty", "item not a dict",
        "count at the limit", "details null", "model at the limit", "model a secret", "id at the limit",
        "id with a space", "id a key", "id base62", "id unicode",
    }
)


RAW_BODIES = {
    "empty": b"",
    "truncated": json.dumps(_usual()).encode()[:-7],
    "a list": b"[1, 2]",
    "not utf-8": b"\xff\xfe",
    "usage in a string": json.dumps({"id": "c1", "note": '"usage": {"prompt_tokens": 5}'}).encode(),
    "trailing bytes": json.dumps(_usual()).encode() + b" x",
}


_Change = Callable[[dict[str, Any]], None]


def _bodies(usual: Callable[[], dict[str, Any]], changes: dict[str, _Change]) -> list[tuple[str, bytes]]:
    bodies = list(RAW_BODIES.items())
    for name, change in changes.items():
        reply = copy.deepcopy(usual())
        change(reply)
        bodies.append((name, json.dumps(reply).encode()))
    return bodies


CHAT_BODIES = _bodies(_usual, CHANGES)
RESPONSE_BODIES = _bodies(_usual_response, RESPONSE_CHANGES)


def _facts_view(facts: ReplyFacts) -> tuple[Any, ...]:
    # a later finish report shows the finish state is the same (the index it was recorded under)
    seen = (
        facts.input_tokens, facts.output_tokens, facts.reasoning_tokens, facts.cached_input_tokens,
        facts.finish_tuple(), facts.response_model, facts.response_id, facts.span_response_id(),
        facts.content_started, facts.problem,
    )
    facts.add_finish(names.GEN_AI_FINISH_LENGTH, 0)
    facts.add_finish(names.GEN_AI_FINISH_ERROR, 5)
    return (*seen, facts.finish_tuple())


def _check_reader(operation: str, body: bytes, usual_expected: bool) -> None:
    fast = ReplyFacts()
    usual = read_json_reply(operation, body, fast)
    general = facts_from_json(operation, body)
    assert (usual is not None) == usual_expected
    if usual is not None:  # what the record step relies on
        assert usual == general.finish_tuple() and len(usual) == 1
        assert general.problem is None
        assert general.reasoning_tokens is None and general.cached_input_tokens is None
        assert general.input_tokens is not None and general.output_tokens is not None
    assert _facts_view(fast) == _facts_view(general)


@pytest.mark.parametrize("operation", [CHAT, RESPONSES, MESSAGES])
@pytest.mark.parametrize(("case", "body"), CHAT_BODIES, ids=[name for name, _ in CHAT_BODIES])
def test_the_layers_reader_gives_the_general_readers_facts(operation: str, case: str, body: bytes) -> None:
    _check_reader(operation, body, operation == CHAT and case in USUAL)


@pytest.mark.parametrize("operation", [CHAT, RESPONSES, MESSAGES])
@pytest.mark.parametrize(("case", "body"), RESPONSE_BODIES, ids=[name for name, _ in RESPONSE_BODIES])
def test_the_layers_reader_gives_the_general_readers_facts_for_responses_objects(
    operation: str, case: str, body: bytes
) -> None:
    usual = operation == RESPONSES and case in RESPONSE_USUAL and case not in RAW_BODIES
    _check_reader(operation, body, usual)


def _run(
    capture: Capture,
    scope_name: str,
    replies: list[list[Any]],
    provider: str | None,
    path: str = "/v1/chat/completions",
) -> None:
    """Calls to ``path`` through the layer inside SERVER spans of ``scope_name``, each replying with its
    body parts."""
    tracer = capture.tracer_provider.get_tracer(scope_name)
    contrib = scope_name != names.INSTRUMENTATION_SCOPE
    current: list[list[Any]] = [[]]
    json_type = [(b"content-type", b"application/json")]
    start = {"type": "http.response.start", "status": 200, "headers": json_type}

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(start)
        parts = current[0]
        for at, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part, "more_body": at < len(parts) - 1})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"model": "m", "messages": []}', "more_body": False}

    layer = ModelCallMiddleware(handler, server_name="s", provider=provider, model_allow_list=["m"])

    async def run() -> None:
        for parts in replies:
            current[0] = parts
            span = tracer.start_span(f"POST {path}", kind=trace.SpanKind.SERVER)

            async def send(message: dict[str, Any], span: Any = span) -> None:
                if contrib and message["type"] == "http.response.body" and not message.get("more_body"):
                    span.end()

            with trace.use_span(span, end_on_exit=not contrib):
                await layer({"type": "http", "path": path, "method": "POST"}, receive, send)

    asyncio.run(run())


#: What the layer records (the time to first token is a stream's only).
METRICS = (
    names.METRIC_GEN_AI_SERVER_REQUEST_DURATION,
    names.METRIC_GEN_AI_SERVER_TOKEN_USAGE,
    names.METRIC_GEN_AI_SERVER_FINISHES,
    names.METRIC_GEN_AI_SERVER_UNPARSABLE,
)


def _recorded(capture: Capture) -> tuple[list[list[tuple[str, Any]]], list[tuple[Any, ...]]]:
    """Each span's attributes in order and every point (a duration's count only: the rest is time)."""
    spans = [
        list((span.attributes or {}).items()) for span in capture.spans()
    ]
    points = []
    for metric in METRICS:
        for point in capture.metric_points(metric):
            labels = sorted(point.attributes.items())
            if metric == names.METRIC_GEN_AI_SERVER_REQUEST_DURATION:  # (a time: its count only)
                points.append((metric, labels, point.count))
            else:
                fields = (point.value, point.count, point.sum, point.bucket_counts, point.min, point.max)
                points.append((metric, labels, *fields))
    return spans, sorted(points, key=repr)


#: A reply id of each kind: a plain word (its own scrub), one that is not (``_``), a key (scrubbed).
REPLY_IDS = ("chatcmpl-0123456789abcdef", "resp_0123456789abcdef", "sk-" + "B" * 24)


def _usual_of(dialect: str, finish: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A usual reply of ``dialect`` finishing with ``finish``, the same reply with empty token details
    (the general path, the same facts), and its route."""
    if dialect == CHAT:
        usual = _usual()
        usual["choices"][0]["finish_reason"] = finish
        details = "completion_tokens_details"
        path = "/v1/chat/completions"
    else:
        usual = _usual_response()
        if finish == "tool":
            usual["output"].append({"type": "function_call", "name": "f", "arguments": "{}"})
        details = "output_tokens_details"
        path = "/v1/responses"
    general = copy.deepcopy(usual)
    general["usage"][details] = {}
    return usual, general, path


@pytest.mark.parametrize("scope_name", [names.INSTRUMENTATION_SCOPE, "opentelemetry.instrumentation.asgi"])
@pytest.mark.parametrize("provider", [None, "vllm"])
@pytest.mark.parametrize(
    ("dialect", "finish"),
    [(CHAT, "stop"), (CHAT, "length"), (CHAT, "weird"), (RESPONSES, "stop"), (RESPONSES, "tool")],
)
@pytest.mark.parametrize("reply_id", REPLY_IDS)
def test_a_usual_reply_records_what_the_general_steps_record(
    telemetry: Capture, scope_name: str, provider: str | None, dialect: str, finish: str, reply_id: str
) -> None:
    """The same reply, once usual and once with empty token details: the same span attributes in the
    same order, and the same metric points; an id that is a key is scrubbed on the span either way."""
    usual, general, path = _usual_of(dialect, finish)
    seen = []
    for reply in (usual, general):
        reply["id"] = reply_id
        telemetry.clear()
        _run(telemetry, scope_name, [[json.dumps(reply).encode()]] * 2, provider, path)
        seen.append(_recorded(telemetry))
    assert seen[0] == seen[1]
    spans, points = seen[0]
    assert {point[0] for point in points} == set(METRICS[:3])
    assert [key for key, _ in spans[0]][:3] == [
        names.ATTR_GEN_AI_OPERATION_NAME, names.ATTR_GEN_AI_OUTCOME, names.ATTR_GEN_AI_STREAMED
    ]
    ids = [dict(span.attributes or {})[names.ATTR_GEN_AI_RESPONSE_ID] for span in telemetry.spans()]
    assert ids == [reply_id if not reply_id.startswith("sk-") else ids[0]] * 2
    assert all("B" * 24 not in value for value in ids)
    finish_key = names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS
    reasons = [dict(span.attributes or {})[finish_key] for span in telemetry.spans()]
    assert reasons == [("tool_call",) if finish == "tool" else (CHAT_REASONS.get(finish, "other"),)] * 2


@pytest.mark.parametrize(
    "parts",
    [
        [b"A", b"", b"B", b"C"],  # the reply split in three (and an empty message between)
        [bytearray(b"ABC")],  # one part that is not bytes
        [b"ABC", b""],  # the end of the body alone
    ],
    ids=["three parts", "a bytearray", "empty last part"],
)
def test_a_reply_in_parts_is_read_as_the_whole(telemetry: Capture, parts: list[Any]) -> None:
    body = json.dumps(_usual()).encode()
    third = len(body) // 3
    pieces = {b"A": body[:third], b"B": body[third : 2 * third], b"C": body[2 * third :], b"ABC": body}
    sent = [bytearray(pieces[bytes(p)]) if type(p) is bytearray else pieces.get(p, p) for p in parts]
    seen = []
    for reply in (sent, [body]):
        telemetry.clear()
        _run(telemetry, names.INSTRUMENTATION_SCOPE, [reply], None)
        seen.append(_recorded(telemetry))
    assert seen[0] == seen[1]
    attributes = dict(seen[0][0][0])
    assert attributes[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert names.ATTR_GEN_AI_UNPARSABLE_REASON not in attributes
