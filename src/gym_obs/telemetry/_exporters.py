"""Exporter construction and the wrappers that keep export failures from ever reaching the program.

The SDK already runs exporters off the request path (batch processor, periodic reader), but a dead collector
makes every batch log a warning and a traceback. Each exporter is wrapped so that failures are logged once
per outage on ``gym_obs.telemetry`` (and again only after a recovery), exceptions are swallowed, and the
SDK's own per-batch failure messages are deduplicated.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult

from gym_obs.telemetry.redaction import redact_url, scrub_text
from gym_obs.telemetry.settings import OtlpTarget

LOGGER: Final = logging.getLogger("gym_obs.telemetry")

# SDK/exporter loggers that log one line (often with a traceback) per failed batch.
_NOISY_LOGGERS: Final = (
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
)


class _SdkExportLines(logging.Filter):
    """The SDK's own export lines (``Transient error ... retrying in 0.84s``, ``Failed to export spans batch
    ...``) are collapsed into gym_obs's one line per signal: while a gym wrapper exports on this thread they
    are captured, not logged, and the wrapper's line names the first one as the reason. Outside an export
    (configuration warnings), each distinct message template passes once."""

    _MAX_CAPTURED: Final = 4

    def __init__(self) -> None:
        super().__init__("gym_obs.sdk_export_lines")
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._local = threading.local()

    @contextlib.contextmanager
    def capturing(self) -> Iterator[list[str]]:
        captured: list[str] = []
        previous = getattr(self._local, "captured", None)
        self._local.captured = captured
        try:
            yield captured
        finally:
            self._local.captured = previous

    def filter(self, record: logging.LogRecord) -> bool:
        captured: list[str] | None = getattr(self._local, "captured", None)
        if captured is not None:
            if len(captured) < self._MAX_CAPTURED:
                with contextlib.suppress(Exception):
                    captured.append(record.getMessage())
            return False
        key = (record.name, str(record.msg))
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        return True


_SDK_LINES: Final = _SdkExportLines()


def quiet_sdk_loggers() -> None:
    """Collapse the SDK's per-batch export failure messages into gym_obs's own line (idempotent)."""
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _SDK_LINES not in logger.filters:
            logger.addFilter(_SDK_LINES)


# The SDK's framing around the cause, in the lines it logs per failed batch (opentelemetry-exporter-otlp).
_SDK_FRAMING: Final = (
    re.compile(r"^Transient error (?P<why>.+) encountered while exporting \w+ batch", re.DOTALL),
    re.compile(r"^Failed to export \w+ batch code: (?P<why>.+)$", re.DOTALL),
)


def _reason(fallback: str, captured: list[str]) -> str:
    """The SDK's first line says why (``Connection refused``, ``code: 503``), without its framing; else the
    wrapper's own reason. Never empty."""
    for line in captured:
        text = line.strip()
        for framing in _SDK_FRAMING:
            if (match := framing.match(text)) is not None:
                text = match.group("why").strip()
                break
        if text and text not in ("[]", "None"):
            return text
    return fallback


