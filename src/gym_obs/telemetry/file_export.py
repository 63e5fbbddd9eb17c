"""OTLP JSON-lines exporters that write spans and metrics to local files.

Why: a first run (the harness's embedded default) must show real telemetry without a collector or Docker.
The files use the OpenTelemetry Collector file exporter's format -- one ``ExportTraceServiceRequest`` /
``ExportMetricsServiceRequest`` per line as OTLP/JSON (lowerCamelCase keys, integer enums, hex trace and
span ids) -- so any OTLP/JSON tool reads them, and a collector's ``otlpjsonfile`` receiver can replay them.

Lines are built directly from the SDK's objects (:mod:`gym_obs.telemetry._otlp_json`, ~8x cheaper than the
official protobuf encoders plus ``MessageToDict``), on the thread the SDK exports from (the batch span
processor's, the metric reader's), never on the request path. A batch the direct encoder cannot write (a
string that is not valid UTF-8, say) is written by the official encoders instead, which skip what they
cannot encode.

Rules of the house apply: writes are serialised by a lock (the SDK calls exporters from background threads),
files are bounded (past ``max_bytes`` batches are dropped and counted), and nothing here ever raises into the
SDK: a failure is logged once per exporter and reported as a failed export.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Final

import orjson
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gym_obs.telemetry._otlp_json import metrics_json_line, spans_json_line

_LOG = logging.getLogger(__name__)

#: Default bound of one file; a long run keeps its first ``DEFAULT_MAX_BYTES`` of telemetry.
DEFAULT_MAX_BYTES: Final = 512 * 1024 * 1024
TRACES_SUFFIX: Final = ".traces.jsonl"
METRICS_SUFFIX: Final = ".metrics.jsonl"
LOGS_SUFFIX: Final = ".logs.jsonl"

_ID_KEYS: Final = frozenset({"traceId", "spanId", "parentSpanId"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _hex_ids(items: list[dict[str, Any]]) -> None:
    """OTLP/JSON writes trace and span ids as hex, where proto3 JSON would write base64."""
    for item in items:
        for key in _ID_KEYS.intersection(item):
            item[key] = base64.b64decode(item[key]).hex()


def _fix_trace_ids(doc: dict[str, Any]) -> None:
    for resource_spans in doc.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            spans = scope_spans.get("spans", ())
            _hex_ids(spans)
            for span in spans:
                _hex_ids(span.get("links", ()))


def _fix_metric_ids(doc: dict[str, Any]) -> None:
    for resource_metrics in doc.get("resourceMetrics", ()):
        for scope_metrics in resource_metrics.get("scopeMetrics", ()):
            for metric in scope_metrics.get("metrics", ()):
                for data in metric.values():
                    if isinstance(data, dict):
                        for point in data.get("dataPoints", ()):
                            _hex_ids(point.get("exemplars", ()))


def _fix_log_ids(doc: dict[str, Any]) -> None:
    for resource_logs in doc.get("resourceLogs", ()):
        for scope_logs in resource_logs.get("scopeLogs", ()):
            _hex_ids(scope_logs.get("logRecords", ()))


def otlp_json_line(message: Message) -> bytes:
    """One OTLP/JSON line (newline included) for an export request, as the collector file exporter writes:
    the official encoders' path (protobuf -> ``MessageToDict``), the fallback and the reference of the direct
    encoder."""
    doc = MessageToDict(message, use_integers_for_enums=True)
    if "resourceSpans" in doc:
        _fix_trace_ids(doc)
    elif "resourceMetrics" in doc:
        _fix_metric_ids(doc)
    elif "resourceLogs" in doc:
        _fix_log_ids(doc)
    return orjson.dumps(doc) + b"\n"


def encode_spans_line(spans: Sequence[ReadableSpan]) -> bytes:
    """The line for a batch of spans: built directly, else by the official encoders."""
    try:
        return spans_json_line(spans)
    except Exception:
        return otlp_json_line(encode_spans(spans))


def encode_metrics_line(metrics_data: MetricsData) -> bytes:
    """The line for one metrics collection: built directly, else by the official encoders."""
    try:
        return metrics_json_line(metrics_data)
    except Exception:
        return otlp_json_line(encode_metrics(metrics_data))


def export_file_stem(service_label: str, pid: int | None = None) -> str:
    """A filesystem-safe, per-process file stem: two processes never append to the same file."""
    safe = _UNSAFE.sub("_", service_label).strip("_.") or "gym"
    return f"{safe}-{os.getpid() if pid is None else pid}"


class _JsonLinesFile:
    """A lazily opened, lock-protected, size-bounded append-only file."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._written = 0
        self._closed = False
        self._warned: set[str] = set()
        self.dropped_batches = 0

    def warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _LOG.warning(message, *args)

    def write(self, line: bytes) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._written + len(line) > self._max_bytes:
                self.dropped_batches += 1
                self.warn_once(
                    "full",
                    "telemetry file %s reached its bound of %d bytes; further batches are dropped",
                    self.path,
                    self._max_bytes,
                )
                return False
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("ab")
                self._written = self._file.tell()
            self._file.write(line)
            self._file.flush()
            self._written += len(line)
            return True

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None


    def export(self, what: str, encode: Callable[[], bytes | None]) -> bool:
        """Write the line ``encode`` builds (``None``: nothing to write); never raises into the SDK (a
        failure, bad input included, is warned once and is False)."""
        try:
            line = encode()
            return True if line is None else self.write(line)
        except Exception as exc:
            self.warn_once("error", "%s export to %s failed: %r", what, self.path, exc)
            return False

    def flush_quietly(self) -> bool:
        try:
            self.flush()
        except Exception:
            return False
        return True

    def close_quietly(self) -> None:
        try:
            self.close()
        except Exception as exc:
            self.warn_once("close", "closing %s failed: %r", self.path, exc)


