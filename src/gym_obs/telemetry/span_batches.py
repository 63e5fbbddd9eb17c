"""The span processor gym_obs's own exporters sit behind: the SDK's batch processor, with each queued span
held in fewer objects.

An ended span waits in the batch queue for its export (up to a batch, ~0.1 s in a busy server). The copy
the SDK hands to processors keeps its attributes in a ``BoundedAttributes`` and its events and links in two
``BoundedList``s, each with a lock and a deque: ten objects the garbage collector tracks per queued span,
which live long enough to reach the oldest generation. A saturated agent queues thousands of spans a
second, so they drove most of the full collections telemetry added (each walks the whole heap). Once the
span has ended none of those containers can change: the copy keeps the plain dict and tuples they hold
(two tracked objects per span; a dict of str/int/bool values is not tracked at all). What exporters read is
unchanged: ``attributes``, ``events``, ``links`` and the dropped counts (a container that dropped anything
is kept as it is, so its count travels on).

When these processors are the only ones, a trusted child span (``spans.start_trusted_span``) skips the
SDK's processor calls, which do nothing here: :func:`queue_ended` builds its ended copy compact and queues it.
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util import BoundedList

__all__ = ["CompactBatchSpanProcessor", "compact_batches", "compact_ended_span", "queue_ended"]

_NONE: Final[tuple[Any, ...]] = ()
_new_readable: Final = object.__new__


def compact_ended_span(span: ReadableSpan) -> None:
    """Swap the SDK containers of ``span`` (the read-only copy ``Span.end`` makes for processors) for the
    plain dict and tuples inside them, where nothing was dropped. Any other span type is left alone."""
    if type(span) is not ReadableSpan:
        return
    span._attributes = _plain_attributes(span._attributes)
    span._events = _plain(span._events)
    span._links = _plain(span._links)


def _plain_attributes(attributes: Any) -> Any:
    if type(attributes) is BoundedAttributes and not attributes.dropped:
        items = getattr(attributes, "_dict", None)
        if type(items) is dict:
            return items
    return attributes


def _plain(items: Any) -> Any:
    if type(items) is not BoundedList or items.dropped:
        return items
    queue = getattr(items, "_dq", None)
    if queue is None:
        return items
    return tuple(queue) if queue else _NONE


class CompactBatchSpanProcessor(BatchSpanProcessor):
    """``BatchSpanProcessor`` compacting each ended span (:func:`compact_ended_span`) before it is queued."""

    def on_end(self, span: ReadableSpan) -> None:
        compact_ended_span(span)
        super().on_end(span)


# The span processor last looked at, its processors then, and what compact_batches answered.
_batches_checked: tuple[object, object, tuple[CompactBatchSpanProcessor, ...] | None] = (None, None, None)


def compact_batches(processor: object) -> tuple[CompactBatchSpanProcessor, ...] | None:
    """The processors behind a tracer provider's ``processor`` when every one is exactly a
    :class:`CompactBatchSpanProcessor` (gym_obs's own exporters, as ``setup_telemetry`` builds them), else
    None. Such processors do nothing at a span's start or while it ends, and each queues the same ended copy:
    what :func:`queue_ended` does for them. Checked again when a processor is added."""
    global _batches_checked
    processors = getattr(processor, "_span_processors", None)
    checked, seen, batches = _batches_checked
    if processor is checked and processors is seen:
        return batches
    batches = None
    if (
        type(processor) is SynchronousMultiSpanProcessor
        and type(processors) is tuple
        and processors
        and all(type(each) is CompactBatchSpanProcessor for each in processors)
    ):
        batches = processors
    _batches_checked = (processor, processors, batches)
    return batches


def queue_ended(span: Any, batches: tuple[CompactBatchSpanProcessor, ...]) -> None:
    """What ``Span.end`` hands ``batches`` (``on_end(span._readable_span())``, compacted), for an SDK span
    that has just ended: the read-only copy is made with its fields set directly, already compact, and
    queued to each batch, unless the span is not sampled (``BatchSpanProcessor.on_end`` drops it)."""
    context = span._context
    if not (context and context.trace_flags.sampled):
        return
    readable: Any = _new_readable(ReadableSpan)
    readable._name = span._name
    readable._context = context
    readable._kind = span._kind
    readable._instrumentation_info = span._instrumentation_info
    readable._instrumentation_scope = span._instrumentation_scope
    readable._parent = span._parent
    readable._start_time = span._start_time
    readable._end_time = span._end_time
    readable._attributes = _plain_attributes(span._attributes)
    readable._events = _plain(span._events)
    readable._links = _plain(span._links)
    readable._resource = span._resource
    readable._status = span._status
    for batch in batches:
        batch._batch_processor.emit(readable)
