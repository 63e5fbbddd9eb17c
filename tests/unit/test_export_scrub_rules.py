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
