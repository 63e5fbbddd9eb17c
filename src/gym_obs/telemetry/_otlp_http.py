"""The OTLP http/protobuf span exporter with gym_obs's direct protobuf encoder in place of the SDK's.

The SDK's exporter builds protobuf message objects for every span and serialises them (~50 µs per span on
the batch processor's thread); :class:`DirectOtlpHttpSpanExporter` writes the same bytes directly
(:mod:`gym_obs.telemetry._otlp_proto`) and hands them to the SDK's own HTTP client, so retries,
compression, headers, TLS and the ``OTEL_EXPORTER_OTLP_*`` settings stay the SDK's. Whatever the direct
path does not cover -- an exporter shut down, a batch the direct encoder refuses, a request over the size
limit, or an SDK whose internals moved (checked once, at construction) -- goes through the SDK's own
``export``, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from gym_obs.telemetry._otlp_proto import ProtoEncoder

__all__ = ["DirectOtlpHttpSpanExporter"]

_STATUS_CODE = "http.response.status_code"  # the SDK's attribute on its failed-export metric


class DirectOtlpHttpSpanExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` (http/protobuf) whose batches are encoded by :class:`ProtoEncoder`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._encoder = ProtoEncoder()
        client = getattr(self, "_client", None)
        self.direct = (
            callable(getattr(client, "export", None))
            and callable(getattr(getattr(self, "_metrics", None), "export_operation", None))
            and isinstance(getattr(self, "_max_request_size", None), int)
        )
        self.direct_batches = 0  # batches sent by the direct path (what tests and benchmarks check)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.direct or getattr(self, "_shutdown", False):
            return super().export(spans)
        try:
            data = self._encoder.spans(spans)
        except Exception:  # the official encoder skips or fails as it does
            return super().export(spans)
        if 0 < self._max_request_size < len(data):  # the SDK drops it, with its own warning and metric
            return super().export(spans)
        with self._metrics.export_operation(len(spans)) as result:
            sent = self._client.export(data)
            if not sent.success:
                result.error = sent.error
                if sent.status_code is not None:
                    result.error_attrs = {_STATUS_CODE: sent.status_code}
                return SpanExportResult.FAILURE
        self.direct_batches += 1
        return SpanExportResult.SUCCESS
