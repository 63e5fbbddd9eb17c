"""client_span, span helpers, instruments and the capture fixture itself."""

from __future__ import annotations

import asyncio
from collections.abc import Generator

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    DEFAULT_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import AttributeValue

from gym_obs.telemetry import names
from gym_obs.telemetry.metrics import Instruments, instruments_for
from gym_obs.telemetry.redaction import REDACTED_USERINFO
from gym_obs.telemetry.span_batches import CompactBatchSpanProcessor
from gym_obs.telemetry.spans import (
    client_span,
    current_ids,
    record_exception,
    set_span_error,
    set_trusted_attributes,
    start_trusted_span,
)
from gym_obs.telemetry.testing import Capture, capture_telemetry, telemetry_state

STATE = telemetry_state()


def test_client_span_is_a_cheap_no_op_when_telemetry_is_off() -> None:
    assert STATE.enabled is False
    with client_span("GET", **{names.ATTR_URL_FULL: "http://h/x"}) as span:
        assert span is INVALID_SPAN
        assert current_ids() == (None, None)


def test_client_span_records_a_client_span_with_redacted_url(telemetry: Capture) -> None:
    with client_span(
        "GET", **{names.ATTR_URL_FULL: "http://u:p@h:8/x?token=1", names.ATTR_SERVER_PORT: 8, "skip": None}
    ) as span:
        trace_id, span_id = current_ids()
        assert trace_id == format(span.get_span_context().trace_id, "032x")
        assert span_id == format(span.get_span_context().span_id, "016x")
    (finished,) = telemetry.spans()
    assert finished.kind is SpanKind.CLIENT
    assert finished.name == "GET"
    assert dict(finished.attributes or {}) == {
        names.ATTR_URL_FULL: f"http://{REDACTED_USERINFO}@h:8/x",
        names.ATTR_SERVER_PORT: 8,
    }
    assert finished.status.status_code is StatusCode.UNSET
    assert finished.end_time is not None


def test_exception_sets_error_status_and_a_scrubbed_exception_event(telemetry: Capture) -> None:
    with pytest.raises(ValueError, match="boom"), client_span("POST"):
        raise ValueError("boom api_key=SECRETVALUE")
    (span,) = telemetry.spans("POST")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})[names.ATTR_ERROR_TYPE] == "ValueError"
    (event,) = span.events
    attrs = dict(event.attributes or {})
    assert event.name == names.SPAN_EVENT_EXCEPTION
    assert attrs[names.ATTR_EXCEPTION_TYPE] == "ValueError"
    assert "SECRETVALUE" not in str(attrs[names.ATTR_EXCEPTION_MESSAGE])
    assert "SECRETVALUE" not in str(attrs[names.ATTR_EXCEPTION_STACKTRACE])


def test_error_type_set_inside_the_block_is_kept(telemetry: Capture) -> None:
    with pytest.raises(RuntimeError), client_span("GET") as span:
        set_span_error(span, "503")
        raise RuntimeError("upstream")
    (finished,) = telemetry.spans()
    assert dict(finished.attributes or {})[names.ATTR_ERROR_TYPE] == "503"
    assert finished.status.status_code is StatusCode.ERROR


async def test_cancellation_ends_the_span_without_error(telemetry: Capture) -> None:
    started = asyncio.Event()

    async def call() -> None:
        with client_span("GET"):
            started.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(call())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (span,) = telemetry.spans()
    assert span.end_time is not None
    assert span.status.status_code is not StatusCode.ERROR
    assert names.ATTR_ERROR_TYPE not in dict(span.attributes or {})


def test_nested_spans_share_the_trace(telemetry: Capture) -> None:
    with client_span("outer") as outer, client_span("inner"):
        pass
    inner, outer_span = telemetry.spans()
    assert inner.parent is not None
    assert inner.parent.span_id == outer.get_span_context().span_id
    assert inner.context is not None and outer_span.context is not None
    assert inner.context.trace_id == outer_span.context.trace_id


def test_set_span_error_and_record_exception_ignore_non_recording_spans() -> None:
    set_span_error(INVALID_SPAN, "x")
    record_exception(INVALID_SPAN, ValueError("x"))


