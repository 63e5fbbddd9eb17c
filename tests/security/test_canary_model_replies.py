"""A hostile model reply cannot put a secret on the agent's CLIENT span or metrics, nor a hostile request or
reply on a gym model server's SERVER span or metrics.

A model app on loopback plants the canary, in the forms the scrubber knows, everywhere a reply carries a
string: the model name, the response id, the finish reason, a stream's error event, an error reply's body;
the request's own model name carries it too. The app runs plain (the agent's side) and as a gym model server
(``SimpleServer``, ``server_type: responses_api_models``: its model-call layer reads the same replies).
Every exported span (attributes and events) and every metric point recorded in the process is searched for
it. Ports 30851, 30852.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.trace import SpanKind

from gym_obs.client import (
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    get_response_json,
    iter_sse_data,
    request,
    set_global_aiohttp_client,
)
from gym_obs.server import SimpleServer
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture
from tests.integration.test_model_calls_replies import config, serving
from tests.security.canary_apps import CANARY

pytestmark = pytest.mark.integration

PORT = 30851
GYM_PORT = 30852
BASE = f"http://127.0.0.1:{PORT}"
LONG_MODEL = "m" * 10_000


def _reply(model: str) -> dict[str, Any]:
    choice = {"index": 0, "message": {"content": "hi"}, "finish_reason": f"api_key={CANARY}"}
    return {
        "id": f"sk-{CANARY}",
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def canary_model_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        if body.get("fail"):
            return JSONResponse({"error": {"message": f"password={CANARY}"}}, status_code=500)
        if body.get("long"):
            return JSONResponse(_reply(LONG_MODEL))
        if body.get("usual"):  # the shape the model-call layer reads in one step: the canary in the model
            usual = {**_reply(f"token={CANARY}"), "id": "chatcmpl-0123abc"}
            usual["choices"] = [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]
            return JSONResponse(usual)
        return JSONResponse(_reply(f"token={CANARY}"))

    @app.post("/v1/responses")
    async def responses() -> Response:
        # the usual Responses object, which the model-call layers read in one step: canaries in its names
        usual = {
            "id": f"sk-{CANARY}",  # a key where the id goes: scrubbed (a plain id is kept, as any id is)
            "object": "response",
            "model": f"token={CANARY}",
            "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
            "usage": {"input_tokens": 3, "output_tokens": 2},
        }
        return JSONResponse(usual)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            start = {"id": f"Bearer {CANARY}", "model": f"secret={CANARY}", "usage": {"input_tokens": 4}}
            yield _sse({"type": "message_start", "message": start})
            yield _sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}})
            yield _sse({"type": "error", "error": {"type": "overloaded", "message": f"token={CANARY}"}})
            yield _sse(
                {"type": "message_delta", "delta": {"stop_reason": CANARY}, "usage": {"output_tokens": 1}}
            )

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class CanaryModelServer(SimpleServer):
    """The same hostile replies from a gym model server: its model-call layer reads them too."""

    sessions_enabled = False

    def setup_webserver(self) -> FastAPI:
        return canary_model_app()


@pytest.fixture
async def model(telemetry: Capture) -> AsyncIterator[None]:
    with serving(canary_model_app(), PORT):
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
        yield
        await close_global_aiohttp_client()


def everything(telemetry: Capture) -> str:
    spans = [span.to_json() for span in telemetry.spans()]
    points = [
        repr(point.attributes) for name in telemetry.metric_names() for point in telemetry.metric_points(name)
    ]
    return "\n".join(spans + points)


async def test_a_canary_in_a_model_reply_reaches_no_span_and_no_metric(
    model: None, telemetry: Capture
) -> None:
    chat = BASE + names.GEN_AI_ROUTE_CHAT
    reply = await get_response_json(await request("POST", chat, json={"model": f"api_key={CANARY}"}))
    assert CANARY in reply["model"]  # the caller gets the reply untouched
    failed = await request("POST", chat, json={"model": "m", "fail": True})
    assert failed.status == 500 and CANARY in (await failed.text())
    stream = await request("POST", BASE + names.GEN_AI_ROUTE_MESSAGES, json={"model": f"token={CANARY}"})
    assert any(CANARY.encode() in data for data in [d async for d in iter_sse_data(stream)])
    await get_response_json(await request("POST", chat, json={"model": "m", "long": True}))
    usual = await get_response_json(await request("POST", BASE + names.GEN_AI_ROUTE_RESPONSES, json={}))
    assert CANARY in usual["id"] and CANARY in usual["model"]

    calls = [
        dict(s.attributes or {})
        for s in telemetry.spans()
        if s.kind is SpanKind.CLIENT and names.ATTR_GEN_AI_OPERATION_NAME in (s.attributes or {})
    ]
    assert len(calls) == 5
    assert {a[names.ATTR_GEN_AI_OUTCOME] for a in calls} == {"ok", "upstream_error"}
    assert calls[-1][names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 3  # the usual Responses object was read
    assert calls[0][names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS] == (names.GEN_AI_FINISH_OTHER,)
    assert all(len(str(a.get(names.ATTR_GEN_AI_RESPONSE_MODEL, ""))) <= 256 for a in calls)
    assert CANARY not in everything(telemetry)


async def test_a_canary_in_a_model_request_or_reply_reaches_no_server_span_and_no_metric(
    model: None, telemetry: Capture
) -> None:
    app = CanaryModelServer("policy", config(GYM_PORT)).build_app()
    base = f"http://127.0.0.1:{GYM_PORT}"
    with serving(app, GYM_PORT):
        telemetry.clear()
        chat = base + names.GEN_AI_ROUTE_CHAT
        reply = await get_response_json(await request("POST", chat, json={"model": f"api_key={CANARY}"}))
        assert CANARY in reply["id"] and CANARY in reply["model"]
        usual = await get_response_json(await request("POST", chat, json={"model": "m", "usual": True}))
        assert CANARY in usual["model"] and usual["choices"][0]["finish_reason"] == "stop"
        stream = await request("POST", base + names.GEN_AI_ROUTE_MESSAGES, json={"model": f"token={CANARY}"})
        assert any(CANARY.encode() in data for data in [d async for d in iter_sse_data(stream)])
        failed = await request("POST", chat, json={"model": f"secret={CANARY}", "fail": True})
        assert failed.status == 500 and CANARY in (await failed.text())
        usual = await get_response_json(await request("POST", base + names.GEN_AI_ROUTE_RESPONSES, json={}))
        assert CANARY in usual["id"] and CANARY in usual["model"]
    served = [
        dict(s.attributes or {})
        for s in telemetry.spans()
        if s.kind is SpanKind.SERVER and names.ATTR_GEN_AI_OPERATION_NAME in (s.attributes or {})
    ]
    assert len(served) == 5  # the layer saw every call (and put its names on the span, scrubbed)
    responses = [a for a in served if a[names.ATTR_GEN_AI_OPERATION_NAME] == names.GEN_AI_OPERATION_RESPONSES]
    assert len(responses) == 1 and responses[0][names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    # the usual reply (read and recorded in one step) kept its plain id and counts, and no raw model
    usual_spans = [a for a in served if a.get(names.ATTR_GEN_AI_RESPONSE_ID) == "chatcmpl-0123abc"]
    assert len(usual_spans) == 1 and usual_spans[0][names.ATTR_GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert any(names.ATTR_GEN_AI_RESPONSE_ID in a for a in served)
    assert any(names.ATTR_GEN_AI_REQUEST_MODEL in a for a in served)
    assert CANARY not in everything(telemetry)
