"""Demo model server: synthetic replies after a configurable latency, in three dialects, JSON or streamed.

No model runs; the latency distribution stands in for prefill (the time to the first token) and
``stream_token_delay_s`` for decoding, so the harness can load the runtime (pools, retries, spans, the
model-call telemetry) the way a real model server does without a GPU. Routes: ``POST /v1/responses``
(OpenAI Responses), ``/v1/chat/completions`` (OpenAI chat completions) and ``/v1/messages`` (Anthropic
messages). A reply is streamed as server-sent events, with the dialect's real event shapes and a final
``usage``, when the request asks (``"stream": true``) or the server's ``stream`` setting says so.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar, Literal

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from gym_obs.harness.fault_middleware import raise_injected_fault
from gym_obs.harness.servers._common import HarnessServer, OwnConfig

__all__ = ["LatencySpec", "ModelServer", "ModelSettings"]

RESPONSES_ROUTE = "/v1/responses"
CHAT_ROUTE = "/v1/chat/completions"
MESSAGES_ROUTE = "/v1/messages"
EVENT_STREAM = "text/event-stream"


class LatencySpec(BaseModel):
    """Generation latency: ``median_s`` and a shape; every sample is clamped to ``[min_s, max_s]``."""

    model_config = ConfigDict(extra="forbid")

    distribution: Literal["constant", "uniform", "exponential", "lognormal"] = "lognormal"
    median_s: float = Field(default=0.01, ge=0.0, le=600.0)
    sigma: float = Field(default=0.5, ge=0.0, le=5.0, description="lognormal shape")
    min_s: float = Field(default=0.0, ge=0.0)
    max_s: float = Field(default=5.0, gt=0.0)

    def sample(self, rng: random.Random) -> float:
        if self.median_s <= 0:
            return 0.0
        if self.distribution == "constant":
            value = self.median_s
        elif self.distribution == "uniform":
            value = rng.uniform(0.0, 2 * self.median_s)
        elif self.distribution == "exponential":
            value = rng.expovariate(math.log(2) / self.median_s)
        else:
            value = rng.lognormvariate(math.log(self.median_s), self.sigma)
        return min(max(value, self.min_s), self.max_s)


class ModelSettings(OwnConfig):
    latency: LatencySpec = Field(default_factory=LatencySpec)
    reply_words: int = Field(default=12, ge=1, le=10_000)
    #: Stream every reply (SSE) even when the request does not ask for it (the harness's ``--stream``).
    stream: bool = False
    #: Words per streamed chunk (a real server sends one or a few tokens per event).
    stream_chunk_words: int = Field(default=1, ge=1, le=10_000)
    #: Pause between streamed chunks: the decoding time per chunk.
    stream_token_delay_s: float = Field(default=0.0, ge=0.0, le=10.0)
    #: The runtime's model-call telemetry settings (``gym_obs.server.model_calls``), passed through.
    model_calls: dict[str, Any] | None = None


class _Reply:
    """One synthetic generation: its words, token counts and ids, rendered in any of the three dialects."""

    def __init__(self, model: str, body: Any, words: int) -> None:
        meta = body.get("metadata") if isinstance(body, dict) else None
        turn = meta.get("turn", 0) if isinstance(meta, dict) else 0
        turn = turn if isinstance(turn, int) else 0
        self.model = model
        self.words = [f"token{(turn + i) % 97}" for i in range(words)]
        self.words[0] = f"answer {turn}: {self.words[0]}"
        self.text = " ".join(self.words)
        self.input_tokens = len(str(body)) // 4
        self.output_tokens = words
        self.id = uuid.uuid4().hex

    # -- JSON replies --------------------------------------------------------------------------------------

    def responses_object(self, status: str = "completed") -> dict[str, Any]:
        return {
            "id": f"resp_{self.id}",
            "object": "response",
            "model": self.model,
            "status": status,
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": self.text}],
                }
            ],
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
            },
        }

    def chat_object(self) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{self.id}",
            "object": "chat.completion",
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text},
                    "finish_reason": "stop",
                }
            ],
            "usage": self._chat_usage(),
        }

    def messages_object(self) -> dict[str, Any]:
        return {
            "id": f"msg_{self.id}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [{"type": "text", "text": self.text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }

    def _chat_usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
        }

    # -- streamed replies: (event name or None, data) per SSE event ----------------------------------------

    def pieces(self, per_chunk: int) -> Iterator[str]:
        for start in range(0, len(self.words), per_chunk):
            prefix = "" if start == 0 else " "
            yield prefix + " ".join(self.words[start : start + per_chunk])

    def responses_events(self, per_chunk: int) -> Iterator[tuple[str | None, Any]]:
        created = self.responses_object("in_progress")
        created["output"] = []
        del created["usage"]
        yield "response.created", {"type": "response.created", "response": created}
        for piece in self.pieces(per_chunk):
            yield (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": f"msg_{self.id}",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": piece,
                },
            )
        yield "response.output_text.done", {"type": "response.output_text.done", "text": self.text}
        yield "response.completed", {"type": "response.completed", "response": self.responses_object()}

    def chat_events(self, per_chunk: int) -> Iterator[tuple[str | None, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": f"chatcmpl-{self.id}",
                "object": "chat.completion.chunk",
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        yield None, chunk({"role": "assistant", "content": ""})
        for piece in self.pieces(per_chunk):
            yield None, chunk({"content": piece})
        yield None, chunk({}, "stop")
        final = chunk({})
        final["choices"] = []
        final["usage"] = self._chat_usage()
        yield None, final
        yield None, "[DONE]"

    def messages_events(self, per_chunk: int) -> Iterator[tuple[str | None, Any]]:
        start = self.messages_object()
        start.update(content=[], stop_reason=None)
        start["usage"] = {"input_tokens": self.input_tokens, "output_tokens": 1}
        yield "message_start", {"type": "message_start", "message": start}
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        yield "content_block_start", block
        for piece in self.pieces(per_chunk):
            text = {"type": "text_delta", "text": piece}
            yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": text}
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": self.output_tokens},
            },
        )
        yield "message_stop", {"type": "message_stop"}


def _sse(event: str | None, data: Any) -> bytes:
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"


_Events = Callable[[_Reply, int], Iterator[tuple[str | None, Any]]]
_Whole = Callable[[_Reply], dict[str, Any]]
_DIALECTS: dict[str, tuple[_Whole, _Events]] = {
    RESPONSES_ROUTE: (_Reply.responses_object, _Reply.responses_events),
    CHAT_ROUTE: (_Reply.chat_object, _Reply.chat_events),
    MESSAGES_ROUTE: (_Reply.messages_object, _Reply.messages_events),
}


class ModelServer(HarnessServer):
    """Answers like a model API: one assistant message and usage counts, after ``latency``, JSON or SSE."""

    role: ClassVar = "model"
    sessions_enabled: ClassVar = False  # stateless: no session token per request
    settings_model: ClassVar = ModelSettings
    hooked_routes: ClassVar = frozenset(_DIALECTS)

    def setup_webserver(self) -> FastAPI:
        settings = self.settings
        assert isinstance(settings, ModelSettings)
        rng = random.Random(settings.seed)
        app = self.new_app()

        def add_route(route: str, whole: _Whole, events: _Events) -> None:
            async def generate(request: Request) -> Any:
                body = await request.json()
                await asyncio.sleep(settings.latency.sample(rng))
                raise_injected_fault()  # where a real model server's generation would fail
                reply = _Reply(self.server_name, body, settings.reply_words)
                streamed = settings.stream or (isinstance(body, dict) and body.get("stream") is True)
                if not streamed:
                    return JSONResponse(whole(reply))
                chunks = self._stream(events(reply, settings.stream_chunk_words))
                return StreamingResponse(chunks, media_type=EVENT_STREAM)

            app.add_api_route(route, generate, methods=["POST"])

        for route, (whole, events) in _DIALECTS.items():
            add_route(route, whole, events)
        return app

    async def _stream(self, events: Iterator[tuple[str | None, Any]]) -> AsyncIterator[bytes]:
        settings = self.settings
        assert isinstance(settings, ModelSettings)
        delay = settings.stream_token_delay_s
        for index, (event, data) in enumerate(events):
            if delay and index > 1:
                await asyncio.sleep(delay)
            yield _sse(event, data)
