"""Log records over OTLP: the structured log lines, through the OTel logs SDK, to the traces' backend.

A trace's log lines belong next to it. Every record the stderr pipeline renders (structlog's or a library's
``logging`` call) is also handed to a :class:`OtlpLogHandler`, which runs the SAME processors as the
rendered lines (ids added, secrets scrubbed, tracebacks without locals) and emits the result as an OTel log
record: body = the event, attributes = the other fields, trace and span ids from the current span (so the
backend links the line to its span). Export is the SDK's batch processor: a bounded queue, a background
thread, records dropped (not waited for) when the queue is full.

Two loops are cut here: records of the ``opentelemetry`` loggers and records logged while a log batch is
being exported (an exporter complaining about its own failure) are never exported, only rendered.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import structlog
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.resources import Resource

from gym_obs.telemetry import names
from gym_obs.telemetry.logging import scrub_event, shared_processors
from gym_obs.telemetry.settings import OtlpTarget, Settings

__all__ = [
    "OtlpLogHandler",
    "SafeLogExporter",
    "install_log_export",
    "record_attributes",
    "start_log_export",
    "uninstall_log_export",
]

_LOG: Final = logging.getLogger("gym_obs.telemetry")
_HANDLER_MARK: Final = "_gym_obs_otlp_logs"
_MAX_QUEUE: Final = 2048
_MAX_BATCH: Final = 512
_MAX_ATTRIBUTE_CHARS: Final = 4096
_MAX_LOGGERS: Final = 256

# Fields the record itself carries (body, severity, time, trace context) and never repeats as attributes.
_RECORD_FIELDS: Final = frozenset(
    {"event", "level", "timestamp", "trace_id", "span_id", "_record", "_from_structlog"}
)
# gym's own id fields, under their registry names.
_RENAMED: Final = {
    "rollout_id": names.ATTR_ROLLOUT_ID,
    "server_name": names.ATTR_SERVER_NAME,
    "logger": "code.namespace",
    "exception": "exception.stacktrace",
}

_SEVERITY: Final = (
    (logging.CRITICAL, SeverityNumber.FATAL),
    (logging.ERROR, SeverityNumber.ERROR),
    (logging.WARNING, SeverityNumber.WARN),
    (logging.INFO, SeverityNumber.INFO),
    (logging.DEBUG, SeverityNumber.DEBUG),
)

_exporting = threading.local()


def _severity(levelno: int) -> SeverityNumber:
    for floor, number in _SEVERITY:
        if levelno >= floor:
            return number
    return SeverityNumber.TRACE


def _attribute(value: Any) -> Any:
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value[:_MAX_ATTRIBUTE_CHARS]
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except Exception:
        text = repr(value)
    return text[:_MAX_ATTRIBUTE_CHARS]


def record_attributes(event: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a processed event dict as OTel log attributes (bounded, ids under registry names)."""
    attributes: dict[str, Any] = {}
    for key, value in event.items():
        if key in _RECORD_FIELDS or value is None:
            continue
        attributes[_RENAMED.get(key, key)] = _attribute(value)
    return attributes


_processed = threading.local()


def _keep_dict(_logger: Any, _method: str, event: Any) -> str:
    """The last processor: keep the processed event dict for ``_DictFormatter`` (which must return a str)."""
    _processed.event = event
    return ""


class _DictFormatter(structlog.stdlib.ProcessorFormatter):
    """The stderr pipeline's processors, ending in a dict instead of a rendered line."""

    def __init__(self) -> None:
        tracebacks = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
        super().__init__(
            foreign_pre_chain=shared_processors(),
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                tracebacks,
                scrub_event,
                _keep_dict,
            ],
        )

    def event_dict(self, record: logging.LogRecord) -> dict[str, Any]:
        _processed.event = None
        self.format(record)
        event = _processed.event
        _processed.event = None
        return event if isinstance(event, dict) else {"event": record.getMessage()}


class OtlpLogHandler(logging.Handler):
    """A root-logger handler that emits each record, processed like the rendered lines, as an OTel record."""

    def __init__(self, provider: LoggerProvider) -> None:
        super().__init__()
        self._provider = provider
        self._formatter = _DictFormatter()
        self._loggers: dict[str, Any] = {}
        setattr(self, _HANDLER_MARK, True)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("opentelemetry") or getattr(_exporting, "active", False):
            return
        try:
            event = self._formatter.event_dict(record)
            body = event.get("event")
            self._logger(record.name).emit(
                LogRecord(
                    timestamp=int(record.created * 1e9),
                    severity_text=record.levelname,
                    severity_number=_severity(record.levelno),
                    body=None if body is None else str(body),
                    attributes=record_attributes(event),
                )
            )
        except Exception:  # telemetry never stops the program, and never logs about itself here
            return

    def _logger(self, name: str) -> Any:
        logger = self._loggers.get(name)
        if logger is None:
            if len(self._loggers) >= _MAX_LOGGERS:
                name = "other"
            logger = self._loggers.get(name) or self._provider.get_logger(name)
            self._loggers[name] = logger
        return logger


