"""When the model-call layer records, against the two ways a SERVER span can end (driven in process).

gym's own SERVER span ends when the app returns: the layer passes the final body message on at once and
reads and records the reply after the app returned. A span that ends with the last body message (contrib's)
gets its attributes before that message passes: the final bytes go out first, then the reply is read, then
the end of the body. Either way no body byte waits for the parse.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from opentelemetry import trace

from gym_obs.server.model_calls import ModelCallMiddleware
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture

REPLY = json.dumps(
    {
        "id": "c1",
        "model": "m",
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
).encode()
START = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}


async def _handler(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send(START)
    await send({"type": "http.response.body", "body": REPLY, "more_body": False})


def _drive(capture: Capture, scope_name: str, ends_with_last_body: bool) -> tuple[list[Any], list[Any]]:
    """One chat call through the layer inside a SERVER span of tracer ``scope_name``; returns what reached
    the server's ``send`` and what the span had when the end of the body passed."""
    tracer = capture.tracer_provider.get_tracer(scope_name)
    layer = ModelCallMiddleware(_handler, server_name="s")
    sent: list[Any] = []
    at_end: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"model": "m"}', "more_body": False}

    async def run() -> None:
        span = tracer.start_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                at_end.append(dict(span.attributes or {}))  # type: ignore[attr-defined]
                if ends_with_last_body:
                    span.end()

        with trace.use_span(span, end_on_exit=not ends_with_last_body):
            scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST"}
            await layer(scope, receive, send)

    asyncio.run(run())
    return sent, at_end


