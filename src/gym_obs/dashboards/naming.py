"""OpenTelemetry names as Prometheus sees them, and the names dashboards and provisioning agree on.

:func:`prometheus_metric_name` and :func:`prometheus_label` translate an OpenTelemetry name the way the
Prometheus exporters do (the Python ``opentelemetry-exporter-prometheus`` and the collector's ``prometheus``
exporter agree), so every PromQL expression goes through them and a renamed instrument changes the
dashboards on the next build instead of silently emptying a panel. Standard library only.
"""

from __future__ import annotations

import re
from typing import Final, Literal

__all__ = [
    "JOB_LABEL",
    "PROMETHEUS_DATASOURCE_UID",
    "TEMPO_DATASOURCE_UID",
    "MetricKind",
    "prometheus_label",
    "prometheus_metric_name",
    "prometheus_unit",
]

MetricKind = Literal["counter", "updowncounter", "gauge", "histogram"]

PROMETHEUS_DATASOURCE_UID: Final = "gym-prometheus"
TEMPO_DATASOURCE_UID: Final = "gym-tempo"
JOB_LABEL: Final = "job"  # Prometheus' own target label; both ingestion paths set it to service.name

_NAME_INVALID = re.compile(r"[^a-zA-Z0-9:]+")
_LABEL_INVALID = re.compile(r"[^a-zA-Z0-9]+")
_UNIT_ANNOTATION = re.compile(r"\{[^}]*\}")
# The subset of the OpenTelemetry -> Prometheus unit table (specification "Prometheus and OpenMetrics
# compatibility") that gym units can use; anything else is sanitised and appended as is, like the exporters.
_UNIT_WORDS: Final = {
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "min": "minutes",
    "h": "hours",
    "d": "days",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "m": "meters",
    "%": "percent",
    "1": "",
}
_PER_UNIT_WORDS: Final = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "y": "year"}


def _sanitize_name(name: str) -> str:
    if name[:1].isdigit():
        name = "_" + name[1:]
    return _NAME_INVALID.sub("_", name)


def prometheus_label(attribute: str) -> str:
    """The Prometheus label an OpenTelemetry attribute becomes: ``gym.server.name`` -> ``gym_server_name``."""
    if attribute[:1].isdigit():
        attribute = "_" + attribute[1:]
    return _LABEL_INVALID.sub("_", attribute)


def prometheus_unit(unit: str) -> str:
    """The metric-name suffix of an OpenTelemetry unit; ``{annotation}`` units have none."""
    unit = _UNIT_ANNOTATION.sub("", unit)
    if unit in _UNIT_WORDS:
        return _UNIT_WORDS[unit]
    top, slash, bottom = unit.partition("/")
    bottom = _NAME_INVALID.sub("_", bottom)
    if slash and bottom:
        top = _NAME_INVALID.sub("_", top)
        top = _UNIT_WORDS.get(top, top)
        bottom = _PER_UNIT_WORDS.get(bottom, bottom)
        return f"{top}_per_{bottom}" if top else f"per_{bottom}"
    return _NAME_INVALID.sub("_", unit).strip("_")


def prometheus_metric_name(name: str, unit: str, kind: MetricKind) -> str:
    """The Prometheus family name an OpenTelemetry instrument is exported as.

    Dots become underscores, the unit word is appended once (``s`` -> ``_seconds``, ``{request}`` -> none),
    and monotonic counters get ``_total``. A histogram's series are this name plus ``_bucket``, ``_sum``
    and ``_count``; up-down counters and gauges are plain gauges.
    """
    base = _sanitize_name(name)
    unit_word = prometheus_unit(unit)
    if unit_word and not base.endswith("_" + unit_word):
        base = f"{base}_{unit_word}"
    if kind == "counter" and not base.endswith("_total"):
        base += "_total"
    return base
