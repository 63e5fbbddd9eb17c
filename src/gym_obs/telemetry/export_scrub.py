"""The export-time backstop: every span leaves the process without query strings, credentials or secrets.

gym_obs redacts at the source, but spans also come from code it does not write: the contrib FastAPI/ASGI
instrumentation records ``url.query`` and ``http.target`` with the query and puts ``"<type>: <message>"``
of an exception in the span status description, and the SDK's ``Span.record_exception`` puts the raw
traceback in ``exception.stacktrace``. Every span exporter (OTLP,
console, file) is wrapped by :class:`ScrubbingSpanExporter`, which cleans the few keys that can carry them
on spans and span events. Cheap: only the known keys are looked at, and a span that has none of them is
passed on as is (no copy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

from gym_obs.telemetry import names
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.redaction import redact_url, scrub_text

__all__ = ["ScrubbingSpanExporter", "scrub_attributes", "scrub_span"]

_TEXT_CHARS: Final = 8000  # an exception message or stack trace (gym_obs's own are cut at 4000 already)
_ALL_KEYS: Final = (
    names.SCRUB_URL_KEYS | names.SCRUB_TARGET_KEYS | names.SCRUB_DROPPED_KEYS | names.SCRUB_TEXT_KEYS
)


def _clean_value(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if key in names.SCRUB_TEXT_KEYS:
        return bounded_excerpt(value, _TEXT_CHARS)
    return redact_url(value)  # http.target is a path (+query): redact_url handles the relative form too


def scrub_attributes(attributes: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``attributes`` without ``url.query``/``url.fragment`` and with URLs, targets and exception texts
    cleaned; the same object when none of those keys is present."""
    if not attributes or _ALL_KEYS.isdisjoint(attributes.keys()):
        return attributes
    cleaned: dict[str, Any] = {}
    for key, value in attributes.items():
        if key in names.SCRUB_DROPPED_KEYS:
            continue
        cleaned[key] = _clean_value(key, value) if key in _ALL_KEYS else value
    return cleaned


def _scrub_events(events: Sequence[Event]) -> Sequence[Event] | None:
    """The events with cleaned attributes, or ``None`` when no event needed it."""
    out: list[Event] | None = None
    for index, event in enumerate(events):
        original = event.attributes  # a property: read once, compare by identity
        attributes = scrub_attributes(original)
        if attributes is original:
            if out is not None:
                out.append(event)
            continue
        if out is None:
            out = list(events[:index])
        out.append(Event(event.name, attributes, timestamp=event.timestamp, limit=None))
    return out


def scrub_span(span: ReadableSpan) -> ReadableSpan:
    """``span`` as it may leave the process (a cleaned copy, or the span itself when it is clean)."""
    original = span.attributes  # a new read-only view on every access: read once, compare by identity
    attributes = scrub_attributes(original)
    events = _scrub_events(span.events)
    name = span.name
    if "?" in name or "#" in name:  # a span named after a raw URL with a query
        name = name.split("?", 1)[0].split("#", 1)[0]
    status = span.status
    description = status.description
    if description:  # only failed spans have one: the exception's message, as contrib writes it
        clean = bounded_excerpt(scrub_text(description), _TEXT_CHARS)
        if clean != description:
            status = Status(status.status_code, clean)
    if attributes is original and events is None and name == span.name and status is span.status:
        return span
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=events if events is not None else span.events,
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class ScrubbingSpanExporter(SpanExporter):
    """Cleans every span (see the module doc) before handing the batch to ``inner``."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export([scrub_span(span) for span in spans])

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))