@pytest.mark.parametrize("scope_name", [names.INSTRUMENTATION_SCOPE, "opentelemetry.instrumentation.asgi"])
def test_the_span_gets_the_calls_attributes_and_the_bytes_pass_untouched(
    telemetry: Capture, scope_name: str
) -> None:
    ends_with_last_body = scope_name != names.INSTRUMENTATION_SCOPE
    sent, at_end = _drive(telemetry, scope_name, ends_with_last_body)
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert b"".join(m.get("body", b"") for m in bodies) == REPLY
    assert bodies[-1].get("more_body", False) is False
    if ends_with_last_body:  # read before the end of the body passed: the span ends with it
        assert [m.get("body") for m in bodies] == [REPLY, b""]
        assert at_end[0][names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 3
    else:  # passed on as it came; read after the app returned, while gym's span was still open
        assert bodies == [{"type": "http.response.body", "body": REPLY, "more_body": False}]
        assert names.ATTR_GEN_AI_USAGE_INPUT_TOKENS not in at_end[0]
    (span,) = telemetry.spans()
    attributes = dict(span.attributes or {})
    assert attributes[names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert attributes[names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert attributes[names.ATTR_GEN_AI_REQUEST_MODEL] == "m"
    (duration,) = telemetry.metric_points(names.METRIC_GEN_AI_SERVER_REQUEST_DURATION)
    assert duration.count == 1 and duration.attributes[names.ATTR_GEN_AI_OUTCOME] == "ok"


def test_each_span_is_read_by_its_own_scope_when_scopes_alternate(telemetry: Capture) -> None:
    """Whether a span ends with the app is decided per instrumentation scope (the last answer is kept):
    alternating scopes each get their own way."""
    contrib = "opentelemetry.instrumentation.asgi"
    for scope_name in (names.INSTRUMENTATION_SCOPE, contrib, contrib, names.INSTRUMENTATION_SCOPE, contrib):
        ends_with_last_body = scope_name == contrib
        sent, at_end = _drive(telemetry, scope_name, ends_with_last_body)
        bodies = [m.get("body") for m in sent if m["type"] == "http.response.body"]
        assert bodies == ([REPLY, b""] if ends_with_last_body else [REPLY])
        assert (names.ATTR_GEN_AI_USAGE_INPUT_TOKENS in at_end[0]) is ends_with_last_body
    spans = telemetry.spans()
    assert len(spans) == 5
    assert all(dict(s.attributes or {})[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 3 for s in spans)


def test_a_current_span_that_is_not_the_server_span_gets_no_attributes(telemetry: Capture) -> None:
    tracer = telemetry.tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE)
    layer = ModelCallMiddleware(_handler, server_name="s")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"model": "m"}', "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    async def run() -> None:
        with tracer.start_as_current_span("work", kind=trace.SpanKind.INTERNAL):
            await layer({"type": "http", "path": "/v1/chat/completions", "method": "POST"}, receive, send)

    asyncio.run(run())
    (span,) = telemetry.spans()
    assert not any(key.startswith("gen_ai.") for key in dict(span.attributes or {}))
    (duration,) = telemetry.metric_points(names.METRIC_GEN_AI_SERVER_REQUEST_DURATION)
    assert duration.count == 1  # the call is still measured


@pytest.mark.parametrize(
    ("asked", "answered", "shown"),
    [
        ("m", "m", "m"),
        ("m", "m-2024", "m-2024"),
        ("m", "sk-" + "A" * 24, "sk-[REDACTED]"),  # a name a peer chose is scrubbed, also when it differs
        ("sk-" + "B" * 24, "sk-" + "B" * 24, "sk-[REDACTED]"),
    ],
)
def test_request_and_reply_model_names_are_scrubbed_each(
    telemetry: Capture, asked: str, answered: str, shown: str
) -> None:
    reply = json.dumps({"id": "c1", "model": answered, "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(START)
        await send({"type": "http.response.body", "body": reply.encode(), "more_body": False})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": json.dumps({"model": asked}).encode(), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    tracer = telemetry.tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE)
    layer = ModelCallMiddleware(handler, server_name="s")

    async def run() -> None:
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER):
            await layer({"type": "http", "path": "/v1/chat/completions", "method": "POST"}, receive, send)

    asyncio.run(run())
    (span,) = telemetry.spans()
    attributes = dict(span.attributes or {})
    assert attributes[names.ATTR_GEN_AI_RESPONSE_MODEL] == shown
    assert attributes[names.ATTR_GEN_AI_REQUEST_MODEL] == (shown if asked == answered else asked)


def test_calls_with_the_same_names_get_the_same_attributes_in_the_same_order(telemetry: Capture) -> None:
    """A call's names are worked out once per combination (the layer keeps them): repeated and alternating
    combinations, with and without an unparsable reason, get what the first of each got, in span order."""
    replies = {
        "ok": {"id": "c1", "model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
        "other": {"id": "c2", "model": "m-2", "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
        "no usage": {"id": "c3", "model": "m"},  # missing_usage: the reason goes between provider and names
    }
    asked = {"ok": "m", "other": "big", "no usage": "m"}
    order = ["ok", "other", "no usage", "ok", "no usage", "other", "ok"]
    tracer = telemetry.tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE)

    current = [order[0]]

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(START)
        await send({"type": "http.response.body", "body": json.dumps(replies[current[0]]).encode()})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": json.dumps({"model": asked[current[0]]}).encode()}

    async def send(message: dict[str, Any]) -> None:
        pass

    layer = ModelCallMiddleware(handler, provider="vllm", model_allow_list=["m"])

    async def run() -> None:
        for case in order:
            current[0] = case
            with tracer.start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER):
                await layer({"type": "http", "path": "/v1/chat/completions", "method": "POST"}, receive, send)

    asyncio.run(run())
    op, outcome, streamed = (
        names.ATTR_GEN_AI_OPERATION_NAME, names.ATTR_GEN_AI_OUTCOME, names.ATTR_GEN_AI_STREAMED
    )
    tokens = [names.ATTR_GEN_AI_USAGE_INPUT_TOKENS, names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS]
    provider, reason = names.ATTR_GEN_AI_PROVIDER_NAME, names.ATTR_GEN_AI_UNPARSABLE_REASON
    models = [
        names.ATTR_GEN_AI_REQUEST_MODEL, names.ATTR_GEN_AI_RESPONSE_MODEL, names.ATTR_GEN_AI_RESPONSE_ID
    ]
    expected = {
        "ok": ([op, outcome, streamed, *tokens, provider, *models], ("m", "m", "c1")),
        "other": ([op, outcome, streamed, *tokens, provider, *models], ("big", "m-2", "c2")),
        "no usage": ([op, outcome, streamed, provider, reason, *models], ("m", "m", "c3")),
    }
    spans = telemetry.spans()
    assert len(spans) == len(order)
    for case, span in zip(order, spans, strict=True):
        recorded = dict(span.attributes or {}).items()
        attributes = {k: v for k, v in recorded if k.startswith(("gen_ai.", "gym."))}
        keys, names_shown = expected[case]
        assert list(attributes) == keys, case
        assert tuple(attributes[key] for key in models) == names_shown, case
        assert attributes[provider] == "vllm"
    labels = sorted(
        (p.attributes.get(names.ATTR_GEN_AI_REQUEST_MODEL), p.count)
        for p in telemetry.metric_points(names.METRIC_GEN_AI_SERVER_REQUEST_DURATION)
    )
    assert labels == sorted([(names.GEN_AI_MODEL_OTHER, 2), ("m", 5)])  # the allow-list's label, per call