def test_instruments_are_built_once_per_meter() -> None:
    meter = NoOpMeter("a")
    first = instruments_for(meter)
    assert instruments_for(meter) is first
    assert instruments_for(NoOpMeter("b")) is not first
    assert isinstance(first, Instruments)


def test_histograms_use_second_buckets_and_units_from_names(telemetry: Capture) -> None:
    instruments = STATE.instruments
    assert instruments is not None
    instruments.client_request_duration.record(0.2, {names.ATTR_SERVER_NAME: "model"})
    instruments.pool_wait_duration.record(0.0003, {names.ATTR_POOL: names.POOL_DATA})
    instruments.rollout_duration.record(42.0, {names.ATTR_ROLLOUT_OUTCOME: names.ROLLOUT_OUTCOME_COMPLETED})
    for metric in (
        names.METRIC_HTTP_CLIENT_REQUEST_DURATION,
        names.METRIC_POOL_WAIT_DURATION,
        names.METRIC_ROLLOUT_DURATION,
    ):
        (point,) = telemetry.metric_points(metric)
        assert point.explicit_bounds == names.HISTOGRAM_BUCKETS_S[metric]
        assert point.count == 1
        assert telemetry.metric_unit(metric) == names.UNIT_SECONDS


def test_every_instrument_records_with_its_unit(telemetry: Capture) -> None:
    instruments = STATE.instruments
    assert instruments is not None
    instruments.client_retries.add(1, {names.ATTR_RETRY_REASON: names.RETRY_REASON_TIMEOUT})
    instruments.pool_pending_requests.add(1, {names.ATTR_POOL: names.POOL_DATA})
    instruments.pool_connections.add(2, {names.ATTR_HTTP_CONNECTION_STATE: names.CONNECTION_STATE_IDLE})
    instruments.failure_events.add(1, {names.ATTR_FAILURE_KIND: "timeout"})
    instruments.rollouts.add(1, {names.ATTR_ROLLOUT_OUTCOME: names.ROLLOUT_OUTCOME_FAILED})
    expected_units = {
        names.METRIC_CLIENT_RETRIES: names.UNIT_RETRY,
        names.METRIC_POOL_PENDING_REQUESTS: names.UNIT_REQUEST,
        names.METRIC_POOL_CONNECTIONS: names.UNIT_CONNECTION,
        names.METRIC_FAILURE_EVENTS: names.UNIT_EVENT,
        names.METRIC_ROLLOUTS: names.UNIT_ROLLOUT,
    }
    for metric, unit in expected_units.items():
        assert telemetry.metric_unit(metric) == unit
        assert len(telemetry.metric_points(metric)) == 1


def test_capture_accumulates_deltas_between_reads(telemetry: Capture) -> None:
    instruments = STATE.instruments
    assert instruments is not None
    attrs = {names.ATTR_POOL: names.POOL_DATA}
    instruments.pool_pending_requests.add(3, attrs)
    assert telemetry.metric_points(names.METRIC_POOL_PENDING_REQUESTS)[0].value == 3
    instruments.pool_pending_requests.add(-3, attrs)
    assert telemetry.metric_points(names.METRIC_POOL_PENDING_REQUESTS)[0].value == 0
    instruments.client_request_duration.record(1.0, attrs)
    instruments.client_request_duration.record(2.0, attrs)
    telemetry.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)
    instruments.client_request_duration.record(3.0, attrs)
    (point,) = telemetry.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)
    assert (point.count, point.sum, point.min, point.max) == (3, 6.0, 1.0, 3.0)


def test_each_capture_sees_only_its_own_data() -> None:
    for _ in range(3):
        with capture_telemetry() as capture:
            with client_span("GET"):
                pass
            assert STATE.instruments is not None
            STATE.instruments.client_retries.add(1, {names.ATTR_RETRY_REASON: names.RETRY_REASON_OTHER})
            assert len(capture.spans()) == 1
            assert capture.metric_points(names.METRIC_CLIENT_RETRIES)[0].value == 1
            capture.clear()
            assert capture.spans() == []
            assert capture.metric_points(names.METRIC_CLIENT_RETRIES) == []
    assert STATE.enabled is False
    assert STATE.tracer is None