class _FailureLog:
    """Logs the first failure of an outage and the recovery after it; nothing in between."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._failing = False
        self._lock = threading.Lock()

    def failed(self, reason: str) -> None:
        with self._lock:
            if self._failing:
                return
            self._failing = True
        LOGGER.warning(
            "%s failed (%s); telemetry is dropped until it recovers, the program continues",
            self._what,
            scrub_text(reason)[:300],
        )

    def succeeded(self) -> None:
        with self._lock:
            if not self._failing:
                return
            self._failing = False
        LOGGER.info("%s recovered", self._what)


class SafeSpanExporter(SpanExporter):
    """A span exporter that never raises and logs failures once per outage."""

    def __init__(self, inner: SpanExporter, what: str) -> None:
        self._inner = inner
        self._log = _FailureLog(what)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with _SDK_LINES.capturing() as captured:
            try:
                result = self._inner.export(spans)
            except Exception as exc:
                self._log.failed(_reason(repr(exc), captured))
                return SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._log.succeeded()
        else:
            self._log.failed(_reason(f"{len(spans)} spans not accepted", captured))
        return result

    def shutdown(self) -> None:
        try:
            self._inner.shutdown()
        except Exception as exc:
            self._log.failed(f"shutdown: {exc!r}")

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        try:
            return bool(self._inner.force_flush(timeout_millis))
        except Exception:
            return False


class SafeMetricExporter(MetricExporter):
    """A metric exporter that never raises and logs failures once per outage."""

    def __init__(self, inner: MetricExporter, what: str) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._log = _FailureLog(what)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        with _SDK_LINES.capturing() as captured:
            try:
                result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception as exc:
                self._log.failed(_reason(repr(exc), captured))
                return MetricExportResult.FAILURE
        if result is MetricExportResult.SUCCESS:
            self._log.succeeded()
        else:
            self._log.failed(_reason("metrics not accepted", captured))
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        try:
            return bool(self._inner.force_flush(timeout_millis=timeout_millis))
        except Exception:
            return False

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        try:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:
            self._log.failed(f"shutdown: {exc!r}")


def otlp_span_exporter(target: OtlpTarget, timeout_s: float) -> SpanExporter:
    """An OTLP span exporter whose batches gym_obs's direct protobuf encoder writes (``_otlp_proto``: ~8x
    cheaper than the SDK's encoder on the batch processor's thread). gRPC is imported only when chosen."""
    if target.protocol == "grpc":
        from gym_obs.telemetry._otlp_grpc import DirectOtlpGrpcSpanExporter

        return DirectOtlpGrpcSpanExporter(
            endpoint=target.endpoint, insecure=target.endpoint.startswith("http://"), timeout=timeout_s
        )
    from gym_obs.telemetry._otlp_http import DirectOtlpHttpSpanExporter

    return DirectOtlpHttpSpanExporter(endpoint=target.endpoint, timeout=timeout_s)


def otlp_metric_exporter(target: OtlpTarget, timeout_s: float) -> MetricExporter:
    """An OTLP metric exporter with cumulative temporality (what Prometheus-style backends expect)."""
    if target.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter(
            endpoint=target.endpoint, insecure=target.endpoint.startswith("http://"), timeout=timeout_s
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter(endpoint=target.endpoint, timeout=timeout_s)


_Exporter = TypeVar("_Exporter", SpanExporter, MetricExporter)


@dataclass(frozen=True)
class _Signal(Generic[_Exporter]):
    """What differs between building span and metric exporters; everything else is shared."""

    name: str
    file: Callable[[str, str], tuple[str, _Exporter]]  # (directory, service label) -> (path, exporter)
    console: Callable[[], _Exporter]
    otlp: Callable[[OtlpTarget, float], _Exporter]
    wrap: Callable[[_Exporter, str], _Exporter]


def _file_spans(directory: str, service_label: str) -> tuple[str, SpanExporter]:
    from gym_obs.telemetry.file_export import file_span_exporter  # imported only when chosen

    exporter = file_span_exporter(directory, service_label)
    return str(exporter.path), exporter


def _file_metrics(directory: str, service_label: str) -> tuple[str, MetricExporter]:
    from gym_obs.telemetry.file_export import file_metric_exporter  # imported only when chosen

    exporter = file_metric_exporter(directory, service_label)
    return str(exporter.path), exporter


def _safe_scrubbed_spans(exporter: SpanExporter, what: str) -> SpanExporter:
    """Every span exporter cleans spans first (export_scrub: the backstop for spans gym_obs did not write)."""
    from gym_obs.telemetry.export_scrub import ScrubbingSpanExporter

    return SafeSpanExporter(ScrubbingSpanExporter(exporter), what)


_SPANS: Final = _Signal("span", _file_spans, ConsoleSpanExporter, otlp_span_exporter, _safe_scrubbed_spans)
_METRICS: Final = _Signal(
    "metric", _file_metrics, ConsoleMetricExporter, otlp_metric_exporter, SafeMetricExporter
)


def _build_exporters(
    signal: _Signal[_Exporter],
    names: Sequence[str],
    target: OtlpTarget | None,
    timeout_s: float,
    problems: list[str],
    file_dir: str,
    service_label: str,
) -> list[tuple[str, _Exporter]]:
    """Build, describe and wrap the exporter of each name; one that cannot be built becomes a problem.

    Names without a push exporter ("none", "prometheus": a pull reader built elsewhere, "otlp" without a
    target) are skipped; unknown names were already reported when the settings were read.
    """
    built: list[tuple[str, _Exporter]] = []
    for name in names:
        try:
            if name == "file":
                path, exporter = signal.file(file_dir, service_label)
                what = f"file {signal.name} export to {path}"
            elif name == "otlp" and target is not None:
                exporter = signal.otlp(target, timeout_s)
                what = f"OTLP {target.protocol} {signal.name} export to {redact_url(target.endpoint)}"
            elif name == "console":
                exporter = signal.console()
                what = f"console {signal.name} export"
            else:
                continue
        except Exception as exc:
            problems.append(f"cannot create the {name} {signal.name} exporter ({exc!r}); it is skipped")
            continue
        built.append((what, signal.wrap(exporter, what)))
    return built


def build_span_exporters(
    names: Sequence[str],
    target: OtlpTarget | None,
    timeout_s: float,
    problems: list[str],
    *,
    file_dir: str = "telemetry",
    service_label: str = "gym",
) -> list[tuple[str, SpanExporter]]:
    """The wrapped span exporters for ``names``."""
    return _build_exporters(_SPANS, names, target, timeout_s, problems, file_dir, service_label)


def build_metric_exporters(
    names: Sequence[str],
    target: OtlpTarget | None,
    timeout_s: float,
    problems: list[str],
    *,
    file_dir: str = "telemetry",
    service_label: str = "gym",
) -> list[tuple[str, MetricExporter]]:
    """The wrapped push metric exporters for ``names`` (Prometheus is a pull reader, built elsewhere)."""
    return _build_exporters(_METRICS, names, target, timeout_s, problems, file_dir, service_label)
