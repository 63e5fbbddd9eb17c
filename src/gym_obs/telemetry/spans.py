"""Client spans and span helpers that are safe by construction.

``client_span`` is the one way gym_obs starts a CLIENT span: URLs are redacted on the way in, exceptions are
recorded with scrubbed, bounded messages, a caller's cancellation is not an error, and the span always ends.
With telemetry off it costs one flag check and yields the shared no-op span.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from time import time_ns
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, _Span
from opentelemetry.sdk.trace import Tracer as _SdkTracer
from opentelemetry.sdk.trace import logger as _sdk_logger
from opentelemetry.sdk.trace._tracer_metrics import noop as _noop
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, StaticSampler, TraceIdRatioBased
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.version import __version__ as _sdk_version
from opentelemetry.trace import (
    INVALID_SPAN,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

from gym_obs.telemetry import names
from gym_obs.telemetry._exemplars import DIRECT_SPAN_TYPES
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry._types import AttributeValue
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.redaction import redact_url, scrub_text
from gym_obs.telemetry.span_batches import compact_batches, queue_ended

__all__ = [
    "CLIENT_KIND",
    "INTERNAL_KIND",
    "SERVER_KIND",
    "client_span",
    "current_ids",
    "record_exception",
    "set_span_error",
    "set_trusted_attributes",
    "start_trusted_span",
]

# The span kinds, for per-request paths: a member read off its enum class costs ~50 ns on Python 3.11
# (timeit: 53 ns, against 5 ns for a module constant).
CLIENT_KIND: Final = SpanKind.CLIENT
INTERNAL_KIND: Final = SpanKind.INTERNAL
SERVER_KIND: Final = SpanKind.SERVER

_EXCEPTION_MESSAGE_CHARS: Final = 1000
_EXCEPTION_STACK_CHARS: Final = 4000


@contextmanager
def client_span(name: str, **attributes: AttributeValue | None) -> Iterator[Span]:
    """Start a CLIENT span named ``name`` as the current span; end it when the block exits.

    Attributes are passed as keywords (``**{names.ATTR_URL_FULL: url}``); ``None`` values are dropped and
    ``url.full`` is redacted. An exception is recorded and sets ERROR status (and ``error.type`` unless the
    block set it); ``asyncio.CancelledError`` ends the span without error status.
    """
    tracer = STATE.tracer
    if not (STATE.enabled and STATE.traces_enabled) or tracer is None:
        yield INVALID_SPAN
        return
    clean: dict[str, AttributeValue] = {}
    for key, value in attributes.items():
        if value is not None:
            clean[key] = _clean_attribute(key, value)
    span = tracer.start_span(name, kind=CLIENT_KIND, attributes=clean)
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        record_exception(span, exc)
        attrs = getattr(span, "attributes", None)
        if attrs is None or names.ATTR_ERROR_TYPE not in attrs:
            set_span_error(span, type(exc).__qualname__)
        else:
            span.set_status(Status(StatusCode.ERROR))
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _clean_attribute(key: str, value: AttributeValue) -> AttributeValue:
    """``url.full`` is redacted; any other string that holds a URL (``http.url``, a free-text note) loses
    its credentials and query too. A string without ``://`` passes untouched (one substring check)."""
    if key == names.ATTR_URL_FULL:
        return redact_url(str(value))
    if isinstance(value, str) and "://" in value:
        return scrub_text(value)
    return value


def record_exception(
    span: Span, exc: BaseException, attributes: Mapping[str, AttributeValue] | None = None
) -> None:
    """Add an ``exception`` event whose message and stack trace are scrubbed, bounded and have their
    control characters escaped, as log lines are (the SDK's ``record_exception`` writes the raw traceback,
    where the secret an exception message held is repeated). ``attributes`` are added to the event; they
    cannot replace the scrubbed message or stack trace."""
    if not span.is_recording():
        return
    try:
        stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        event: dict[str, AttributeValue] = dict(attributes) if attributes else {}
        event[names.ATTR_EXCEPTION_MESSAGE] = bounded_excerpt(str(exc), _EXCEPTION_MESSAGE_CHARS)
        event[names.ATTR_EXCEPTION_STACKTRACE] = bounded_excerpt(stack, _EXCEPTION_STACK_CHARS)
        span.record_exception(exc, attributes=event)
    except Exception:
        span.add_event(names.SPAN_EVENT_EXCEPTION, {names.ATTR_EXCEPTION_TYPE: type(exc).__qualname__})