def test_capture_uses_the_global_sdk_providers(telemetry: Capture) -> None:
    assert trace.get_tracer_provider() is telemetry.tracer_provider
    with trace.get_tracer("third-party").start_as_current_span("server-side"):
        pass
    assert [s.name for s in telemetry.spans()] == ["server-side"]


def test_any_attribute_holding_a_url_loses_credentials_and_query(telemetry: Capture) -> None:
    with client_span(
        "GET",
        **{
            "http.url": "http://u:p@h/y?token=2",  # the old semconv name
            "note": "called https://a:b@h/?q=1 then gave up",
            names.ATTR_SERVER_ADDRESS: "h",
        },
    ):
        pass
    (finished,) = telemetry.spans()
    attributes = dict(finished.attributes or {})
    assert attributes["http.url"] == f"http://{REDACTED_USERINFO}@h/y"
    assert attributes["note"] == f"called https://{REDACTED_USERINFO}@h/ then gave up"
    assert attributes[names.ATTR_SERVER_ADDRESS] == "h"


def test_span_ends_on_every_way_out_of_the_block(telemetry: Capture) -> None:
    def generator() -> Generator[int, None, None]:
        with client_span("GENERATOR"):
            yield 1

    gen = generator()
    next(gen)
    gen.close()
    with pytest.raises(KeyboardInterrupt), client_span("INTERRUPTED"):
        raise KeyboardInterrupt
    with pytest.raises(ExceptionGroup), client_span("GROUP"):
        raise ExceptionGroup("many", [ValueError("a"), KeyError("b")])
    with client_span("RETURNED"):
        pass
    spans = {s.name: s for s in telemetry.spans()}
    assert set(spans) == {"GENERATOR", "INTERRUPTED", "GROUP", "RETURNED"}
    assert all(s.end_time is not None for s in spans.values())
    assert spans["GROUP"].status.status_code is StatusCode.ERROR
    assert dict(spans["GROUP"].attributes or {})[names.ATTR_ERROR_TYPE] == "ExceptionGroup"
    assert spans["RETURNED"].status.status_code is StatusCode.UNSET
    assert trace.get_current_span() is INVALID_SPAN or not trace.get_current_span().is_recording()


async def test_cancelling_a_task_inside_nested_spans_ends_both_without_error(telemetry: Capture) -> None:
    started = asyncio.Event()

    async def work() -> None:
        with client_span("OUTER"), client_span("INNER"):
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(work())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    spans = {s.name: s for s in telemetry.spans()}
    assert set(spans) == {"OUTER", "INNER"}
    for span in spans.values():
        assert span.end_time is not None
        assert span.status.status_code is StatusCode.UNSET
        assert names.ATTR_ERROR_TYPE not in (span.attributes or {})


class _AttributeReadingSampler(Sampler):
    """A sampler that decides by an attribute (drops health checks): it must see the attributes at start."""

    def __init__(self) -> None:
        self.seen: list[dict[str, object]] = []

    def should_sample(  # type: ignore[override]
        self, parent_context: object, trace_id: int, name: str, kind: object = None,
        attributes: object = None, links: object = None, trace_state: object = None,
    ) -> SamplingResult:
        attrs = dict(attributes or {})  # type: ignore[call-overload]
        self.seen.append(attrs)
        drop = attrs.get(names.ATTR_URL_FULL) == "http://h/health"
        return SamplingResult(Decision.DROP if drop else Decision.RECORD_AND_SAMPLE, attrs or None)

    def get_description(self) -> str:
        return "reads attributes"


class _StartRecorder(SpanProcessor):
    """What span processors see at start: the span's attributes and the parent context given."""

    def __init__(self) -> None:
        self.started: list[tuple[dict[str, object], object]] = []

    def on_start(self, span: object, parent_context: object = None) -> None:
        if getattr(span, "name", None) == "GET":
            self.started.append((dict(getattr(span, "attributes", None) or {}), parent_context))


