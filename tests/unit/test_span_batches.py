"""The compacting batch span processor: exporters get the same spans, held in fewer tracked objects."""

from __future__ import annotations

import gc

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from gym_obs.telemetry._otlp_json import spans_json_line
from gym_obs.telemetry._otlp_proto import ProtoEncoder
from gym_obs.telemetry.span_batches import CompactBatchSpanProcessor, compact_ended_span


def _make_spans(processor: SpanProcessor, limits: SpanLimits | None = None) -> None:
    """The shapes exporters meet: plain, tuple-valued attribute, events and a link, dropped attributes and
    events (limits of 3), an error status, a remote parent."""
    provider = TracerProvider(span_limits=limits or SpanLimits())
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("gym_obs.test")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER) as root:
        root.set_attributes({"http.route": "/run", "http.response.status_code": 200})
        with tracer.start_as_current_span("child", attributes={"a": "x", "b": ("s", "t")}) as child:
            child.add_event("first", {"k": 1})
            child.add_event("second")
            child.add_link(root.get_span_context(), {"why": "test"})
            child.set_status(Status(StatusCode.ERROR, "boom"))
        many = tracer.start_span("many", attributes={f"k{i}": i for i in range(6)})
        for i in range(6):
            many.add_event(f"e{i}")
        many.end()
    remote = trace.SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=trace.TraceFlags(1))
    tracer.start_span("remote child", trace.set_span_in_context(trace.NonRecordingSpan(remote))).end()
    provider.shutdown()


def _public(span: ReadableSpan) -> tuple[object, ...]:
    return (
        span.name,
        span.context,
        span.parent,
        dict(span.attributes or {}),
        span.dropped_attributes,
        [(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events],
        span.dropped_events,
        [(link.context, dict(link.attributes or {})) for link in span.links],
        span.dropped_links,
        span.status.status_code,
        span.status.description,
        span.start_time,
        span.end_time,
    )


@pytest.mark.parametrize("limits", [None, SpanLimits(max_span_attributes=3, max_events=3)])
def test_exporters_get_what_the_sdk_span_held(limits: SpanLimits | None) -> None:
    class Witness(CompactBatchSpanProcessor):
        """Notes what each span holds as the SDK ended it, before the processor compacts it."""

        def __init__(self, exporter: SpanExporter) -> None:
            super().__init__(exporter)
            self.ended: list[tuple[object, ...]] = []

        def on_end(self, span: ReadableSpan) -> None:
            self.ended.append(_public(span))
            super().on_end(span)

    exporter = InMemorySpanExporter()
    witness = Witness(exporter)
    _make_spans(witness, limits)
    kept = exporter.get_finished_spans()
    assert [_public(span) for span in kept] == witness.ended
    assert len(kept) == 4
    many = next(span for span in kept if span.name == "many")
    assert (many.dropped_attributes, many.dropped_events) == ((3, 3) if limits else (0, 0))


def test_encoders_write_the_same_bytes_for_a_compacted_span() -> None:
    exporter = InMemorySpanExporter()
    _make_spans(BatchSpanProcessor(exporter), SpanLimits(max_span_attributes=3, max_events=3))
    kept = exporter.get_finished_spans()
    before_json = spans_json_line(kept)
    before_proto = ProtoEncoder().spans(kept)
    for span in kept:
        compact_ended_span(span)
    by_name = {span.name: span for span in kept}
    assert type(by_name["child"]._attributes) is dict  # nothing dropped: compacted
    assert type(by_name["child"]._events) is tuple and type(by_name["child"]._links) is tuple
    assert by_name["many"].dropped_attributes == 3  # dropped: kept as the SDK holds it
    assert spans_json_line(kept) == before_json
    assert ProtoEncoder().spans(kept) == before_proto


def test_a_queued_span_holds_fewer_tracked_objects() -> None:
    class Hold(SpanProcessor):
        def __init__(self, compact: bool) -> None:
            self.compact = compact
            self.spans: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            if self.compact:
                compact_ended_span(span)
            self.spans.append(span)

    def tracked_per_span(compact: bool) -> float:
        hold = Hold(compact)
        provider = TracerProvider()
        provider.add_span_processor(hold)
        tracer = provider.get_tracer("gym_obs.test")
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(1000):
            tracer.start_span("s", attributes={"http.request.method": "GET", "server.port": 80}).end()
        gc.collect()
        return (len(gc.get_objects()) - before) / 1000

    sdk, compacted = tracked_per_span(False), tracked_per_span(True)
    assert compacted <= 3 < 8 <= sdk  # the span, its context and its trace flags; the SDK copy: ten or more


def test_other_span_types_are_left_alone() -> None:
    class Custom(ReadableSpan):
        pass

    span = Custom("x", attributes={"a": 1})
    attributes = span._attributes
    compact_ended_span(span)
    assert span._attributes is attributes
