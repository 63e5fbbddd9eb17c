"""The export-time backstop: every span leaves the process without query strings, credentials or secrets.

gym_obs redacts at the source, but spans also come from code it does not write: the contrib FastAPI/ASGI
instrumentation records ``url.query`` and ``http.target`` with the query and puts ``"<type>: <message>"``
of an exception in the span status description, and the SDK's ``Span.record_exception`` puts the raw
traceback in ``exception.stacktrace``. Every span exporter (OTLP,
console, file) is wrapped by :class:`ScrubbingSpanExporter`, which cleans the few keys that can carry them
on spans and span events. Cheap: only the known keys are looked at, recent values are remembered (gym's own
CLIENT spans repeat a few URLs, already redacted at the source), and a span that needs no change is passed
on as is (no copy).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

from gym_obs.telemetry import names
from gym_obs.telemetry._otlp_json import plain_attributes, span_attributes, span_events
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.redaction import redact_url, scrub_text

__all__ = ["ScrubbingSpanExporter", "scrub_attributes", "scrub_span"]

_TEXT_CHARS: Final = 8000  # an exception message or stack trace (gym_obs's own are cut at 4000 already)
_ALL_KEYS: Final = (
    names.SCRUB_URL_KEYS | names.SCRUB_TARGET_KEYS | names.SCRUB_DROPPED_KEYS | names.SCRUB_TEXT_KEYS
)


class _Cleaner:
    """Cleans attribute values, remembering recent results: gym's own spans carry the same few URLs on
    every span (already redacted at the source), so after the first one a value costs a dict lookup.
    Bounded (cleared when full; long values are not kept); a result is the same with or without it."""

    __slots__ = ("_known",)

    _MAX_ENTRIES: Final = 1024
    _MAX_CHARS: Final = 2048

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], str] = {}

    def value(self, key: str, value: Any) -> Any:
        if isinstance(value, tuple | list):  # an array attribute: each string in it
            cleaned = [self.value(key, item) for item in value]
            return value if all(a is b for a, b in zip(cleaned, value, strict=True)) else tuple(cleaned)
        if not isinstance(value, str):
            return value
        exact = type(value) is str  # a str subclass may hash or compare as it likes: never looked up
        known = self._known.get((key, value)) if exact else None
        if known is not None:
            return known
        clean = bounded_excerpt(value, _TEXT_CHARS) if key in names.SCRUB_TEXT_KEYS else redact_url(value)
        if exact and len(value) <= self._MAX_CHARS:  # http.target is a path (+query): redact_url handles it
            if len(self._known) >= self._MAX_ENTRIES:
                self._known.clear()
            self._known[(key, value)] = clean
        return value if clean == value and exact else clean

    def attributes(self, attributes: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """``attributes`` without ``url.query``/``url.fragment`` and with URLs, targets and exception texts
        cleaned; the same object when nothing had to change."""
        if not attributes:
            return attributes
        present = [key for key in _ALL_KEYS_LIST if key in attributes]  # 7 lookups, not one per attribute
        if not present:
            return attributes
        changed: dict[str, Any] | None = None
        for key in present:
            value = attributes[key]
            clean = _DROP if key in names.SCRUB_DROPPED_KEYS else self.value(key, value)
            if clean is not value and clean != value:
                if changed is None:
                    changed = {}
                changed[key] = clean
        if changed is None:
            return attributes
        return {
            key: changed.get(key, value)
            for key, value in attributes.items()
            if changed.get(key) is not _DROP
        }


_DROP: Final = object()
_ALL_KEYS_LIST: Final = tuple(sorted(_ALL_KEYS))


def scrub_attributes(attributes: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``attributes`` without ``url.query``/``url.fragment`` and with URLs, targets and exception texts
    cleaned; the same object when none of those keys needed a change."""
    return _Cleaner().attributes(attributes)


def _scrub_events(events: Sequence[Event], cleaner: _Cleaner) -> list[Event] | None:
    """The events with cleaned attributes, or ``None`` when no event needed it."""
    out: list[Event] | None = None
    for index, event in enumerate(events):
        original = plain_attributes(event.attributes)
        attributes = cleaner.attributes(original)
        if attributes is original:
            if out is not None:
                out.append(event)
            continue
        if out is None:
            out = list(itertools.islice(events, index))
        out.append(Event(event.name, attributes, timestamp=event.timestamp, limit=None))
    return out


def scrub_span(span: ReadableSpan, cleaner: _Cleaner | None = None) -> ReadableSpan:
    """``span`` as it may leave the process (a cleaned copy, or the span itself when it is clean)."""
    cleaner = cleaner or _Cleaner()
    original = span_attributes(span)  # the SDK's dict, not a new read-only view per access
    attributes = cleaner.attributes(original)
    events, _ = span_events(span)
    scrubbed_events = _scrub_events(events, cleaner) if events else None
    name = span.name
    if "?" in name or "#" in name:  # a span named after a raw URL with a query
        name = name.split("?", 1)[0].split("#", 1)[0]
    status = span.status
    description = status.description
    if description:  # only failed spans have one: the exception's message, as contrib writes it
        clean = bounded_excerpt(scrub_text(description), _TEXT_CHARS)
        if clean != description:
            status = Status(status.status_code, clean)
    if attributes is original and scrubbed_events is None and name == span.name and status is span.status:
        return span
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        # what did not change is passed as the SDK holds it, so its dropped counts travel on
        attributes=getattr(span, "_attributes", attributes) if attributes is original else _counted(
            attributes, span.dropped_attributes
        ),
        events=getattr(span, "_events", span.events) if scrubbed_events is None else scrubbed_events,
        links=getattr(span, "_links", span.links),
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _counted(attributes: Mapping[str, Any] | None, dropped: int) -> Mapping[str, Any] | None:
    """Cleaned attributes that still say how many the SDK dropped (only then: building ``BoundedAttributes``
    validates every value again)."""
    if not dropped:
        return attributes
    bounded = BoundedAttributes(attributes=attributes, immutable=True)
    bounded.dropped += dropped
    return bounded


class ScrubbingSpanExporter(SpanExporter):
    """Cleans every span (see the module doc) before handing the batch to ``inner``."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._cleaner = _Cleaner()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        cleaner = self._cleaner
        return self._inner.export([scrub_span(span, cleaner) for span in spans])

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))
