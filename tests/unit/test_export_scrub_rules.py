"""Issue 12.2: exceptions on spans are scrubbed like log lines, and the export-time backstop cleans spans
gym_obs did not write (query, fragment, userinfo, raw tracebacks) before any exporter sees them."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gym_obs.failures.event import NgFailureEvent
from gym_obs.failures.transport import observe_failure, request_failure_log
from gym_obs.telemetry import names
from gym_obs.telemetry.export_scrub import ScrubbingSpanExporter, scrub_span
from gym_obs.telemetry.spans import record_exception
from gym_obs.telemetry.testing import Capture

CANARY = "sk-CANARYc4n4ry0123456789xyz"


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _blob(span: ReadableSpan) -> str:
    return repr(dict(span.attributes or {})) + span.name + repr(
        [(e.name, dict(e.attributes or {})) for e in span.events]
    )


def test_backstop_cleans_contrib_style_server_spans(telemetry: Capture) -> None:
    tracer = telemetry.tracer_provider.get_tracer("contrib-like")
    with tracer.start_as_current_span(
        "GET /x",
        kind=trace.SpanKind.SERVER,
        attributes={
            "url.query": f"api_key={CANARY}",
            "url.fragment": CANARY,
            "http.target": f"/x?x&q={CANARY}",
            "http.url": f"http://user:{CANARY}@host:1/x?t={CANARY}#{CANARY}",
            "url.full": f"http://host:1/x?{CANARY}",
            "url.path": "/x",
        },
    ) as span:
        try:
            raise ValueError(f"the api_key={CANARY}")
        except ValueError as exc:
            span.record_exception(exc)  # the SDK's raw traceback
    raw = telemetry.spans("GET /x")[0]
    assert CANARY in _blob(raw)  # the attack is real: the SDK span holds it

    inner = _Keep()
    assert ScrubbingSpanExporter(inner).export([raw]) is SpanExportResult.SUCCESS
    clean = inner.spans[0]
    assert CANARY not in _blob(clean) and "c4n4ry" not in _blob(clean)
    attrs = dict(clean.attributes or {})
    assert "url.query" not in attrs and "url.fragment" not in attrs
    assert attrs["http.target"] == "/x" and attrs["url.path"] == "/x"
    assert attrs["http.url"] == "http://REDACTED:REDACTED@host:1/x"
    (event,) = clean.events
    assert "[REDACTED]" in str(event.attributes[names.ATTR_EXCEPTION_STACKTRACE])
    assert clean.context == raw.context and clean.kind == raw.kind and clean.end_time == raw.end_time


def test_backstop_scrubs_the_status_description(telemetry: Capture) -> None:
    tracer = telemetry.tracer_provider.get_tracer("contrib-like")
    with tracer.start_as_current_span("GET /y", kind=trace.SpanKind.SERVER) as span:
        # contrib's ExceptionHandlerMiddleware: "<type>: <message>" of the exception, unscrubbed
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"ValueError: token={CANARY}"))
    raw = telemetry.spans("GET /y")[0]
    assert CANARY in str(raw.status.description)

    clean = scrub_span(raw)
    assert clean.status.status_code == trace.StatusCode.ERROR
    assert str(clean.status.description).startswith("ValueError: token=")
    assert CANARY not in str(clean.status.description) and "c4n4ry" not in str(clean.status.description)


def test_backstop_passes_clean_spans_through_without_copying(telemetry: Capture) -> None:
    tracer = telemetry.tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("ok", attributes={"http.route": "/x", "url.path": "/x"}):
        pass
    span = telemetry.spans("ok")[0]
    assert scrub_span(span) is span


def test_gym_record_exception_scrubs_stacktrace_and_escapes_control_characters(telemetry: Capture) -> None:
    tracer = telemetry.tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("s") as span:
        try:
            raise RuntimeError(f"token={CANARY} \x1b[2J")
        except RuntimeError as exc:
            record_exception(span, exc, {names.ATTR_EXCEPTION_MESSAGE: CANARY, "extra": 1})
    (event,) = telemetry.spans("s")[0].events
    text = repr(dict(event.attributes or {}))
    assert CANARY not in text and "\x1b" not in text
    assert "RuntimeError" in str(event.attributes[names.ATTR_EXCEPTION_STACKTRACE])
    assert event.attributes["extra"] == 1


def test_failure_transport_records_events_with_a_scrubbed_stacktrace(telemetry: Capture) -> None:
    tracer = telemetry.tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("server"), request_failure_log():
        try:
            try:
                raise ConnectionError(f"upstream api_key={CANARY}")
            except ConnectionError as err:
                reason = f"down token={CANARY}"
                raise NgFailureEvent("provider_unavailable", reason, boundary="model") from err
        except NgFailureEvent as event:
            observe_failure(event)
    (event,) = telemetry.spans("server")[0].events
    attrs = dict(event.attributes or {})
    assert names.ATTR_EXCEPTION_STACKTRACE in attrs
    assert attrs[names.ATTR_FAILURE_KIND] == "provider_unavailable"
    assert CANARY not in repr(attrs)


def test_log_lines_never_carry_terminal_escapes_or_secrets() -> None:
    from gym_obs.telemetry.logging import scrub_event

    event = scrub_event(
        None, "warning",
        {"event": f"peer said {CANARY}\x1b[2J", "reason": f"x \x9b31m api_key={CANARY}\nnext", "n": 1},
    )
    text = repr(event)
    assert CANARY not in text and "\x1b" not in event["event"] and "\x9b" not in event["reason"]
    assert event["reason"].endswith("\nnext") and event["n"] == 1


def test_the_backstop_cleans_every_span_of_a_batch_whatever_it_saw_before(telemetry: Capture) -> None:
    """The exporter remembers recent values: a dirty URL seen again, many distinct dirty URLs (more than
    it keeps), an array of URLs and a str subclass are each cleaned every time; gym's own clean CLIENT
    spans pass through as they are."""

    class Text(str):
        pass

    tracer = telemetry.tracer_provider.get_tracer("t")
    dirty = f"http://user:{CANARY}@host:1/x?t={CANARY}"
    for index in range(1500):
        with tracer.start_as_current_span("dirty", attributes={"url.full": f"{dirty}&i={index}"}):
            pass
        with tracer.start_as_current_span("same", attributes={"http.url": dirty, "url.path": "/x"}):
            pass
    with tracer.start_as_current_span("array", attributes={"url.full": (dirty, "http://ok:2/y")}):
        pass
    with tracer.start_as_current_span("clean", attributes={"url.full": "http://127.0.0.1:9/v1/responses"}):
        pass
    raw = telemetry.spans()
    raw[-1]._attributes._dict["http.target"] = Text(f"/x?{CANARY}")  # type: ignore[attr-defined]
    inner = _Keep()
    exporter = ScrubbingSpanExporter(inner)
    for _ in range(2):
        inner.spans.clear()
        assert exporter.export(raw) is SpanExportResult.SUCCESS
        assert len(inner.spans) == len(raw)
        for span in inner.spans:
            assert CANARY not in _blob(span) and "c4n4ry" not in _blob(span)
        by_name = {span.name: span for span in inner.spans}
        assert by_name["same"].attributes["http.url"] == "http://REDACTED:REDACTED@host:1/x"
        assert by_name["array"].attributes["url.full"] == ("http://REDACTED:REDACTED@host:1/x", "http://ok:2/y")
        assert by_name["clean"].attributes["http.target"] == "/x"
    with tracer.start_as_current_span("gym client", attributes={"url.full": "http://127.0.0.1:9/v1"}):
        pass
    (gym_span,) = telemetry.spans("gym client")
    inner.spans.clear()
    exporter.export([gym_span, gym_span])
    assert inner.spans[0] is gym_span and inner.spans[1] is gym_span


def test_a_cleaned_copy_keeps_the_dropped_counts() -> None:
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=3, max_events=1, max_links=1))
    tracer = provider.get_tracer("t")
    link = trace.Link(trace.SpanContext(1, 2, is_remote=True))
    with tracer.start_as_current_span("x", links=[link, link]) as span:
        span.set_attributes({"a": 1, "b": 2, "c": 3, "url.full": f"http://h:1/?{CANARY}"})  # "a" dropped
        span.add_event("one")
        span.add_event("two")
    assert isinstance(span, ReadableSpan)
    clean = scrub_span(span)
    assert clean is not span and CANARY not in _blob(clean)
    assert (clean.dropped_attributes, clean.dropped_events, clean.dropped_links) == (1, 1, 1)
    provider.shutdown()
