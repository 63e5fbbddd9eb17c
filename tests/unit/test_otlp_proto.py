"""The direct OTLP protobuf encoder against the official one (``encode_spans``), byte for byte.

Every request the direct encoder writes is parsed with the official ``opentelemetry.proto`` classes and
compared with the message the official encoder builds from the same SDK objects; the bytes are compared
too (both write fields in field-number order). Spans cover every field: ids, trace state, parent and its
remoteness, kinds, times, attributes of every value type (arrays, maps, bytes, NaN, out-of-range ints),
events, links, status, resource, scopes, schema URLs and dropped counts.
"""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from gym_obs.telemetry._otlp_proto import ProtoEncoder, varint
from tests.unit.otlp_spans import RESOURCE, every_field_spans, hand_built_spans


def _assert_same_request(spans: list[ReadableSpan], encoder: ProtoEncoder | None = None) -> None:
    mine = (encoder or ProtoEncoder()).spans(spans)
    expected = encode_spans(spans)
    parsed = ExportTraceServiceRequest.FromString(mine)
    # bytes, not ==: a NaN attribute never equals itself
    assert parsed.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
    assert mine == expected.SerializeToString()


def test_varints_are_protobufs() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    for value in (0, 1, 127, 128, 300, 2**32, 2**63 - 1, -1, -(2**63)):
        assert b"\x18" + varint(value) == AnyValue(int_value=value).SerializeToString()


def test_spans_with_every_field_match_the_official_encoder() -> None:
    spans = every_field_spans()
    encoder = ProtoEncoder()
    _assert_same_request(spans, encoder)
    _assert_same_request(spans, encoder)  # again: the cached pairs, resource and scopes
    for span in spans:
        _assert_same_request([span], encoder)


def test_hand_built_spans_with_values_the_sdk_would_not_make_match_too() -> None:
    _assert_same_request(hand_built_spans())
    _assert_same_request([])


def test_a_span_the_official_encoder_refuses_is_refused_too() -> None:
    """A name that is not UTF-8 fails the official encoder's whole batch; the direct one raises as well
    (the exporter then hands the batch to the official path, which fails it the same way)."""
    context = SpanContext(trace_id=5, span_id=6, is_remote=False)
    bad = ReadableSpan(name="\ud800", context=context, resource=RESOURCE)
    with pytest.raises(UnicodeEncodeError):
        encode_spans([bad])
    with pytest.raises(UnicodeEncodeError):
        ProtoEncoder().spans([bad])


def test_the_caches_stay_bounded_and_correct_past_their_size() -> None:
    """Unique values churn through the pair cache (cleared when full); every batch stays exact."""
    provider = TracerProvider(resource=RESOURCE)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for index in range(3000):
        with tracer.start_as_current_span("x", attributes={"id": f"r-{index}", "n": index, "m": "POST"}):
            pass
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    encoder = ProtoEncoder()
    _assert_same_request(spans, encoder)
    _assert_same_request(spans[:10], encoder)
    resources = [Resource({"i": index}) for index in range(100)]  # more than the resource cache holds
    for resource in resources:
        span = ReadableSpan(name="r", context=SpanContext(1, 2, False), resource=resource)
        _assert_same_request([span], encoder)
