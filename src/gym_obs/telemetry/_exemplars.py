"""The exemplar filter: an exemplar only where this process records the span it would point to.

Why: the SDK's default (``trace_based``) offers every measurement made under a *sampled context* to the
exemplar reservoir -- also when this process records no span there (a sampled ``traceparent`` arrived but
the span group is off, or only the remote parent is current). That is reservoir work on the request path
for an exemplar whose span id leads nowhere. With tracing off in the process, no measurement is eligible,
decided once at set-up. ``OTEL_METRICS_EXEMPLAR_FILTER``, when set, is the user's choice and wins.

:func:`exemplar_sampler` turns the meter provider's filter (whichever it is) into the one call the
pre-aggregated instruments make per measurement: it answers the filter's question and returns the span
context the exemplar points to in the same step, so a measurement pays one context lookup, not two.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry.context import Context, get_current
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    ExemplarFilter,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.trace import _Span as _SdkSpan
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanContext,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.util.types import Attributes

__all__ = [
    "DIRECT_SPAN_TYPES",
    "SPAN_KEY",
    "ExemplarSampler",
    "RecordedSpanExemplarFilter",
    "current_context",
    "current_recorded_span",
    "exemplar_filter",
    "exemplar_sampler",
    "span_answer",
    "span_in",
]

ENV_EXEMPLAR_FILTER: Final = "OTEL_METRICS_EXEMPLAR_FILTER"

#: (value, attributes, context) -> the span context an exemplar of this measurement points to (an invalid
#: one: an exemplar without ids), or None: no exemplar.
ExemplarSampler = Callable[[float, Attributes, Context | None], SpanContext | None]
#: A filter's answer for measurements made under a given current span (an object: any value a context holds).
SpanAnswer = Callable[[object], SpanContext | None]


#: Span classes whose fields hot paths read directly (span context, kind, scope, attributes, lock, end time):
#: the SDK's own, and subclasses that keep those fields as it does (each added where it is defined).
DIRECT_SPAN_TYPES: Final[set[type]] = {_SdkSpan}

# The context key the current span lives under, found through the public API (``set_span_in_context``
# writes exactly one key), so the samplers read the span with one dict lookup.
(SPAN_KEY,) = set_span_in_context(INVALID_SPAN, Context()).keys()
_NOTHING: Final = object()


def _context_getter() -> Callable[[], Context]:
    """``opentelemetry.context.get_current`` without its two Python frames where the runtime context is the
    SDK's default (contextvars) one: that ContextVar's ``get`` (the one API-internal read; any other runtime
    context, or another layout, gets the public function)."""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and isinstance(var, ContextVar):
        return var.get
    return get_current


current_context: Final = _context_getter()


def span_in(context: Context | None = None) -> object:
    """What ``context`` (default: the current one) holds as its span: a span, or None (one dict lookup)."""
    return (current_context() if context is None else context).get(SPAN_KEY)


def _learn(kind: type) -> tuple[bool, bool]:
    """(a span at all, a span this process records), for a type seen for the first time."""
    known = (issubclass(kind, Span), issubclass(kind, Span) and not issubclass(kind, NonRecordingSpan))
    if len(_SPAN_TYPES) < 64:  # span types are few; an odd caller cannot grow this
        _SPAN_TYPES[kind] = known
    return known


# span type -> (a Span at all, one this process records: an SDK span rather than a NonRecordingSpan, which
# is no span, a bare remote parent or an unsampled one): decided once per type, not per point.
_SPAN_TYPES: dict[type, tuple[bool, bool]] = {}


def current_recorded_span(context: Context | None = None) -> Span | None:
    """The current span when it is one this process records (an SDK span, ended or not), else None; the
    cheap form of ``get_current_span()`` plus a recording check, for per-request hot paths."""
    span = (current_context() if context is None else context).get(SPAN_KEY)
    known = _SPAN_TYPES.get(type(span)) or _learn(type(span))
    return span if known[1] else None  # type: ignore[return-value]


# Where a ``SpanContext`` (a tuple whose properties index it: each a Python call) keeps its trace flags and
# validity; read by position on hot paths when a probe shows the API lays it out so.
_FLAGS_AT: Final = 3
_VALID_AT: Final = 5


def _fields_by_position() -> bool:
    probe = SpanContext(1, 2, False, TraceFlags(TraceFlags.SAMPLED))
    return (
        isinstance(probe, tuple)
        and len(probe) > _VALID_AT
        and probe[_FLAGS_AT] is probe.trace_flags
        and probe[_VALID_AT] is probe.is_valid is True
    )


_BY_POSITION: Final = _fields_by_position()


def _recorded(span: object) -> SpanContext | None:
    """``span``'s context when it is a sampled span of this process, else None (gym's filter)."""
    kind = type(span)
    if kind in DIRECT_SPAN_TYPES:  # what the SDK's tracer makes: its context read directly (two calls fewer)
        span_context: SpanContext = span._context  # type: ignore[attr-defined]
    elif (_SPAN_TYPES.get(kind) or _learn(kind))[1]:
        span_context = span.get_span_context()  # type: ignore[attr-defined]
    else:
        return None
    flags = span_context[_FLAGS_AT] if _BY_POSITION else span_context.trace_flags
    return span_context if flags & 1 else None


def _sampled(span: object) -> SpanContext | None:
    """The SDK's ``trace_based`` rule: any sampled span context, a remote parent's included."""
    kind = type(span)
    if kind in DIRECT_SPAN_TYPES:
        span_context: SpanContext = span._context  # type: ignore[attr-defined]
    elif (_SPAN_TYPES.get(kind) or _learn(kind))[0]:
        span_context = span.get_span_context()  # type: ignore[attr-defined]
    else:
        return None
    if _BY_POSITION:
        flags, valid = span_context[_FLAGS_AT], span_context[_VALID_AT]
    else:
        flags, valid = span_context.trace_flags, span_context.is_valid
    return span_context if valid and flags & 1 else None


def _any(span: object) -> SpanContext | None:
    """``always_on``: every measurement, with the span's ids when there is one."""
    return (span if isinstance(span, Span) else INVALID_SPAN).get_span_context()