def set_trusted_attributes(span: Span, attributes: Mapping[str, AttributeValue]) -> None:
    """Set attributes gym_obs built itself (str, int, bool, tuples of str; bounded) on a hot path.

    The SDK's ``set_attributes`` re-validates every value (about half a microsecond each); these were made
    valid at the source, so on an SDK span with the default limits (a count limit, no value-length limit)
    they go into its attribute store under the span's lock, as ``set_attributes`` would put them. Any
    other span, or limits that could change a value, takes the public path. The SDK's own span classes
    (``DIRECT_SPAN_TYPES``) are read directly; another class only through ``getattr``.
    """
    direct = type(span) in DIRECT_SPAN_TYPES
    if direct:
        store: Any = span._attributes  # type: ignore[attr-defined]
        lock: Any = span._lock  # type: ignore[attr-defined]
    else:
        store = getattr(span, "_attributes", None)
        lock = getattr(span, "_lock", None)
    items = _plain_store(store, len(attributes))
    if items is None or lock is None:
        span.set_attributes(attributes)
        return
    lock.acquire()  # not ``with``: that looks up and binds __enter__ and __exit__ each time
    try:
        ended = span._end_time if direct else getattr(span, "end_time", None)  # type: ignore[attr-defined]
        if ended is None:  # ended: the SDK would only log that it has
            items.update(attributes)
    finally:
        lock.release()


def _plain_store(store: Any, adding: int) -> dict[str, Any] | None:
    """The plain dict inside an SDK attribute store that can take ``adding`` more valid attributes exactly
    as they are (its limits cannot change a value or drop one: a count limit they fit in, no value-length
    limit), else None: the public path, which applies the limits."""
    if type(store) is not BoundedAttributes:
        return None
    items = store._dict
    maxlen = store.maxlen
    if type(items) is not dict or store.max_value_len is not None or maxlen is None:
        return None
    return items if len(items) + adding <= maxlen else None


# The SDK samplers whose decision never reads a span's attributes (they only carry them over).
_BLIND_SAMPLE_METHODS: Final = (StaticSampler.should_sample, TraceIdRatioBased.should_sample)
_PARENT_BASED_DELEGATES: Final = (
    "_root",
    "_remote_parent_sampled",
    "_remote_parent_not_sampled",
    "_local_parent_sampled",
    "_local_parent_not_sampled",
)
# The sampler last looked at, and whether it is attribute-blind (see _attribute_blind).
_blind_checked: tuple[object, bool] = (None, False)


def _is_blind(sampler: object, depth: int = 0) -> bool:
    """Whether ``sampler`` decides without reading attributes: the SDK's static and ratio samplers, and
    ``ParentBased`` over such samplers. A subclass that overrides ``should_sample`` (or any other sampler)
    may read them, so it is not blind."""
    method = getattr(type(sampler), "should_sample", None)
    if method in _BLIND_SAMPLE_METHODS:
        return True
    if method is not ParentBased.should_sample or depth > 3:
        return False
    delegates = [getattr(sampler, name, None) for name in _PARENT_BASED_DELEGATES]
    return all(d is not None and _is_blind(d, depth + 1) for d in delegates)


def _attribute_blind(tracer: Tracer) -> bool:
    global _blind_checked
    sampler = getattr(tracer, "sampler", None)
    checked, blind = _blind_checked
    if sampler is not checked:
        blind = sampler is not None and _is_blind(sampler)
        _blind_checked = (sampler, blind)
    return blind


def start_trusted_span(
    tracer: Tracer,
    name: str,
    context: Context | None,
    kind: SpanKind,
    attributes: Mapping[str, AttributeValue],
    start_time: int | None = None,
) -> Span:
    """``tracer.start_span`` for a hot path whose ``attributes`` gym_obs built itself (valid and bounded,
    as for :func:`set_trusted_attributes`): the same span, for less.

    The SDK cleans every attribute given at start (several k instructions each). A child of a sampled
    parent, or a root, under the SDK's default sampler (every gym hop's CLIENT span, a rollout's first
    span) is started by :func:`_sampled_span`, with the attributes in place before span processors see it;
    otherwise, when the sampler cannot look at attributes (the SDK's static, ratio and parent-based
    samplers), the span is started without them and they are put in its store in one go, as ``gym_obs``'
    SERVER span does. A sampler that may read them gets them at start, as before.
    """
    span = _sampled_span(tracer, name, context, kind, attributes, start_time)
    if span is not None:
        return span
    if not _attribute_blind(tracer):
        return tracer.start_span(name, context, kind, attributes, start_time=start_time)
    span = tracer.start_span(name, context, kind, start_time=start_time)
    set_trusted_attributes(span, attributes)
    return span


