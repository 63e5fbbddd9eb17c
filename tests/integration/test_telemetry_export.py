"""setup_telemetry exports real OTLP to a real receiver on loopback (http/protobuf and gRPC).

The exporting side runs in a subprocess (global providers are per process); the receiver runs in the test's
event loop and records what actually arrived. Assertions are on the received protobufs, not flush results.
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

import gym_obs
from gym_obs.telemetry import names

pytestmark = pytest.mark.integration

HTTP_PORT = 20020
GRPC_PORT = 20021
_SRC = str(Path(gym_obs.__file__).resolve().parents[1])

_EMIT = """
    from gym_obs.telemetry import names
    from gym_obs.telemetry.setup import setup_telemetry
    from gym_obs.telemetry.spans import client_span
    from gym_obs.telemetry.testing import telemetry_state
    STATE = telemetry_state()
    handle = setup_telemetry("model", "model_server")
    with client_span("GET", **{names.ATTR_URL_FULL: "http://user:pw@upstream:9/v1/x?api_key=QUERYSECRET"}):
        STATE.instruments.client_retries.add(2, {names.ATTR_RETRY_REASON: names.RETRY_REASON_TIMEOUT})
        STATE.instruments.client_request_duration.record(0.3, {names.ATTR_SERVER_NAME: "model"})
    print("SHUTDOWN", handle.shutdown(timeout_s=10.0), flush=True)
"""


@dataclass
class Received:
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)


def _attrs(values: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for kv in values:
        assert isinstance(kv, KeyValue)
        which = kv.value.WhichOneof("value")
        result[kv.key] = getattr(kv.value, which) if which else None
    return result


async def _run_emitter(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    clean["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, clean.get("PYTHONPATH")) if p)
    clean.update(env)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        textwrap.dedent(_EMIT),
        env=clean,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, stderr.decode()
    return stdout.decode() + stderr.decode()


@pytest.fixture
async def http_receiver() -> AsyncIterator[Received]:
    received = Received()

    async def traces(request: web.Request) -> web.Response:
        received.traces.append(ExportTraceServiceRequest.FromString(await request.read()))
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def metrics(request: web.Request) -> web.Response:
        received.metrics.append(ExportMetricsServiceRequest.FromString(await request.read()))
        body = ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    app.router.add_post("/v1/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", HTTP_PORT)
    await site.start()
    try:
        yield received
    finally:
        await runner.cleanup()


def _assert_span_and_resource(request: ExportTraceServiceRequest, run_id: str) -> None:
    (resource_spans,) = request.resource_spans
    resource = _attrs(resource_spans.resource.attributes)
    assert resource[names.SERVICE_NAME] == "gym/model"
    assert resource[names.ATTR_SERVER_NAME] == "model"
    assert resource[names.ATTR_SERVER_TYPE] == "model_server"
    assert resource[names.ATTR_RUN_ID] == run_id
    assert len(resource[names.SERVICE_INSTANCE_ID]) == 36
    spans = [span for scope in resource_spans.scope_spans for span in scope.spans]
    (span,) = spans
    assert span.name == "GET"
    assert span.kind == span.SPAN_KIND_CLIENT
    assert _attrs(span.attributes)[names.ATTR_URL_FULL] == "http://REDACTED:REDACTED@upstream:9/v1/x"


async def test_otlp_http_export_reaches_the_receiver_with_the_resource(http_receiver: Received) -> None:
    output = await _run_emitter(
        {
            "GYM_OBS_TELEMETRY": "1",
            "GYM_OBS_RUN_ID": "run-http",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{HTTP_PORT}",
        }
    )
    assert "SHUTDOWN True" in output
    assert len(http_receiver.traces) == 1
    _assert_span_and_resource(http_receiver.traces[0], "run-http")
    assert b"QUERYSECRET" not in http_receiver.traces[0].SerializeToString()

    metrics = {
        metric.name: metric
        for request in http_receiver.metrics
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    retries = metrics[names.METRIC_CLIENT_RETRIES]
    assert retries.unit == names.UNIT_RETRY
    assert retries.sum.data_points[0].as_int == 2
    assert _attrs(retries.sum.data_points[0].attributes) == {
        names.ATTR_RETRY_REASON: names.RETRY_REASON_TIMEOUT
    }
    duration = metrics[names.METRIC_HTTP_CLIENT_REQUEST_DURATION]
    assert duration.unit == names.UNIT_SECONDS
    assert tuple(duration.histogram.data_points[0].explicit_bounds) == names.HTTP_DURATION_BUCKETS_S
    resource = _attrs(http_receiver.metrics[0].resource_metrics[0].resource.attributes)
    assert resource[names.SERVICE_NAME] == "gym/model"


async def test_export_failures_are_logged_once_and_recovery_is_reported(http_receiver: Received) -> None:
    # A 404 on every request: the exporter gives up, the program does not notice.
    output = await _run_emitter(
        {
            "GYM_OBS_TELEMETRY": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{HTTP_PORT}/wrong-prefix",
            "OTEL_METRICS_EXPORTER": "none",
        }
    )
    assert http_receiver.traces == []
    assert output.count("span export to http://127.0.0.1:20020/wrong-prefix/v1/traces failed") == 1
    assert "Traceback" not in output


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    async def Export(  # gRPC method name
        self, request: ExportTraceServiceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ExportTraceServiceResponse:
        self.received.traces.append(request)
        return ExportTraceServiceResponse()


async def test_otlp_grpc_export_reaches_the_receiver() -> None:
    received = Received()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(received), server)
    server.add_insecure_port(f"127.0.0.1:{GRPC_PORT}")
    await server.start()
    try:
        output = await _run_emitter(
            {
                "GYM_OBS_TELEMETRY": "1",
                "GYM_OBS_RUN_ID": "run-grpc",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{GRPC_PORT}",
                "OTEL_METRICS_EXPORTER": "none",
            }
        )
    finally:
        await server.stop(grace=None)
    assert "SHUTDOWN True" in output
    assert len(received.traces) == 1
    _assert_span_and_resource(received.traces[0], "run-grpc")
