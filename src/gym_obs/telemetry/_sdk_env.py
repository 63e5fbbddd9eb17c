"""Repair ``OTEL_*`` values that would make the OpenTelemetry SDK raise while it is being imported.

A few SDK modules read the environment at import time and raise on a bad value (``opentelemetry.propagate``
on an unknown ``OTEL_PROPAGATORS`` name, ``opentelemetry.sdk.trace`` on a negative or non-numeric span limit),
which would stop the program at ``import gym_obs``, whether telemetry is on or not; an unknown
``OTEL_PYTHON_TRACER_PROVIDER``/``METER_PROVIDER`` makes every ``get_tracer_provider()`` raise, and an unknown
``OTEL_PYTHON_CONTEXT`` logs a traceback at import. Such a value is removed
from the environment (an unknown propagator name alone is dropped from the list) before anything imports
the SDK, and the problem is kept for ``setup_telemetry`` to log once. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Final

__all__ = ["SDK_ENV_PROBLEMS", "repair_sdk_environment"]

PROPAGATORS_VAR: Final = "OTEL_PROPAGATORS"
# SpanLimits reads these at import and whenever a TracerProvider is built: "" or a non-negative integer.
LIMIT_VARS: Final = (
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
)
_PROPAGATOR_GROUP: Final = "opentelemetry_propagator"
# Variables naming one entry point of a group; an unknown name is removed (the SDK default applies).
ENTRY_POINT_VARS: Final = {
    "OTEL_PYTHON_CONTEXT": "opentelemetry_context",
    "OTEL_PYTHON_TRACER_PROVIDER": "opentelemetry_tracer_provider",
    "OTEL_PYTHON_METER_PROVIDER": "opentelemetry_meter_provider",
}
# MeterProvider() raises on an unknown filter name (read when it is built, not at import).
EXEMPLAR_FILTER_VAR: Final = "OTEL_METRICS_EXEMPLAR_FILTER"
EXEMPLAR_FILTERS: Final = ("always_on", "always_off", "trace_based")
_SHOWN_CHARS: Final = 60

SDK_ENV_PROBLEMS: Final[list[str]] = []
"""What :func:`repair_sdk_environment` removed, one sentence each (logged once by ``setup_telemetry``)."""


def repair_sdk_environment(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove values the SDK would raise on at import; return (and remember) one problem per change.

    Never raises. ``environ`` defaults to ``os.environ``; passing a dict makes the check testable.
    """
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    problems: list[str] = []
    try:
        for name in LIMIT_VARS:
            raw = env.get(name)
            if raw is not None and not _valid_limit(raw):
                del env[name]
                problems.append(
                    f"{name}={_shown(raw)} is not a non-negative integer; removed (the SDK default applies)"
                )
        for name, group in ENTRY_POINT_VARS.items():
            raw = env.get(name)
            if raw is not None and raw not in _entry_point_names(group, ()):
                del env[name]
                problems.append(f"{name}={_shown(raw)} names no installed entry point; removed")
        raw = env.get(EXEMPLAR_FILTER_VAR)
        if raw is not None and raw not in EXEMPLAR_FILTERS:  # the SDK compares exactly
            del env[EXEMPLAR_FILTER_VAR]
            problems.append(
                f"{EXEMPLAR_FILTER_VAR}={_shown(raw)} is not one of {', '.join(EXEMPLAR_FILTERS)}; removed"
            )
        raw = env.get(PROPAGATORS_VAR)
        if raw is not None:
            problem = _repair_propagators(env, raw)
            if problem:
                problems.append(problem)
    except Exception as exc:  # pragma: no cover - a broken environment mapping must not stop the import
        problems.append(f"could not check the OTEL_* environment ({exc!r})")
    if environ is None:
        SDK_ENV_PROBLEMS.extend(p for p in problems if p not in SDK_ENV_PROBLEMS)
    return problems


def _valid_limit(raw: str) -> bool:
    value = raw.strip().lower()
    if not value:
        return True
    try:
        return int(value) >= 0
    except ValueError:
        return False


def _repair_propagators(env: MutableMapping[str, str], raw: str) -> str | None:
    """Keep the known propagator names; an unknown or empty one would raise inside the SDK."""
    items = [item.strip() for item in raw.split(",")]
    if not raw.strip() or any(item.lower() == "none" for item in items):
        return None  # the SDK handles both (defaults / no propagation)
    known = _entry_point_names(_PROPAGATOR_GROUP, ("tracecontext", "baggage"))
    kept = [item for item in items if item in known]
    bad = [item for item in items if item not in known]
    if not bad:
        return None
    if kept:
        env[PROPAGATORS_VAR] = ",".join(kept)
        outcome = f"using {','.join(kept)}"
    else:
        del env[PROPAGATORS_VAR]
        outcome = "removed (tracecontext,baggage apply)"
    shown = ", ".join(_shown(item) for item in bad[:3])
    return f"{PROPAGATORS_VAR} names unknown propagators ({shown}); {outcome}"


def _entry_point_names(group: str, fallback: tuple[str, ...]) -> frozenset[str]:
    from importlib.metadata import entry_points

    try:
        return frozenset(ep.name for ep in entry_points(group=group))
    except Exception:  # pragma: no cover - broken package metadata
        return frozenset(fallback)


def _shown(value: str) -> str:
    safe = value.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    return repr(safe[:_SHOWN_CHARS])
