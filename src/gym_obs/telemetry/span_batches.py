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
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util import BoundedList

__all__ = ["CompactBatchSpanProcessor", "compact_ended_span"]

_NONE: Final[tuple[Any, ...]] = ()


def compact_ended_span(span: ReadableSpan) -> None:
    """Swap the SDK containers of ``span`` (the read-only copy ``Span.end`` makes for processors) for the
    plain dict and tuples inside them, where nothing was dropped. Any other span type is left alone."""
    if type(span) is not ReadableSpan:
        return
    attributes: Any = span._attributes
    if type(attributes) is BoundedAttributes and not attributes.dropped:
        items = getattr(attributes, "_dict", None)
        if type(items) is dict:
            span._attributes = items
    span._events = _plain(span._events)
    span._links = _plain(span._links)


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
