"""Spans that exercise every field of the OTLP span encoding, shared by the direct encoders' tests (JSON
and protobuf), which hold them to the official encoder's output."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

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


def every_field_spans() -> list[ReadableSpan]:
    """Five SDK spans: a remote parent with trace state, every kind, two scopes, attributes of every
    value type, events, links (remote and local), statuses, dropped attributes and events."""
    provider = TracerProvider(resource=RESOURCE, span_limits=SpanLimits(max_span_attributes=40, max_events=3))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
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
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    assert len(spans) == 5
    return spans


def hand_built_spans(*, not_utf8: bool = True) -> list[ReadableSpan]:
    """ReadableSpans built directly (as the export scrubber does): bytes, maps, None, out-of-range ints,
    unknown types, an empty key, missing times, no scope, an equal resource in another object; with
    ``not_utf8`` also a string that is not UTF-8 (the official encoder skips that attribute)."""
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
        "": "an empty key",
    }
    if not_utf8:
        attributes["lone_surrogate"] = "\ud800 lone"
    scope = InstrumentationScope("hand", None, None, None)
    return [
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