def _per_span(answer: SpanAnswer) -> ExemplarSampler:
    """A sampler that asks ``answer`` about the current span once per span: the points of one request are
    measured under the same span, so every point after its first costs two dict lookups and an identity
    test. (A span's answer never changes; the one span remembered is kept alive until the next.)"""
    last: tuple[object, SpanContext | None] = (_NOTHING, None)

    def sample(value: float, attributes: Attributes, context: Context | None) -> SpanContext | None:
        nonlocal last
        span = (current_context() if context is None else context).get(SPAN_KEY)
        seen = last  # one read: another thread may replace it, never half of it
        if seen[0] is span:
            return seen[1]
        found = answer(span)
        last = (span, found)
        return found

    return sample


class RecordedSpanExemplarFilter(ExemplarFilter):
    """Eligible when the measurement's current span is a sampled span of this process (a real SDK span,
    ended or not), never for a bare remote parent, an unsampled span or no span."""

    def should_sample(
        self, value: float, time_unix_nano: int, attributes: Attributes, context: Context
    ) -> bool:
        return _recorded(span_in(context)) is not None


def exemplar_filter(tracing: bool, env: Mapping[str, str]) -> ExemplarFilter | None:
    """The filter for gym_obs's meter provider; None leaves the choice to the SDK (the variable is set)."""
    if env.get(ENV_EXEMPLAR_FILTER, "").strip():
        return None
    return RecordedSpanExemplarFilter() if tracing else AlwaysOffExemplarFilter()


def span_answer(chosen: ExemplarFilter | None) -> SpanAnswer | None:
    """What ``chosen`` answers for a measurement made under a given current span, for the SDK's three filters
    and gym's (their answer depends on that span alone); None for any other filter (or none)."""
    if type(chosen) is RecordedSpanExemplarFilter:
        return _recorded
    if type(chosen) is TraceBasedExemplarFilter:
        return _sampled
    if type(chosen) is AlwaysOnExemplarFilter:
        return _any
    return None


def exemplar_sampler(chosen: ExemplarFilter | None) -> ExemplarSampler | None:
    """The per-measurement sampler that does what ``chosen`` decides; None when no measurement is eligible.

    The SDK's three filters and gym's get a direct implementation; any other filter is asked as the SDK
    would ask it (``should_sample`` with the measurement's value, time, attributes and context).
    """
    if chosen is None or isinstance(chosen, AlwaysOffExemplarFilter):
        return None
    answer = span_answer(chosen)
    if answer is not None:
        return _per_span(answer)
    should_sample = chosen.should_sample

    def ask(value: float, attributes: Attributes, context: Context | None) -> SpanContext | None:
        current = context if context is not None else get_current()
        if not should_sample(value, time.time_ns(), attributes, current):
            return None
        return get_current_span(current).get_span_context()

    return ask
