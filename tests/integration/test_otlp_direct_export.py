"""gym's OTLP span exporters (direct protobuf encoding) against real receivers: what arrives is, message
for message, what the official encoder would have sent, over http/protobuf and gRPC.

The receivers parse each request with the official ``opentelemetry.proto`` classes; the test compares
that with ``encode_spans`` of the same spans, and checks the direct path carried the batch (a later SDK
whose exporter internals moved would fall back to the official path silently; this catches it).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from gym_obs.telemetry._exporters import otlp_span_exporter
from gym_obs.telemetry.settings import OtlpTarget
from tests.integration.otlp_receiver import OtlpReceiver

HTTP_PORT = 30740  # this file's ports (export13's range 30700-30799)
GRPC_PORT = 30741


def _spans() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "gym/agent_0", "gym.run.id": "r"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("gym_obs", "1.0")
    other = SpanContext(trace_id=7, span_id=8, is_remote=True)
    for index in range(40):
        with tracer.start_as_current_span("POST /run", kind=SpanKind.SERVER) as server:
            server.set_attributes({"http.request.method": "POST", "server.port": 8000, "i": index})
            with tracer.start_as_current_span(
                "POST", kind=SpanKind.CLIENT, links=[Link(other, {"k": 0.5})]
            ) as client:
                client.set_attributes({"url.full": "http://127.0.0.1:9/v1/responses", "ok": True})
                client.add_event("gym.http.attempt_failed", {"gym.attempt": 1, "tags": ("a", "b")})
                client.set_status(Status(StatusCode.ERROR, "timeout"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def _same(received: list[ExportTraceServiceRequest], spans: list[ReadableSpan]) -> None:
    assert len(received) == 1
    assert received[0] == encode_spans(spans)
    assert len(received[0].resource_spans[0].scope_spans[0].spans) == len(spans)


def test_http_protobuf_export_arrives_as_the_official_encoder_would_send_it() -> None:
    spans = _spans()
    with OtlpReceiver(HTTP_PORT) as receiver:
        exporter = otlp_span_exporter(
            OtlpTarget(protocol="http/protobuf", endpoint=f"{receiver.endpoint}/v1/traces"), 5.0
        )
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert getattr(exporter, "direct_batches", 0) == 1  # the direct path carried it
        receiver.wait_for(lambda got: len(got) == len(spans))
        _same(receiver.trace_requests(), spans)
        exporter.shutdown()


def test_a_batch_the_direct_encoder_refuses_takes_the_official_path() -> None:
    """A span name that is not UTF-8 fails the batch, as the official exporter fails it; the next batch
    goes through the direct path again."""
    spans = _spans()
    bad = ReadableSpan(name="\ud800", context=SpanContext(1, 2, False), resource=spans[0].resource)
    with OtlpReceiver(HTTP_PORT) as receiver:
        exporter = otlp_span_exporter(
            OtlpTarget(protocol="http/protobuf", endpoint=f"{receiver.endpoint}/v1/traces"), 5.0
        )
        assert exporter.export([bad]) is SpanExportResult.FAILURE
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert getattr(exporter, "direct_batches", 0) == 1
        receiver.wait_for(lambda got: len(got) == len(spans))
        _same(receiver.trace_requests(), spans)
        exporter.shutdown()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    def Export(  # gRPC method name
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        self.requests.append(request)
        return ExportTraceServiceResponse()


@pytest.fixture
def grpc_service() -> Iterator[_TraceService]:
    service = _TraceService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    server.add_insecure_port(f"127.0.0.1:{GRPC_PORT}")
    server.start()
    yield service
    server.stop(grace=None)


def test_grpc_export_arrives_as_the_official_encoder_would_send_it(grpc_service: _TraceService) -> None:
    spans = _spans()
    exporter = otlp_span_exporter(OtlpTarget(protocol="grpc", endpoint=f"http://127.0.0.1:{GRPC_PORT}"), 5.0)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert getattr(exporter, "direct_batches", 0) == 1
    _same(grpc_service.requests, spans)
    exporter.shutdown()