_REMOTE = SpanContext(
    0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(0x03), trace_state=TraceState([("k", "v")])
)
_PARENTS = {
    "no_parent": lambda tracer: None,
    "local_sampled": lambda tracer: trace.set_span_in_context(tracer.start_span("parent")),
    "remote_sampled_random": lambda tracer: trace.set_span_in_context(NonRecordingSpan(_REMOTE)),
    "remote_unsampled": lambda tracer: trace.set_span_in_context(
        NonRecordingSpan(SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(0)))
    ),
    "current_local": "current",
}
_SAMPLERS = {
    "parentbased_always_on": lambda: DEFAULT_ON,
    "parentbased_ratio": lambda: ParentBased(TraceIdRatioBased(1.0)),
    "always_on": lambda: ALWAYS_ON,
    "parentbased_reading_child": lambda: ParentBased(
        ALWAYS_ON, local_parent_sampled=_AttributeReadingSampler()
    ),
    "attribute_reading": _AttributeReadingSampler,
}


#: The ParentBased delegate that decides each parent case (an unsampled parent's: never the fast steps).
_DELEGATES = {
    "no_parent": "_root",
    "local_sampled": "_local_parent_sampled",
    "current_local": "_local_parent_sampled",
    "remote_sampled_random": "_remote_parent_sampled",
}


def _fields(span: ReadableSpan, new_trace: bool) -> tuple[object, ...]:
    context = span.context
    assert context is not None
    return (
        span.name, span.kind, span.parent, None if new_trace else context.trace_id, context.trace_flags,
        context.trace_state,
        context.is_remote, dict(span.attributes or {}), span.resource, span.instrumentation_scope,
        span.start_time, span.end_time, span.status.status_code, list(span.events), list(span.links),
    )


@pytest.mark.parametrize("parent_case", list(_PARENTS))
@pytest.mark.parametrize("sampler_case", list(_SAMPLERS))
def test_start_trusted_span_makes_the_span_start_span_would(sampler_case: str, parent_case: str) -> None:
    sampler = _SAMPLERS[sampler_case]()
    exporter, recorder = InMemorySpanExporter(), _StartRecorder()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(recorder)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    attrs: dict[str, str | int] = {names.ATTR_URL_FULL: "http://h/x", names.ATTR_SERVER_PORT: 8}
    make = _PARENTS[parent_case]
    token = None
    if make == "current":  # no context given: the current one is the parent
        token = otel_context.attach(trace.set_span_in_context(tracer.start_span("parent")))
        context = None
    else:
        context = make(tracer)  # type: ignore[operator]
    try:
        sdk_span = tracer.start_span("GET", context, SpanKind.CLIENT, attrs, start_time=5)
        sdk_span.end(end_time=7)
        trusted_span = start_trusted_span(tracer, "GET", context, SpanKind.CLIENT, attrs, 5)
        trusted_span.end(end_time=7)
    finally:
        if token is not None:
            otel_context.detach(token)
    made = [span for span in exporter.get_finished_spans() if span.name == "GET"]
    if not made:  # not sampled either way
        assert parent_case == "remote_unsampled" and recorder.started == []
        return
    sdk_made, trusted = made
    # where a ParentBased sampler always samples the case (a sampled parent's child, a root), the SDK's
    # steps are taken in one frame, which makes gym_obs's own span class
    delegate = _DELEGATES.get(parent_case)
    one_frame = isinstance(sampler, ParentBased) and getattr(sampler, delegate or "", None) is ALWAYS_ON
    assert (type(trusted_span) is not type(sdk_span)) == one_frame
    assert one_frame or sampler_case != "parentbased_always_on"
    new_trace = parent_case == "no_parent"
    assert _fields(trusted, new_trace) == _fields(sdk_made, new_trace)
    assert dict(trusted.attributes or {}) == attrs
    assert trusted.context is not None and sdk_made.context is not None
    assert trusted.context.span_id != sdk_made.context.span_id
    (sdk_started, sdk_parent), (trusted_started, trusted_parent) = recorder.started
    assert trusted_parent is sdk_parent
    assert sdk_started == attrs
    # Processors see the attributes at start, except on the path for other attribute-blind samplers.
    assert trusted_started in (attrs, {})
    if sampler_case == "parentbased_always_on" and parent_case != "no_parent":
        assert trusted_started == attrs
    if isinstance(sampler, _AttributeReadingSampler):
        assert sampler.seen[-2:] == [attrs, attrs]  # a sampler that may read them still gets them at start
        health = {names.ATTR_URL_FULL: "http://h/health"}
        assert not start_trusted_span(tracer, "GET", context, SpanKind.CLIENT, health).is_recording()