class SafeLogExporter(LogRecordExporter):
    """A log exporter that never raises, logs failures once per outage, and is never exported into."""

    def __init__(self, inner: LogRecordExporter, what: str = "otlp logs export") -> None:
        self._inner = inner
        self._what = what
        self._failing = False

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        _exporting.active = True
        try:
            try:
                ok = self._inner.export(batch) is LogRecordExportResult.SUCCESS
                reason = f"{len(batch)} log records not accepted"
            except Exception as exc:
                ok, reason = False, type(exc).__name__
            if ok and self._failing:
                self._failing = False
                _LOG.info("%s recovered", self._what)
            elif not ok and not self._failing:
                self._failing = True
                _LOG.warning(
                    "%s failed: %s; further failures are not logged until it recovers", self._what, reason
                )
        finally:
            _exporting.active = False
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def shutdown(self) -> None:
        try:
            self._inner.shutdown()  # type: ignore[no-untyped-call]
        except Exception:
            return

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        try:
            return bool(self._inner.force_flush(timeout_millis))
        except Exception:
            return False


def install_log_export(
    exporter: LogRecordExporter | Sequence[LogRecordExporter],
    resource: Resource,
    *,
    schedule_delay_ms: int = 1000,
) -> LoggerProvider:
    """Send every log record of this process to ``exporter`` (or each of several, each with its own bounded
    queue); replaces a handler installed before.

    Returns the provider; ``uninstall_log_export(provider)`` flushes and removes it.
    """
    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    exporters = [exporter] if isinstance(exporter, LogRecordExporter) else list(exporter)
    for index, one in enumerate(exporters):
        provider.add_log_record_processor(
            BatchLogRecordProcessor(
                SafeLogExporter(one, what=f"log export {index + 1} of {len(exporters)}")
                if len(exporters) > 1
                else SafeLogExporter(one),
                schedule_delay_millis=schedule_delay_ms,
                max_queue_size=_MAX_QUEUE,
                max_export_batch_size=_MAX_BATCH,
            )
        )
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(OtlpLogHandler(provider))
    return provider


def uninstall_log_export(provider: LoggerProvider | None = None) -> None:
    """Remove the OTLP log handler and flush and shut down its provider."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        owned = getattr(old, "_provider", None)
        if owned is not None and owned is not provider:
            _shutdown(owned)
    if provider is not None:
        _shutdown(provider)


def start_log_export(
    settings: Settings, resource: Resource, timeout_s: float, problems: list[str]
) -> Callable[[], None] | None:
    """The log export ``settings`` ask for (``OTEL_LOGS_EXPORTER`` / ``logs_exporter``), installed; returns
    the function that flushes and removes it, or None when no log export is wanted or possible."""
    exporters: list[LogRecordExporter] = []
    for name in settings.logs_exporters:
        try:
            if name == "otlp" and settings.otlp_logs is not None:
                exporters.append(_otlp_log_exporter(settings.otlp_logs, timeout_s))
            elif name == "file":
                from gym_obs.telemetry.file_export import file_log_exporter  # imported only when chosen

                label = str(resource.attributes.get(names.SERVICE_NAME, "gym"))
                exporters.append(file_log_exporter(settings.file_export_dir, label))
        except Exception as exc:
            problems.append(f"cannot set up {name} log export ({type(exc).__name__}); logs stay on stderr")
    if not exporters:
        return None
    provider = install_log_export(exporters, resource)
    return lambda: uninstall_log_export(provider)


def _otlp_log_exporter(target: OtlpTarget, timeout_s: float) -> LogRecordExporter:
    if target.protocol == "grpc":  # heavy import, only when chosen
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

        return GrpcLogExporter(
            endpoint=target.endpoint, insecure=target.endpoint.startswith("http://"), timeout=timeout_s
        )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter

    return HttpLogExporter(endpoint=target.endpoint, timeout=timeout_s)


def _shutdown(provider: LoggerProvider) -> None:
    try:
        provider.force_flush()
        provider.shutdown()
    except Exception:
        return