# SDK releases whose ``Tracer.start_span`` _sampled_span was checked against, step by step (tests compare
# the two spans); any other release takes ``start_span`` itself.
_CHECKED_SDK_RELEASES: Final = ("1.45.",)
_FAST_SDK: Final = _sdk_version.startswith(_CHECKED_SDK_RELEASES)
_TRACER_FIELDS: Final = (
    "sampler",
    "resource",
    "span_processor",
    "id_generator",
    "instrumentation_info",
    "_span_limits",
    "_instrumentation_scope",
    "_tracer_config",
    "_tracer_metrics",
)
# Tracers looked at (by id, kept alive so an id stays theirs) and whether each has every field _sampled_span
# reads: a process may use several (the harness driver's own and the client's), each checked once.
_tracers_checked: dict[int, tuple[object, bool]] = {}
_MAX_TRACERS_CHECKED: Final = 64
_RECORD_AND_SAMPLE: Final = Decision.RECORD_AND_SAMPLE  # every such span needs it (read once, as the kinds)
# A sampled span's trace flags, by whether its trace id is random (the SDK's start_span sets no other).
_SAMPLED_FLAGS: Final = (
    TraceFlags(TraceFlags.SAMPLED),
    TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID),
)


class _LeanSpan(_Span):
    """The SDK's span, as :func:`_sampled_span` makes it, whose event and link lists are made on first use:
    most hot-path spans have neither, and each list is three objects (a ``BoundedList``, its deque and its
    lock) made, and tracked by the garbage collector, for every span. Until then both are the empty tuple,
    which the SDK's readers (``events``, ``links``, the dropped counts, the ended copy) take as they take an
    empty list. Under gym_obs's own batch processors alone it also ends without the SDK's processor calls
    (:meth:`end`)."""

    def _new_events(self) -> Any:
        return ()

    def _new_links(self, links: Any) -> Any:
        return super()._new_links(links) if links else ()

    def _add_event(self, event: Any) -> None:
        with self._lock:  # made under the lock: two threads adding the first event make one list
            if self._end_time is None and type(self._events) is tuple:
                self._events = BoundedList(self._limits.max_events)
        super()._add_event(event)  # the SDK's own ended check and append

    def _add_link(self, link: Any) -> None:
        with self._lock:
            if self._end_time is None and type(self._links) is tuple:
                self._links = BoundedList(self._limits.max_links)
        super()._add_link(link)

    def end(self, end_time: int | None = None) -> None:
        """``Span.end``'s steps, with the ended copy queued by :func:`queue_ended` when gym_obs's batch
        processors are the only ones (they do nothing while a span ends); else the SDK's own."""
        batches = compact_batches(self._span_processor)
        if batches is None:
            super().end(end_time)
            return
        lock = self._lock
        lock.acquire()
        try:
            if self._start_time is None:
                raise RuntimeError("Calling end() on a not started span.")
            if self._end_time is not None:
                _sdk_logger.warning("Calling end() on an ended span.")
                return
            self._end_time = end_time if end_time is not None else time_ns()
            self._attributes._immutable = True  # type: ignore[union-attr]
        finally:
            lock.release()
        record_end_metrics = self._record_end_metrics
        if record_end_metrics is not None and record_end_metrics is not _noop:
            record_end_metrics()
        queue_ended(self, batches)


DIRECT_SPAN_TYPES.add(_LeanSpan)  # its fields are the SDK span's
_new_span: Final = object.__new__
_new_lock: Final = threading.Lock
# The status every SDK span starts with: ``ReadableSpan.__init__``'s default, one shared object.
_UNSET_STATUS: Final = inspect.signature(ReadableSpan.__init__).parameters["status"].default


def _always_samples(sampler: object) -> bool:
    return (
        getattr(type(sampler), "should_sample", None) is StaticSampler.should_sample
        and getattr(sampler, "_decision", None) is Decision.RECORD_AND_SAMPLE
    )


