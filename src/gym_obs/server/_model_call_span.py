"""The model-call layer's SERVER span: which span a call's attributes go to, and whether it ends with the app.

Both are asked once per call, on the per-request path: the SDK's own span classes (``DIRECT_SPAN_TYPES``)
are read directly, any other class through its public properties.
"""

from __future__ import annotations

from opentelemetry.trace import Span

from gym_obs.telemetry import names
from gym_obs.telemetry._exemplars import DIRECT_SPAN_TYPES, current_recorded_span, span_in
from gym_obs.telemetry.spans import SERVER_KIND

__all__ = ["ends_with_the_app", "server_span"]


def server_span() -> Span | None:
    """The current span when it is a SERVER span this process records, else None."""
    span: object = span_in()
    if type(span) in DIRECT_SPAN_TYPES:  # an SDK span: one this process records
        return span if span._kind is SERVER_KIND else None  # type: ignore[attr-defined,return-value]
    recorded = current_recorded_span()  # at a request's start it has not ended: it is recording
    if recorded is None:
        return None
    return recorded if getattr(recorded, "kind", None) is SERVER_KIND else None


def ends_with_the_app(span: Span) -> bool:
    """Whether ``span`` is gym's own SERVER span, which ends when the app returns (contrib's ends with the
    last body message). Scopes are one per tracer: the answer for the last one seen is kept."""
    global _last_scope
    if type(span) in DIRECT_SPAN_TYPES:
        scope: object = span._instrumentation_scope  # type: ignore[attr-defined]
    else:
        scope = getattr(span, "instrumentation_scope", None)
    seen = _last_scope  # one read: another thread may replace it, never half of it
    if seen[0] is not scope:
        seen = _last_scope = (scope, getattr(scope, "name", None) == names.INSTRUMENTATION_SCOPE)
    return seen[1]


# The instrumentation scope last asked about, and whether it is gym's.
_last_scope: tuple[object, bool] = (object(), False)
