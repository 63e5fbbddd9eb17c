"""The exemplar filter: an exemplar only where this process records the span it would point to.

Why: the SDK's default (``trace_based``) offers every measurement made under a *sampled context* to the
exemplar reservoir -- also when this process records no span there (a sampled ``traceparent`` arrived but
the span group is off, or only the remote parent is current). That is reservoir work on the request path
for an exemplar whose span id leads nowhere. With tracing off in the process, no measurement is eligible,
decided once at set-up. ``OTEL_METRICS_EXEMPLAR_FILTER``, when set, is the user's choice and wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, ExemplarFilter
from opentelemetry.trace import NonRecordingSpan, get_current_span
from opentelemetry.util.types import Attributes

__all__ = ["RecordedSpanExemplarFilter", "exemplar_filter"]

ENV_EXEMPLAR_FILTER: Final = "OTEL_METRICS_EXEMPLAR_FILTER"


class RecordedSpanExemplarFilter(ExemplarFilter):
    """Eligible when the measurement's current span is a sampled span of this process (a real SDK span,
    ended or not), never for a bare remote parent, an unsampled span or no span."""

    def should_sample(
        self, value: float, time_unix_nano: int, attributes: Attributes, context: Context
    ) -> bool:
        span = get_current_span(context)
        return not isinstance(span, NonRecordingSpan) and span.get_span_context().trace_flags.sampled


def exemplar_filter(tracing: bool, env: Mapping[str, str]) -> ExemplarFilter | None:
    """The filter for gym_obs's meter provider; None leaves the choice to the SDK (the variable is set)."""
    if env.get(ENV_EXEMPLAR_FILTER, "").strip():
        return None
    return RecordedSpanExemplarFilter() if tracing else AlwaysOffExemplarFilter()