def _sampled_span(
    tracer: Tracer,
    name: str,
    context: Context | None,
    kind: SpanKind,
    attributes: Mapping[str, AttributeValue],
    start_time: int | None,
) -> Span | None:
    """The SDK ``Tracer.start_span``'s steps for its most common cases, else None: a valid sampled parent,
    or none (a root), under a ``ParentBased`` sampler that always samples such a span (the default,
    ``parentbased_always_on``).

    ``start_span`` asks the sampler (three look-ups of the parent and two result objects to learn what the
    parent's flags already say) and cleans every attribute; here the decision is read from the parent (or
    the root sampler) and the attributes, valid at the source, are put in place before ``span.start`` (so
    span processors see them at start, as with ``start_span``). Everything else is what ``start_span``
    does, in its order: the same span context (the parent's trace id and trace state, or a new trace id and
    none; a new span id), the tracer's metrics, the span's fields, ``start``.
    """
    if not _FAST_SDK or type(tracer) is not _SdkTracer:
        return None
    checked = _tracers_checked.get(id(tracer))
    if checked is None or checked[0] is not tracer:
        if len(_tracers_checked) >= _MAX_TRACERS_CHECKED:
            _tracers_checked.clear()
        checked = _tracers_checked[id(tracer)] = (tracer, all(hasattr(tracer, f) for f in _TRACER_FIELDS))
    if not checked[1]:
        return None
    sdk_tracer: Any = tracer
    sampler = sdk_tracer.sampler
    if type(sampler).should_sample is not ParentBased.should_sample:
        return None
    parent: SpanContext | None = trace.get_current_span(context).get_span_context()
    assert parent is not None  # (an API span's context is never None)
    if parent.is_valid:
        flags = parent.trace_flags
        if not flags & TraceFlags.SAMPLED:
            return None
        delegate = getattr(
            sampler, "_remote_parent_sampled" if parent.is_remote else "_local_parent_sampled", None
        )
        random_trace_id = flags & TraceFlags.RANDOM_TRACE_ID
    else:  # a root: the root sampler decides
        parent = None
        delegate = getattr(sampler, "_root", None)
    if not _always_samples(delegate) or not sdk_tracer._tracer_config.is_enabled:
        return None
    id_generator = sdk_tracer.id_generator
    if parent is None:  # a new trace; the id generator says whether its id is random
        trace_id = id_generator.generate_trace_id()
        trace_state = None
        random_trace_id = id_generator.is_trace_id_random()
    else:
        trace_id = parent.trace_id
        trace_state = parent.trace_state
    span_context = SpanContext(
        trace_id,
        id_generator.generate_span_id(),
        is_remote=False,
        trace_flags=_SAMPLED_FLAGS[1 if random_trace_id else 0],
        trace_state=trace_state,
    )
    record_end_metrics = sdk_tracer._tracer_metrics.start_span(parent, _RECORD_AND_SAMPLE)
    processor = sdk_tracer.span_processor
    limits = sdk_tracer._span_limits
    # ``_LeanSpan(...)``: the fields ``Span.__init__`` sets (``ReadableSpan``'s, then the span's own), set
    # here without its chain of calls and keyword binding; its attribute store is made as it makes it.
    span: Any = _new_span(_LeanSpan)
    span._name = name
    span._context = span_context
    span._kind = kind
    span._instrumentation_info = sdk_tracer.instrumentation_info
    span._instrumentation_scope = sdk_tracer._instrumentation_scope
    span._parent = parent
    span._start_time = None
    span._end_time = None
    span._resource = sdk_tracer.resource
    span._status = _UNSET_STATUS
    span._sampler = sampler
    span._trace_config = None
    span._record_exception = True
    span._set_status_on_exception = True
    span._span_processor = processor
    span._limits = limits
    span._lock = _new_lock()
    store = span._attributes = BoundedAttributes(
        limits.max_span_attributes, None, immutable=False, max_value_len=limits.max_span_attribute_length
    )
    span._events = ()
    span._links = ()
    span._record_end_metrics = record_end_metrics
    # Nobody else holds the span before ``start``: the store takes the attributes without its lock, when
    # its limits cannot change a value or drop one (else the public path, which applies them).
    items = _plain_store(store, len(attributes))
    if items is not None:
        items.update(attributes)
    else:
        span.set_attributes(attributes)
    if compact_batches(processor) is None:
        span.start(start_time=start_time, parent_context=context)
    else:  # ``start``'s steps: gym_obs's batch processors do nothing when a span starts
        span._start_time = start_time if start_time is not None else time_ns()
    made: Span = span
    return made


def set_span_error(span: Span, error_type: str) -> None:
    """Mark ``span`` failed with a low-cardinality ``error.type`` (a class name or status code)."""
    if not span.is_recording():
        return
    error_type = scrub_text(error_type) or names.ERROR_TYPE_OTHER
    span.set_attribute(names.ATTR_ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, error_type))


def current_ids() -> tuple[str | None, str | None]:
    """(trace_id as 32 hex digits, span_id as 16 hex digits) of the current valid span, else (None, None)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
