"""A small OTLP/HTTP protobuf receiver for tests: what the launched servers really exported.

Runs an aiohttp server on its own thread and event loop, so a test that blocks (starting processes) never
stops it from answering exports. Spans keep their resource's ``service.name`` so a test can tell which
process emitted what.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gym_obs.telemetry import names

SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3


LAUNCH_ENV: dict[str, str] = {"OTEL_BSP_SCHEDULE_DELAY": "50", names.ENV_LOG_JSON: "1"}
"""Environment for launched test servers: spans exported within 50 ms, JSON log lines to assert on."""


def otlp_traces_telemetry(port: int) -> dict[str, Any]:
    """The ``telemetry`` section of a global config that sends spans to an ``OtlpReceiver`` on ``port``."""
    return {
        "enabled": True,
        "traces_exporter": "otlp",
        "metrics_exporter": "none",
        "otlp_endpoint": f"http://127.0.0.1:{port}",
        "otlp_protocol": "http/protobuf",
    }


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return None if which is None else getattr(value, which)


def _attributes(items: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(items)
    return {kv.key: _value(kv.value) for kv in pairs}


@dataclass
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str | None
    service_name: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status_code: int = 0  # 0 unset, 1 ok, 2 error (OTLP Status.StatusCode)
    status_message: str = ""
    start_ns: int = 0
    end_ns: int = 0


@dataclass
class ReceivedLog:
    body: str
    severity_text: str
    severity_number: int
    trace_id: str
    span_id: str
    scope: str
    service_name: str
    attributes: dict[str, Any]


class OtlpReceiver:
    """``with OtlpReceiver(port) as receiver:`` then ``receiver.wait_for(predicate)``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self._spans: list[ReceivedSpan] = []
        self._logs: list[ReceivedLog] = []
        self._metric_requests: list[ExportMetricsServiceRequest] = []
        self._trace_requests: list[ExportTraceServiceRequest] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> OtlpReceiver:
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True, name="otlp-receiver")
        self._thread.start()
        started.result(timeout=10)
        return self

    def __exit__(self, *_exc: object) -> None:
        loop = self._loop
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self._stop(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self, started: Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._start())
        except BaseException as error:
            started.set_exception(error)
            loop.close()
            return
        started.set_result(None)
        loop.run_forever()
        loop.close()

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        app.router.add_post("/v1/logs", self._logs_export)
        app.router.add_post("/v1/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- handlers --------------------------------------------------------------------------------------------

    @staticmethod
    async def _read(request: web.Request) -> bytes:
        body = await request.read()
        return gzip.decompress(body) if request.headers.get("Content-Encoding") == "gzip" else body

    async def _metrics(self, request: web.Request) -> web.Response:
        message = ExportMetricsServiceRequest.FromString(await self._read(request))
        with self._lock:
            self._metric_requests.append(message)
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def _traces(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        message = ExportTraceServiceRequest.FromString(body)
        received: list[ReceivedSpan] = []
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex() or None,
                            service_name=str(resource.get("service.name", "")),
                            attributes=_attributes(span.attributes),
                            resource=resource,
                            events=[(event.name, _attributes(event.attributes)) for event in span.events],
                            status_code=span.status.code,
                            status_message=span.status.message,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self._spans.extend(received)
            self._trace_requests.append(message)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def _logs_export(self, request: web.Request) -> web.Response:
        message = ExportLogsServiceRequest.FromString(await self._read(request))
        received: list[ReceivedLog] = []
        for resource_logs in message.resource_logs:
            resource = _attributes(resource_logs.resource.attributes)
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    received.append(
                        ReceivedLog(
                            body=str(_value(record.body)),
                            severity_text=record.severity_text,
                            severity_number=record.severity_number,
                            trace_id=record.trace_id.hex(),
                            span_id=record.span_id.hex(),
                            scope=scope_logs.scope.name,
                            service_name=str(resource.get("service.name", "")),
                            attributes=_attributes(record.attributes),
                        )
                    )
        with self._lock:
            self._logs.extend(received)
        return web.Response(
            body=ExportLogsServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    # -- queries ---------------------------------------------------------------------------------------------

    def metric_requests(self) -> list[ExportMetricsServiceRequest]:
        """Every metrics export request, in arrival order."""
        with self._lock:
            return list(self._metric_requests)

    def trace_requests(self) -> list[ExportTraceServiceRequest]:
        """Every trace export request as the official classes parsed it, in arrival order."""
        with self._lock:
            return list(self._trace_requests)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def logs(self) -> list[ReceivedLog]:
        with self._lock:
            return list(self._logs)

    def wait_for_logs(
        self, predicate: Callable[[list[ReceivedLog]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedLog]:
        """Poll until ``predicate(logs)`` holds; returns the log records, or fails with what arrived."""
        deadline = time.monotonic() + timeout_s
        while True:
            logs = self.logs()
            if predicate(logs):
                return logs
            if time.monotonic() > deadline:
                bodies = [record.body for record in logs]
                raise AssertionError(f"receiver did not get the expected logs in {timeout_s}s; got {bodies}")
            time.sleep(0.05)

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """Poll until ``predicate(spans)`` holds; returns the spans, or fails with what arrived."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                seen = [(s.service_name, s.name, s.kind, s.trace_id[:8]) for s in spans]
                raise AssertionError(f"receiver did not get the expected spans in {timeout_s}s; got {seen}")
            time.sleep(0.05)

    async def await_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """``wait_for`` without blocking the caller's event loop."""
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / 0.05) + 1):
            if predicate(self.spans()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        return self.wait_for(predicate, timeout_s=0)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.spans() if span.trace_id == trace_id]
