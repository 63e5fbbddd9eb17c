"""The model-call layer under a real uvicorn: JSON and SSE replies in all three dialects, hostile ones too.

A model server (a ``SimpleServer`` with ``server_type: responses_api_models``) answers every dialect's route
with a reply chosen by the request's ``scenario``; the test reads the reply bytes (they must be exactly what
the handler produced) and asserts on the SERVER span and the metric points the layer recorded.

Ports 29700-29709.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from gym_obs.config import parse_global_config
from gym_obs.failures import NgFailureEvent
from gym_obs.server import SimpleServer
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture, MetricPoint

pytestmark = pytest.mark.integration

PORT = 29700
ROUTES = {
    names.GEN_AI_OPERATION_CHAT: "/v1/chat/completions",
    names.GEN_AI_OPERATION_RESPONSES: "/v1/responses",
    names.GEN_AI_OPERATION_MESSAGES: "/v1/messages",
}
MODEL = "policy-7b"
USAGE = {"input": 11, "output": 7, "cached_input": 5}
HUGE_BYTES = 50 * 1024 * 1024


# --- the replies, written out as each dialect puts them on the wire --------------------------------------


def _sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, bytes) else json.dumps(data).encode()
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + payload + b"\n\n"


def _usage(operation: str, scale: int = 1) -> dict[str, Any]:
    i, o, c = (scale * USAGE[k] for k in ("input", "output", "cached_input"))
    if operation == names.GEN_AI_OPERATION_CHAT:
        return {"prompt_tokens": i, "completion_tokens": o, "prompt_tokens_details": {"cached_tokens": c}}
    if operation == names.GEN_AI_OPERATION_RESPONSES:
        return {"input_tokens": i, "output_tokens": o, "input_tokens_details": {"cached_tokens": c}}
    return {"input_tokens": i - c, "cache_read_input_tokens": c, "output_tokens": o}


def _plain_usage(operation: str) -> dict[str, Any]:
    i, o = USAGE["input"], USAGE["output"]
    if operation == names.GEN_AI_OPERATION_CHAT:
        return {"prompt_tokens": i, "completion_tokens": o}
    return {"input_tokens": i, "output_tokens": o}


def json_reply(operation: str, usage: Any) -> dict[str, Any]:
    if operation == names.GEN_AI_OPERATION_CHAT:
        choice = {"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}
        return {"id": "c1", "model": MODEL, "choices": [choice], "usage": usage}
    if operation == names.GEN_AI_OPERATION_RESPONSES:
        return {"id": "r1", "model": MODEL, "status": "completed", "output": [], "usage": usage}
    return {"id": "m1", "model": MODEL, "stop_reason": "end_turn", "usage": usage}


def stream_events(operation: str, words: int, usage: Any) -> list[bytes]:
    if operation == names.GEN_AI_OPERATION_CHAT:

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": "c1",
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        return [
            _sse(chunk({"role": "assistant", "content": ""})),
            *(_sse(chunk({"content": f" w{n}"})) for n in range(words)),
            _sse(chunk({}, "length")),
            _sse({"id": "c1", "model": MODEL, "choices": [], "usage": usage}),
            _sse(b"[DONE]"),
        ]
    if operation == names.GEN_AI_OPERATION_RESPONSES:
        done = {"id": "r1", "model": MODEL, "status": "incomplete", "output": [], "usage": usage}
        done["incomplete_details"] = {"reason": "max_output_tokens"}
        return [
            _sse({"type": "response.created", "response": {"id": "r1", "model": MODEL}}, "response.created"),
            *(
                _sse({"type": "response.output_text.delta", "delta": f" w{n}"}, "response.output_text.delta")
                for n in range(words)
            ),
            _sse({"type": "response.completed", "response": done}, "response.completed"),
        ]
    start_usage = (
        {k: v for k, v in usage.items() if k != "output_tokens"} if isinstance(usage, dict) else usage
    )
    return [
        _sse(
            {"type": "message_start", "message": {"id": "m1", "model": MODEL, "usage": start_usage}},
            "message_start",
        ),
        *(
            _sse(
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": f" w{n}"}},
                "content_block_delta",
            )
            for n in range(words)
        ),
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens"},
                "usage": {"output_tokens": usage.get("output_tokens") if isinstance(usage, dict) else None},
            },
            "message_delta",
        ),
        _sse({"type": "message_stop"}, "message_stop"),
    ]


def stream_chunks(operation: str, scenario: str) -> list[bytes]:
    """The body chunks of a streamed reply for ``scenario``."""
    if scenario == "no_usage":
        events = stream_events(operation, 3, {})
        return [e for e in events if b"usage" not in e or b"message_start" in e]
    if scenario == "negative":
        return stream_events(
            operation, 3, {k: -v for k, v in _usage(operation).items() if isinstance(v, int)}
        )
    events = stream_events(operation, 200 if scenario == "many" else 5, _usage(operation))
    if scenario == "split":
        whole = b"".join(events)
        return [whole[i : i + 5] for i in range(0, len(whole), 5)]
    if scenario == "one_chunk":
        return [b"".join(events)]
    if scenario == "huge_event":  # one event of 50 MB (any dialect's parser skips it; a reader passes it on)
        return [events[0], _sse({"type": "huge", "pad": "x" * HUGE_BYTES}), *events[1:]]
    if scenario == "truncated":
        whole = b"".join(events)
        return [whole[: len(whole) - 40]]
    if scenario == "malformed":
        # late events that look like the final ones (so they are read) but are not JSON
        garbage = b'data: {"type": "message_delta", "response.completed": 1, "usage": {oops\n\n'
        return [events[0], events[1], garbage, b"data: [1,2\n\n"]
    return events


def json_body(operation: str, scenario: str) -> bytes:
    if scenario == "malformed":
        return b'{"usage": {"prompt_tokens": 3'
    if scenario == "no_usage":
        return json.dumps(json_reply(operation, None)).encode()
    if scenario == "negative":
        return json.dumps(json_reply(operation, {k: -5 for k in _usage(operation)})).encode()
    if scenario == "huge":
        reply = json_reply(operation, _usage(operation))
        reply["pad"] = "x" * HUGE_BYTES
        return json.dumps(reply).encode()
    if scenario == "plain":  # both counts and no other (what most replies carry)
        return json.dumps(json_reply(operation, _plain_usage(operation))).encode()
    return json.dumps(json_reply(operation, _usage(operation))).encode()


class ReplyModelServer(SimpleServer):
    """Answers every dialect's route with the reply its request's ``scenario`` asks for."""

    sessions_enabled = False

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        async def answer(request: Request) -> Response:
            body = await request.json()
            operation = str(body["operation"])
            scenario = str(body.get("scenario", "ok"))
            if scenario == "error":
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
            if scenario == "raise":
                raise NgFailureEvent(
                    "provider_unavailable", "backend gone", boundary="model", http_status=502
                )
            if not body.get("stream"):
                return Response(json_body(operation, scenario), media_type="application/json")
            if scenario == "slow":
                return StreamingResponse(_slow(operation), media_type="text/event-stream")
            chunks = stream_chunks(operation, scenario)
            return StreamingResponse(_iterate(chunks), media_type="text/event-stream")

        for route in ROUTES.values():
            app.add_api_route(route, answer, methods=["POST"])
        app.add_api_route("/v1/embeddings", answer, methods=["POST"])
        return app


async def _iterate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _slow(operation: str) -> AsyncIterator[bytes]:
    events = stream_events(operation, 400, _usage(operation))
    for event in events:
        yield event
        await asyncio.sleep(0.02)


def config(port: int, **extra: Any) -> Any:
    server = {
        "entrypoint": f"{__name__}:ReplyModelServer",
        "server_type": "responses_api_models",
        "port": port,
        "model_calls": {"provider": "openai", "model_allow_list": [MODEL]},
        **extra,
    }
    return parse_global_config({"head_server": {"port": port + 1}, "servers": {"policy": server}})


@contextlib.contextmanager
def serving(app: Any, port: int) -> Iterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
async def model(telemetry: Capture) -> AsyncIterator[httpx.AsyncClient]:
    app = ReplyModelServer("policy", config(PORT)).build_app()
    with serving(app, PORT) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            telemetry.clear()
            yield client


async def _post(
    client: httpx.AsyncClient, capture: Capture, path: str, body: dict[str, Any]
) -> httpx.Response:
    """POST and wait for the call's SERVER span to end: with gym's SERVER span the layer records when the
    app returns, just before that span ends, which can be just after the client has read the last byte
    (the server runs on its own thread)."""
    before = _server_span_count(capture)
    response = await client.post(path, json=body)
    deadline = time.monotonic() + 5.0
    while True:
        if _server_span_count(capture) > before or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.01)


def _server_span_count(capture: Capture) -> int:
    return sum(1 for s in capture.spans() if s.kind is SpanKind.SERVER)


async def _call(
    client: httpx.AsyncClient, capture: Capture, operation: str, scenario: str, stream: bool, prefix: str = ""
) -> bytes:
    body = {"operation": operation, "scenario": scenario, "stream": stream, "model": MODEL}
    response = await _post(client, capture, prefix + ROUTES[operation], body)
    return response.content


def _server_span(capture: Capture, route: str) -> ReadableSpan:
    """The one SERVER span of the call: it ends when the app returns, which can be just after the client
    has read the last byte (the server runs on its own thread), so it is waited for, briefly."""
    deadline = time.monotonic() + 5.0
    while True:
        spans = [s for s in capture.spans() if s.kind is SpanKind.SERVER and s.name == f"POST {route}"]
        if spans or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert len(spans) == 1, [s.name for s in capture.spans()]
    return spans[0]


def _points(capture: Capture, metric: str, **attrs: str) -> list[MetricPoint]:
    return [
        p for p in capture.metric_points(metric) if all(p.attributes.get(k) == v for k, v in attrs.items())
    ]


def _token_sums(capture: Capture, operation: str) -> dict[str, float]:
    return {
        p.attributes[names.ATTR_GEN_AI_TOKEN_TYPE]: p.sum
        for p in _points(
            capture, names.METRIC_GEN_AI_SERVER_TOKEN_USAGE, **{names.ATTR_GEN_AI_OPERATION_NAME: operation}
        )
    }


def _unparsable(capture: Capture) -> dict[str, float]:
    return {
        p.attributes[names.ATTR_GEN_AI_UNPARSABLE_REASON]: float(p.value or 0)
        for p in capture.metric_points(names.METRIC_GEN_AI_SERVER_UNPARSABLE)
    }


def _outcomes(capture: Capture) -> dict[str, int]:
    return {
        p.attributes[names.ATTR_GEN_AI_OUTCOME]: p.count
        for p in capture.metric_points(names.METRIC_GEN_AI_SERVER_REQUEST_DURATION)
    }


OPERATIONS = list(ROUTES)


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_good_reply_gives_tokens_finish_duration_and_the_span(
    model: httpx.AsyncClient, telemetry: Capture, operation: str, stream: bool
) -> None:
    content = await _call(model, telemetry, operation, "ok", stream, prefix="/ng-rollout/r-42")
    expected = b"".join(stream_chunks(operation, "ok")) if stream else json_body(operation, "ok")
    assert content == expected
    base = {
        names.ATTR_GEN_AI_OPERATION_NAME: operation,
        names.ATTR_GEN_AI_PROVIDER_NAME: "openai",
        names.ATTR_SERVER_NAME: "policy",
        names.ATTR_GEN_AI_REQUEST_MODEL: MODEL,
    }
    (duration,) = capture_points = telemetry.metric_points(names.METRIC_GEN_AI_SERVER_REQUEST_DURATION)
    assert capture_points and duration.attributes == {**base, names.ATTR_GEN_AI_OUTCOME: "ok"}
    assert duration.count == 1 and duration.explicit_bounds == names.GEN_AI_DURATION_BUCKETS_S
    assert _token_sums(telemetry, operation) == {"input": 11, "output": 7, "cached_input": 5}
    (tokens,) = _points(
        telemetry, names.METRIC_GEN_AI_SERVER_TOKEN_USAGE, **{names.ATTR_GEN_AI_TOKEN_TYPE: "input"}
    )
    assert tokens.explicit_bounds == tuple(float(b) for b in names.GEN_AI_TOKEN_BUCKETS)
    assert telemetry.metric_unit(names.METRIC_GEN_AI_SERVER_TOKEN_USAGE) == "{token}"
    finish = "stop" if not stream else "length"
    (finishes,) = telemetry.metric_points(names.METRIC_GEN_AI_SERVER_FINISHES)
    assert finishes.attributes == {**base, names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS: finish}
    assert finishes.value == 1
    assert _unparsable(telemetry) == {}
    ttft = telemetry.metric_points(names.METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)
    span = _server_span(telemetry, ROUTES[operation])
    attrs = dict(span.attributes or {})
    assert attrs[names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert attrs[names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS] == 7
    assert attrs[names.ATTR_GEN_AI_USAGE_CACHED_INPUT_TOKENS] == 5
    assert attrs[names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS] == (finish,)
    assert (
        attrs[names.ATTR_GEN_AI_REQUEST_MODEL] == MODEL and attrs[names.ATTR_GEN_AI_RESPONSE_MODEL] == MODEL
    )
    assert attrs[names.ATTR_GEN_AI_OPERATION_NAME] == operation and attrs[names.ATTR_GEN_AI_OUTCOME] == "ok"
    assert attrs[names.ATTR_ROLLOUT_ID] == "r-42"
    events = [e for e in span.events if e.name == names.SPAN_EVENT_GEN_AI_FIRST_TOKEN]
    if stream:
        (point,) = ttft
        assert point.count == 1 and point.explicit_bounds == names.GEN_AI_TTFT_BUCKETS_S
        assert 0 < point.sum <= duration.sum
        (event,) = events
        assert 0 < (event.attributes or {})[names.ATTR_GEN_AI_TIME_TO_FIRST_TOKEN] <= duration.sum
    else:
        assert ttft == [] and events == []


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("scenario", ["split", "many", "one_chunk"])
async def test_any_chunking_of_a_stream_gives_the_same_facts(
    model: httpx.AsyncClient, telemetry: Capture, operation: str, scenario: str
) -> None:
    content = await _call(model, telemetry, operation, scenario, True)
    assert content == b"".join(stream_chunks(operation, scenario))
    assert _token_sums(telemetry, operation) == {"input": 11, "output": 7, "cached_input": 5}
    assert len(telemetry.metric_points(names.METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)) == 1
    assert _unparsable(telemetry) == {}


#: (scenario, streamed, the unparsable reason it must be counted under): shared with the client-side tests.
HOSTILE = [
    ("malformed", False, "malformed"),
    ("malformed", True, "malformed"),
    ("truncated", True, "truncated"),
    ("no_usage", False, "missing_usage"),
    ("no_usage", True, "missing_usage"),
    ("negative", False, "invalid_usage"),
    ("negative", True, "invalid_usage"),
]


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize(("scenario", "stream", "reason"), HOSTILE)
async def test_hostile_replies_pass_untouched_and_are_counted_once_as_unparsable(
    model: httpx.AsyncClient, telemetry: Capture, operation: str, scenario: str, stream: bool, reason: str
) -> None:
    content = await _call(model, telemetry, operation, scenario, stream)
    expected = b"".join(stream_chunks(operation, scenario)) if stream else json_body(operation, scenario)
    assert content == expected
    assert _unparsable(telemetry) == {reason: 1.0}
    assert _outcomes(telemetry) == {"ok": 1}
    for token_type, count in _token_sums(telemetry, operation).items():
        assert count >= 0, token_type
    span = _server_span(telemetry, ROUTES[operation])
    assert (span.attributes or {})[names.ATTR_GEN_AI_UNPARSABLE_REASON] == reason


async def test_a_50_mb_reply_arrives_whole_and_only_its_usage_is_skipped(
    model: httpx.AsyncClient, telemetry: Capture
) -> None:
    content = await _call(model, telemetry, names.GEN_AI_OPERATION_CHAT, "huge", False)
    assert content == json_body(names.GEN_AI_OPERATION_CHAT, "huge")
    assert _unparsable(telemetry) == {"too_large": 1.0}
    assert _outcomes(telemetry) == {"ok": 1}
    assert _token_sums(telemetry, names.GEN_AI_OPERATION_CHAT) == {}


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_error_replies_and_exceptions_are_outcomes_not_unparsable(
    model: httpx.AsyncClient, telemetry: Capture, operation: str
) -> None:
    error = await _post(model, telemetry, ROUTES[operation], {"operation": operation, "scenario": "error"})
    assert error.status_code == 503
    failed = await _post(model, telemetry, ROUTES[operation], {"operation": operation, "scenario": "raise"})
    assert failed.status_code == 502 and failed.headers.get(names.FAILURE_REPORT_HEADER)
    assert _outcomes(telemetry) == {"upstream_error": 1, "exception": 1}
    assert _unparsable(telemetry) == {}
    outcomes = sorted(
        (s.attributes or {}).get(names.ATTR_GEN_AI_OUTCOME)
        for s in telemetry.spans()
        if s.kind is SpanKind.SERVER
    )
    assert outcomes == ["exception", "upstream_error"]


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_a_caller_that_goes_away_mid_stream_is_cancelled(
    model: httpx.AsyncClient, telemetry: Capture, operation: str
) -> None:
    body = {"operation": operation, "scenario": "slow", "stream": True}
    async with model.stream("POST", ROUTES[operation], json=body) as response:
        async for _chunk in response.aiter_bytes():
            break  # the first content arrived: hang up
    deadline = time.monotonic() + 15
    while "cancelled" not in _outcomes(telemetry):
        assert time.monotonic() < deadline, _outcomes(telemetry)
        await asyncio.sleep(0.05)
    assert _outcomes(telemetry) == {"cancelled": 1}
    assert _unparsable(telemetry) == {}
    assert telemetry.metric_points(names.METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN) == []


async def test_other_routes_and_unlisted_models_stay_out_of_the_metrics(
    model: httpx.AsyncClient, telemetry: Capture
) -> None:
    await _post(model, telemetry, "/v1/embeddings", {"operation": "chat"})
    assert telemetry.metric_points(names.METRIC_GEN_AI_SERVER_REQUEST_DURATION) == []
    body = {"operation": "chat", "model": "secret-finetune-123"}
    await _post(model, telemetry, ROUTES["chat"], body)
    (point,) = telemetry.metric_points(names.METRIC_GEN_AI_SERVER_REQUEST_DURATION)
    assert point.attributes[names.ATTR_GEN_AI_REQUEST_MODEL] == names.GEN_AI_MODEL_OTHER
    span = _server_span(telemetry, ROUTES["chat"])
    assert (span.attributes or {})[names.ATTR_GEN_AI_REQUEST_MODEL] == "secret-finetune-123"
