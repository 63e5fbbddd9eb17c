"""The direct OTLP protobuf encoder against the official one (``encode_spans``), byte for byte.

Every request the direct encoder writes is parsed with the official ``opentelemetry.proto`` classes and
compared with the message the official encoder builds from the same SDK objects; the bytes are compared
too (both write fields in field-number order). Spans cover every field: ids, trace state, parent and its
remoteness, kinds, times, attributes of every value type (arrays, maps, bytes, NaN, out-of-range ints),
events, links, status, resource, scopes, schema URLs and dropped counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from gym_obs.telemetry._otlp_proto import ProtoEncoder, varint

RESOURCE = Resource(
    {"service.name": "gym/model_0", "n": 3, "f": 1.5, "b": False, "list": ("a", "b")},
    schema_url="https://opentelemetry.io/schemas/1.26.0",
)
ATTRIBUTE_VALUES: dict[str, Any] = {
    "str": "value",
    "empty": "",
    "unicode": "żółw 🐢",
    "long": "x" * 300,  # longer than a cached value
    "int": -5,
    "big": 2**62,
    "min": -(2**63),
    "max": 2**63 - 1,
    "float": 0.25,
    "zero": 0.0,
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "true": True,
    "false": False,
    "strs": ("a", ""),
    "ints": (1, -2),
    "floats": (1.0, 2.5),
    "bools": (True, False),
    "no_items": (),
}


def _assert_same_request(spans: list[ReadableSpan], encoder: ProtoEncoder | None = None) -> None:
    mine = (encoder or ProtoEncoder()).spans(spans)
    expected = encode_spans(spans)
    parsed = ExportTraceServiceRequest.FromString(mine)
    # bytes, not ==: a NaN attribute never equals itself
    assert parsed.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
    assert mine == expected.SerializeToString()


@pytest.fixture
def recorded() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider(resource=RESOURCE, span_limits=SpanLimits(max_span_attributes=40, max_events=3))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory
    provider.shutdown()


def test_varints_are_protobufs() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    for value in (0, 1, 127, 128, 300, 2**32, 2**63 - 1, -1, -(2**63)):
        assert b"\x18" + varint(value) == AnyValue(int_value=value).SerializeToString()


def test_spans_with_every_field_match_the_official_encoder(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = recorded
    tracer = provider.get_tracer("gym_obs", "1.2.3", schema_url="https://scope", attributes={"scope.attr": 1})
    other = provider.get_tracer("other")  # no version: a second scope in the same resource
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1"), ("gym", "x")]),
    )
    local = SpanContext(trace_id=2**128 - 1, span_id=2**64 - 1, is_remote=False)
    parent_ctx = trace.set_span_in_context(NonRecordingSpan(remote))
    with tracer.start_as_current_span("POST /run", context=parent_ctx, kind=SpanKind.SERVER) as server:
        server.set_attributes(ATTRIBUTE_VALUES)
        server.add_event("gym.http.attempt_failed", {"gym.attempt": 1, "error.type": "timeout"})
        server.add_event("no attributes")
        for index in range(4):  # one more than max_events: a dropped event
            server.add_event("bulk", {"i": index, "d": 0.5})
        server.set_status(Status(StatusCode.ERROR, "boom: żółw"))
        with tracer.start_as_current_span(
            "GET",
            kind=SpanKind.CLIENT,
            links=[Link(remote, {"link.kind": "follows"}), Link(local), Link(remote, {"s": ("a",)})],
        ) as client:
            client.set_status(Status(StatusCode.OK))
            client.set_attributes({f"k{i}": i for i in range(45)})  # dropped attributes
        with other.start_as_current_span("", kind=SpanKind.INTERNAL):  # an empty name
            pass
        for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER):
            with tracer.start_as_current_span(kind.name * 50, kind=kind):  # a name over 127 bytes
                pass
    spans = list(memory.get_finished_spans())
    assert len(spans) == 5
    encoder = ProtoEncoder()
    _assert_same_request(spans, encoder)
    _assert_same_request(spans, encoder)  # again: the cached pairs, resource and scopes
    for span in spans:
        _assert_same_request([span], encoder)


def test_hand_built_spans_with_values_the_sdk_would_not_make_match_too() -> None:
    """ReadableSpans built directly (as the export scrubber does): bytes, maps, None, out-of-range ints,
    strings that are not UTF-8, unknown types, missing times, no scope, an equal resource object."""
    context = SpanContext(trace_id=1, span_id=2, is_remote=False)
    other_resource = Resource({"service.name": "gym/other"})
    attributes: dict[str, Any] = {
        "bytes": b"\x00\xffraw",
        "no_bytes": b"",
        "map": {"a": 1, "b": ("x", None), "c": {"d": 2.5}},
        "empty_map": {},
        "none": None,
        "none_inside": ("a", None),
        "too_big": 2**64,  # the official encoder skips it
        "too_big_inside": (1, 2**64),
        "too_small": -(2**63) - 1,
        "object": object(),  # skipped as well
        "lone_surrogate": "\ud800 lone",  # not UTF-8: protobuf refuses it, the attribute is skipped
        "": "an empty key",
    }
    scope = InstrumentationScope("hand", None, None, None)
    spans = [
        ReadableSpan(
            name="hand",
            context=context,
            parent=SpanContext(trace_id=1, span_id=3, is_remote=False),
            resource=RESOURCE,
            attributes=attributes,
            events=[Event("e", {"bytes": b"1"}, timestamp=10), Event("", None, timestamp=0)],
            links=[Link(SpanContext(trace_id=9, span_id=8, is_remote=True), {"w": 0.5})],
            kind=SpanKind.CLIENT,
            status=Status(StatusCode.UNSET),
            start_time=1,
            end_time=2,
            instrumentation_scope=scope,
        ),
        ReadableSpan(name="no scope, other resource", context=context, resource=other_resource, start_time=5),
        ReadableSpan(name="only an end", context=context, resource=other_resource, end_time=7),
        ReadableSpan(
            name="equal resource, other object",
            context=context,
            resource=Resource(RESOURCE.attributes, RESOURCE.schema_url),
            status=Status(StatusCode.ERROR),
        ),
    ]
    _assert_same_request(spans)
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