def test_several_tracers_of_a_provider_each_take_the_one_frame_steps() -> None:
    """A process with more than one tracer (the harness driver's and the client's) keeps every one on the
    fast steps, alternating (each is checked once, not at every switch)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracers = [provider.get_tracer("one"), provider.get_tracer("two")]
    assert tracers[0] is not tracers[1]
    made = [start_trusted_span(tracers[i % 2], "GET", None, SpanKind.CLIENT, {"k": i}) for i in range(4)]
    for span in made:
        span.end()
    sdk_type = type(tracers[0].start_span("sdk"))
    assert all(type(span) is not sdk_type and isinstance(span, sdk_type) for span in made)  # one frame
    scopes = [s.instrumentation_scope.name for s in exporter.get_finished_spans()[:4]]  # type: ignore[union-attr]
    assert scopes == ["one", "two", "one", "two"]


@pytest.mark.parametrize("limits", [SpanLimits(max_attribute_length=4), SpanLimits(max_span_attributes=1)])
def test_start_trusted_span_applies_span_limits_as_start_span_does(limits: SpanLimits) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    attrs: dict[str, str | int] = {names.ATTR_URL_FULL: "http://h/x", names.ATTR_SERVER_PORT: 8}
    with tracer.start_as_current_span("parent"):
        tracer.start_span("GET", None, SpanKind.CLIENT, attrs).end()
        start_trusted_span(tracer, "GET", None, SpanKind.CLIENT, attrs).end()
    sdk_made, trusted = (span for span in exporter.get_finished_spans() if span.name == "GET")
    assert dict(trusted.attributes or {}) == dict(sdk_made.attributes or {}) != attrs


@pytest.mark.parametrize("limits", [SpanLimits(), SpanLimits(max_events=1, max_links=1)])
def test_events_and_links_added_after_start_are_kept_as_start_span_keeps_them(limits: SpanLimits) -> None:
    """A trusted child span makes its event and link lists on first use; what it keeps (and drops, and
    refuses once ended) is what an SDK span keeps."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("parent") as parent:
        link_to = parent.get_span_context()
        for trusted in (False, True):
            span = (
                start_trusted_span(tracer, "GET", None, SpanKind.CLIENT, {})
                if trusted
                else tracer.start_span("GET", None, SpanKind.CLIENT)
            )
            span.add_event("first", {"k": 1}, timestamp=3)
            span.record_exception(ValueError("x"), timestamp=4)
            span.add_link(link_to, {"why": "test"})
            span.add_link(link_to)
            span.end(end_time=9)
            span.add_event("late")  # the span has ended: refused (the SDK logs it)
            span.add_link(link_to)
        quiet = start_trusted_span(tracer, "quiet", None, SpanKind.CLIENT, {})
        quiet.end()
    sdk_made, trusted_made = (span for span in exporter.get_finished_spans() if span.name == "GET")

    def kept(span: ReadableSpan) -> tuple[object, ...]:
        events = [(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events]
        links = [(link.context, dict(link.attributes or {})) for link in span.links]
        return events, span.dropped_events, links, span.dropped_links

    assert kept(trusted_made) == kept(sdk_made)
    assert len(trusted_made.events) == (1 if limits.max_events == 1 else 2)
    quiet_made = next(span for span in exporter.get_finished_spans() if span.name == "quiet")
    assert (quiet_made.events, quiet_made.links, quiet_made.dropped_events) == ((), (), 0)


def _gym_provider(
    processors: int, extra: SpanProcessor | None = None
) -> tuple[TracerProvider, list[InMemorySpanExporter]]:
    """A tracer provider as ``setup_telemetry`` builds it: only ``CompactBatchSpanProcessor``s (plus
    ``extra``, which takes every span back to the SDK's path)."""
    provider = TracerProvider()
    exporters = [InMemorySpanExporter() for _ in range(processors)]
    for exporter in exporters:
        provider.add_span_processor(CompactBatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    if extra is not None:
        provider.add_span_processor(extra)
    return provider, exporters


def _exported(span: ReadableSpan) -> tuple[object, ...]:
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    status = (span.status.status_code, span.status.description)
    return (*_fields(span, False)[:12], status, events, span.dropped_attributes, span.dropped_events)


def _ended_twice_and_touched(span: trace.Span) -> None:
    span.set_attribute("late", 1)  # ended: refused
    span.end(end_time=99)  # ended: refused, logged


@pytest.mark.parametrize("processors", [1, 2])
@pytest.mark.parametrize("parent_case", ["local_sampled", "remote_sampled_random", "current_local"])
def test_under_gym_batch_processors_a_trusted_child_is_exported_as_start_span_exports_it(
    processors: int, parent_case: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With only gym_obs's batch processors behind the provider, a trusted child is started and ended
    without the SDK's processor calls (they do nothing then), and each exporter gets what ``start_span``'s
    span gives it: same fields, attributes, events, status, times; refused the same way once ended."""
    calls: list[str] = []
    for hook in ("on_start", "_on_ending", "on_end"):
        original = getattr(CompactBatchSpanProcessor, hook)

        def counted(
            self: object, *args: object, _hook: str = hook, _call: object = original, **kw: object
        ) -> None:
            calls.append(_hook)
            _call(self, *args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(CompactBatchSpanProcessor, hook, counted)
    provider, exporters = _gym_provider(processors)
    tracer = provider.get_tracer("test")
    attrs: dict[str, str | int] = {names.ATTR_URL_FULL: "http://h/x", names.ATTR_SERVER_PORT: 8}
    token = None
    if parent_case == "current_local":
        token = otel_context.attach(trace.set_span_in_context(tracer.start_span("parent")))
        context = None
    else:
        context = _PARENTS[parent_case](tracer)  # type: ignore[operator]
    made = []
    try:
        for trusted in (False, True):
            calls.clear()
            span = (
                start_trusted_span(tracer, "GET", context, SpanKind.CLIENT, attrs, 5)
                if trusted
                else tracer.start_span("GET", context, SpanKind.CLIENT, attrs, start_time=5)
            )
            span.set_attribute("later", "yes")
            span.add_event("first", {"k": 1}, timestamp=6)
            record_exception(span, ValueError("boom"))
            set_span_error(span, "ValueError")
            span.end(end_time=7)
            made.append(calls.copy())
            with caplog.at_level("WARNING", logger="opentelemetry.sdk.trace"):
                caplog.clear()
                _ended_twice_and_touched(span)
                made.append([record.getMessage() for record in caplog.records])
    finally:
        if token is not None:
            otel_context.detach(token)
    sdk_calls, sdk_warnings, trusted_calls, trusted_warnings = made
    assert sdk_calls == ["on_start"] * processors + ["_on_ending"] * processors + ["on_end"] * processors
    assert trusted_calls == []  # the SDK's processor calls were skipped: nothing they would do was lost
    assert trusted_warnings == sdk_warnings and len(sdk_warnings) == 2
    provider.force_flush()
    for exporter in exporters:
        sdk_made, trusted_made = (span for span in exporter.get_finished_spans() if span.name == "GET")
        assert type(trusted_made) is type(sdk_made) is ReadableSpan
        assert _exported(trusted_made) == _exported(sdk_made)
        kept = {**attrs, "later": "yes", names.ATTR_ERROR_TYPE: "ValueError"}
        assert dict(trusted_made.attributes or {}) == kept
        assert type(trusted_made._attributes) is dict  # compact, as the processor keeps it
    if processors == 2:  # both exporters got the one ended copy each processor is given
        first, second = ([s for s in e.get_finished_spans() if s.name == "GET"][1] for e in exporters)
        assert first is second


def test_any_other_span_processor_takes_trusted_spans_back_to_the_sdks_path() -> None:
    """A processor a user added next to gym_obs's sees a trusted child start (with its attributes) and end."""
    recorder = _StartRecorder()
    ended: list[str] = []

    class _EndRecorder(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            ended.append(span.name)

    provider, exporters = _gym_provider(1, recorder)
    provider.add_span_processor(_EndRecorder())
    tracer = provider.get_tracer("test")
    attrs: dict[str, str | int] = {names.ATTR_URL_FULL: "http://h/x"}
    with tracer.start_as_current_span("parent"):
        start_trusted_span(tracer, "GET", None, SpanKind.CLIENT, attrs).end()
    provider.force_flush()
    assert [started for started, _ in recorder.started] == [attrs]
    assert ended == ["GET", "parent"]
    assert [span.name for span in exporters[0].get_finished_spans()] == ["GET", "parent"]


def test_the_sdks_live_span_count_is_kept_by_trusted_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the SDK's own span metrics on, a trusted child counts as live until it ends, as any span."""
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    reader = InMemoryMetricReader()
    provider = TracerProvider(meter_provider=MeterProvider(metric_readers=[reader]))
    provider.add_span_processor(CompactBatchSpanProcessor(InMemorySpanExporter()))
    tracer = provider.get_tracer("test")

    def live() -> int:
        data = reader.get_metrics_data()
        assert data is not None
        points = [
            point.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == "otel.sdk.span.live"
            for point in metric.data.data_points
        ]
        return int(sum(points))

    with tracer.start_as_current_span("parent"):
        child = start_trusted_span(tracer, "GET", None, SpanKind.CLIENT, {})
        assert live() == 2
        child.end()
        assert live() == 1
    assert live() == 0


class _OwnSpan(SdkSpan):
    """A span class of its own over the SDK's (not what its tracer makes): set_trusted_attributes reads it
    through getattr."""


_TRUSTED: dict[str, AttributeValue] = {
    names.ATTR_GEN_AI_OPERATION_NAME: "chat",
    names.ATTR_GEN_AI_USAGE_INPUT_TOKENS: 120,
    names.ATTR_GEN_AI_STREAMED: False,
    names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
    names.ATTR_GEN_AI_RESPONSE_ID: "chatcmpl-0123456789",
}


@pytest.mark.parametrize("made_by", ["sdk", "own_class", "trusted"])
@pytest.mark.parametrize(
    "limits", [SpanLimits(), SpanLimits(max_attribute_length=4), SpanLimits(max_span_attributes=2)]
)
def test_set_trusted_attributes_leaves_a_span_as_set_attributes_does(
    limits: SpanLimits, made_by: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    made = []
    with tracer.start_as_current_span("parent"):
        for setter in (SdkSpan.set_attributes, set_trusted_attributes):
            if made_by == "trusted":  # a sampled child: gym's own span class
                span = start_trusted_span(tracer, "s", None, SpanKind.SERVER, {"before": 1})
            else:
                span = tracer.start_span("s", attributes={"before": 1})
            if made_by == "own_class":
                span.__class__ = _OwnSpan
            setter(span, _TRUSTED)  # type: ignore[operator]
            span.end()
            setter(span, {"after": 2})  # type: ignore[operator]  # ended: nothing changes
            made.append(dict(exporter.get_finished_spans()[-1].attributes or {}))
    assert made[0] == made[1]
    assert "after" not in made[1]
    if limits.max_span_attributes is None and limits.max_attribute_length is None:
        assert made[1] == {"before": 1, **_TRUSTED}


def test_set_trusted_attributes_on_a_span_that_records_nothing_is_harmless() -> None:
    for span in (INVALID_SPAN, NonRecordingSpan(INVALID_SPAN.get_span_context())):
        set_trusted_attributes(span, _TRUSTED)
        assert not span.is_recording()
