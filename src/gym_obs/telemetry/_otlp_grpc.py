"""The OTLP gRPC span exporter with gym_obs's direct protobuf encoder in place of the SDK's.

The SDK's gRPC exporter builds protobuf message objects and lets the generated stub serialise them;
:class:`DirectOtlpGrpcSpanExporter` hands the stub bytes written directly
(:mod:`gym_obs.telemetry._otlp_proto`) through a method with no serialiser, so the channel, retries,
headers, compression and credentials stay the SDK's. A batch the direct encoder refuses is encoded by the
official encoder. Imported only when gRPC is chosen (grpc is a heavy import).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan

from gym_obs.telemetry._otlp_proto import ProtoEncoder

__all__ = ["DirectOtlpGrpcSpanExporter"]

_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _RawTraceStub:
    """The trace service's ``Export`` taking already serialised request bytes."""

    def __init__(self, channel: Any) -> None:
        self.Export = channel.unary_unary(
            _EXPORT_METHOD,
            request_serializer=None,  # the request is bytes already
            response_deserializer=ExportTraceServiceResponse.FromString,
        )


class DirectOtlpGrpcSpanExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` (gRPC) whose batches are encoded by :class:`ProtoEncoder`."""

    def __init__(self, **kwargs: Any) -> None:
        self._encoder = ProtoEncoder()
        self.direct_batches = 0
        super().__init__(**kwargs)

    def _initialize_channel_and_stub(self) -> None:
        """Also on reconnection: the SDK builds a new channel and stub after an UNAVAILABLE error."""
        super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
        self._client = _RawTraceStub(self._channel)  # type: ignore[assignment]

    def _translate_data(self, data: Sequence[ReadableSpan]) -> bytes:  # type: ignore[override]
        try:
            encoded = self._encoder.spans(data)
        except Exception:
            return encode_spans(data).SerializeToString()
        self.direct_batches += 1
        return encoded
