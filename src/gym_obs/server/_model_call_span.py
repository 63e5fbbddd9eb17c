"""The model-call layer's SERVER span: which span a call's attributes go to, and whether it ends with the app.

Both are asked once per call, on the per-request path: the SDK's own span class (what its tracer makes) is
read directly, any other class through its public properties.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import _Span as _SdkSpan
from opentelemetry.trace import Span, SpanKind

from gym_obs.telemetry import names
from gym_obs.telemetry._exemplars import current_recorded_span

__all__ = ["ends_with_the_app", "server_span"]


def server_span() -> Span | None:
    """The current span when it is a SERVER span this process records, else None."""
    span = current_recorded_span()  # at a request's start it has not ended: it is recording
    if span is None:
        return None
    kind = span._kind if type(span) is _SdkSpan else getattr(span, "kind", None)
    return span if kind is SpanKind.SERVER else None


def ends_with_the_app(span: Span) -> bool:
    """Whether ``span`` is gym's own SERVER span, which ends when the app returns (contrib's ends with the
    last body message). Scopes are one per tracer: the answer for the last one seen is kept."""
    global _last_scope
    if type(span) is _SdkSpan:
        scope: object = span._instrumentation_scope
    else:
        scope = getattr(span, "instrumentation_scope", None)
    seen = _last_scope  # one read: another thread may replace it, never half of it
    if seen[0] is not scope:
        seen = _last_scope = (scope, getattr(scope, "name", None) == names.INSTRUMENTATION_SCOPE)
    return seen[1]


# The instrumentation scope last asked about, and whether it is gym's.
_last_scope: tuple[object, bool] = (object(), False)