class OtlpJsonFileSpanExporter(SpanExporter):
    """Writes each batch of spans as one ``ExportTraceServiceRequest`` JSON line."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._file = _JsonLinesFile(Path(path), max_bytes)

    @property
    def path(self) -> Path:
        return self._file.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._file.export("span", lambda: encode_spans_line(spans) if spans else None):
            return SpanExportResult.SUCCESS
        return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._file.flush_quietly()

    def shutdown(self) -> None:
        self._file.close_quietly()


class OtlpJsonFileMetricExporter(MetricExporter):
    """Writes each metrics collection as one ``ExportMetricsServiceRequest`` JSON line (cumulative)."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        self._file = _JsonLinesFile(Path(path), max_bytes)

    @property
    def path(self) -> Path:
        return self._file.path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        def line() -> bytes | None:
            return encode_metrics_line(metrics_data) if metrics_data.resource_metrics else None

        if self._file.export("metric", line):
            return MetricExportResult.SUCCESS
        return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._file.flush_quietly()

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._file.close_quietly()


class OtlpJsonFileLogExporter(LogRecordExporter):
    """Writes each batch of log records as one ``ExportLogsServiceRequest`` JSON line.

    Log records are few next to spans, so they take the official encoders' path (``otlp_json_line``)."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._file = _JsonLinesFile(Path(path), max_bytes)

    @property
    def path(self) -> Path:
        return self._file.path

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        if self._file.export("log", lambda: otlp_json_line(encode_logs(batch)) if batch else None):
            return LogRecordExportResult.SUCCESS
        return LogRecordExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._file.flush_quietly()

    def shutdown(self) -> None:
        self._file.close_quietly()


def file_span_exporter(
    directory: str | os.PathLike[str], service_label: str, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> OtlpJsonFileSpanExporter:
    """The span exporter for one process: ``<directory>/<service>-<pid>.traces.jsonl``."""
    return OtlpJsonFileSpanExporter(
        Path(directory) / (export_file_stem(service_label) + TRACES_SUFFIX), max_bytes=max_bytes
    )


def file_metric_exporter(
    directory: str | os.PathLike[str], service_label: str, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> OtlpJsonFileMetricExporter:
    """The metric exporter for one process: ``<directory>/<service>-<pid>.metrics.jsonl``."""
    return OtlpJsonFileMetricExporter(
        Path(directory) / (export_file_stem(service_label) + METRICS_SUFFIX), max_bytes=max_bytes
    )


def file_log_exporter(
    directory: str | os.PathLike[str], service_label: str, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> OtlpJsonFileLogExporter:
    """The log exporter for one process: ``<directory>/<service>-<pid>.logs.jsonl``."""
    return OtlpJsonFileLogExporter(
        Path(directory) / (export_file_stem(service_label) + LOGS_SUFFIX), max_bytes=max_bytes
    )
