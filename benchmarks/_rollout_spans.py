"""Spans shaped like a harness rollout's, for the encoding benchmarks (not a benchmark itself).

One rollout of ``gym-obs harness run`` ends 16 spans (counted from a run's telemetry files): the driver's
CLIENT ``POST /run`` and ``gym.harness.rollout``; the agent's SERVER ``POST /run``, its ``gym.rollout``
span and six CLIENT spans (five model calls, one verify); five model SERVER spans with the GenAI
attributes (19 attributes each); the resources server's SERVER ``POST /verify``. Attribute values are
the ones a run writes, ids unique per rollout.
"""

from __future__ import annotations

import uuid
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

RESOURCE = Resource.create(
    {"service.name": "gym/agent_0", "gym.server.name": "agent_0", "gym.run.id": "bench"}
)


def _server(route: str, port: int, rollout: str) -> dict[str, Any]:
    return {
        "url.path": route,
        "url.scheme": "http",
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": port,
        "network.protocol.version": "1.1",
        "client.address": "127.0.0.1",
        "user_agent.original": "Python/3.11 aiohttp/3.14.5",
        "http.route": route,
        "http.response.status_code": 200,
        "gym.rollout.id": rollout,
    }


def _client(route: str, port: int, server: str, rollout: str) -> dict[str, Any]:
    return {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "gym.server.name": server,
        "server.port": port,
        "url.full": f"http://127.0.0.1:{port}{route}",
        "gym.rollout.id": rollout,
        "http.response.status_code": 200,
    }


def rollout_spans(count: int) -> list[ReadableSpan]:
    """``count`` spans (whole rollouts of 16, the last one cut), ended by the SDK as in a real run."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("gym_obs", "1.45.1")
    for index in range(count // 16 + 1):
        rollout = f"d6d98061695f-{index:06d}"
        with tracer.start_as_current_span("gym.harness.rollout") as root:
            root.set_attributes({"gym.rollout.id": rollout, "gym.rollout.outcome": "completed"})
            with (
                tracer.start_as_current_span(
                    "POST /run", kind=SpanKind.CLIENT, attributes=_client("/run", 8001, "agent_0", rollout)
                ),
                tracer.start_as_current_span(
                    "POST /run", kind=SpanKind.SERVER, attributes=_server("/run", 8001, rollout)
                ),
                tracer.start_as_current_span("gym.rollout") as span,
            ):
                span.set_attributes(
                    {
                        "gym.rollout.id": rollout,
                        "gym.rollout.outcome": "completed",
                        "gym.rollout.input_tokens": 180,
                        "gym.rollout.output_tokens": 60,
                        "gym.rollout.model_calls": 5,
                    }
                )
                for _ in range(5):
                    _model_call(tracer, rollout)
                with tracer.start_as_current_span(
                    "POST /verify",
                    kind=SpanKind.CLIENT,
                    attributes=_client("/verify", 8003, "resources_0", rollout),
                ):
                    attributes = {"gym.session.id": rollout, **_server("/verify", 8003, rollout)}
                    with tracer.start_as_current_span(
                        "POST /verify", kind=SpanKind.SERVER, attributes=attributes
                    ):
                        pass
    provider.shutdown()
    return list(memory.get_finished_spans())[:count]


def _model_call(tracer: Any, rollout: str) -> None:
    with tracer.start_as_current_span(
        "POST /v1/responses",
        kind=SpanKind.CLIENT,
        attributes=_client("/v1/responses", 8002, "model_0", rollout),
    ):
        attributes = {
            "gen_ai.operation.name": "responses",
            "gym.gen_ai.outcome": "ok",
            "gym.gen_ai.streamed": False,
            "gen_ai.response.model": "model_0",
            "gen_ai.response.id": f"resp_{uuid.uuid4().hex}",
            "gen_ai.usage.input_tokens": 61,
            "gen_ai.usage.output_tokens": 12,
            "gen_ai.response.finish_reasons": ("stop",),
            **_server("/v1/responses", 8002, rollout),
        }
        with tracer.start_as_current_span("POST /v1/responses", kind=SpanKind.SERVER, attributes=attributes):
            pass
