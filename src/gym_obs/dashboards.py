"""Grafana dashboards as code, built from the names in :mod:`gym_obs.telemetry.names`.

Every PromQL expression names its metrics and labels through :func:`prometheus_metric_name` and
:func:`prometheus_label`, which translate an OpenTelemetry name the way the Prometheus exporters do (the
Python ``opentelemetry-exporter-prometheus`` and the collector's ``prometheus`` exporter agree), so a
renamed instrument changes the dashboards on the next ``gym-obs dashboards build`` instead of silently
emptying a panel. Building needs the ``dashboards`` extra (grafana-foundation-sdk); the name mapping does not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from gym_obs.telemetry import names

MetricKind = Literal["counter", "updowncounter", "gauge", "histogram"]

PROMETHEUS_DATASOURCE_UID: Final = "gym-prometheus"
TEMPO_DATASOURCE_UID: Final = "gym-tempo"
JOB_LABEL: Final = "job"  # Prometheus' own target label; both ingestion paths set it to service.name
DEFAULT_OUT_DIR: Final = Path("dashboards")

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


@dataclass(frozen=True)
class MetricSpec:
    """One gym instrument: its OpenTelemetry name, unit and kind, and the Prometheus name that follows."""

    name: str
    unit: str
    kind: MetricKind

    @property
    def prometheus(self) -> str:
        return prometheus_metric_name(self.name, self.unit, self.kind)

    def series(self, suffix: str = "") -> str:
        """A series name of this family: ``""`` for counters/gauges, ``_bucket``/``_sum``/``_count``."""
        return self.prometheus + suffix


CLIENT_REQUEST_DURATION: Final = MetricSpec(
    names.METRIC_HTTP_CLIENT_REQUEST_DURATION, names.UNIT_SECONDS, "histogram"
)
SERVER_REQUEST_DURATION: Final = MetricSpec(
    names.METRIC_HTTP_SERVER_REQUEST_DURATION, names.UNIT_SECONDS, "histogram"
)
CLIENT_RETRIES: Final = MetricSpec(names.METRIC_CLIENT_RETRIES, names.UNIT_RETRY, "counter")
POOL_WAIT_DURATION: Final = MetricSpec(names.METRIC_POOL_WAIT_DURATION, names.UNIT_SECONDS, "histogram")
POOL_PENDING_REQUESTS: Final = MetricSpec(
    names.METRIC_POOL_PENDING_REQUESTS, names.UNIT_REQUEST, "updowncounter"
)
POOL_CONNECTIONS: Final = MetricSpec(names.METRIC_POOL_CONNECTIONS, names.UNIT_CONNECTION, "updowncounter")
FAILURE_EVENTS: Final = MetricSpec(names.METRIC_FAILURE_EVENTS, names.UNIT_EVENT, "counter")
ROLLOUT_DURATION: Final = MetricSpec(names.METRIC_ROLLOUT_DURATION, names.UNIT_SECONDS, "histogram")
ROLLOUTS: Final = MetricSpec(names.METRIC_ROLLOUTS, names.UNIT_ROLLOUT, "counter")
GEN_AI_SERVER_DURATION: Final = MetricSpec(
    names.METRIC_GEN_AI_SERVER_REQUEST_DURATION, names.UNIT_SECONDS, "histogram"
)
GEN_AI_SERVER_TTFT: Final = MetricSpec(
    names.METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, names.UNIT_SECONDS, "histogram"
)
GEN_AI_SERVER_TOKENS: Final = MetricSpec(
    names.METRIC_GEN_AI_SERVER_TOKEN_USAGE, names.UNIT_TOKEN, "histogram"
)
GEN_AI_SERVER_FINISHES: Final = MetricSpec(
    names.METRIC_GEN_AI_SERVER_FINISHES, names.UNIT_FINISH, "counter"
)
GEN_AI_SERVER_UNPARSABLE: Final = MetricSpec(
    names.METRIC_GEN_AI_SERVER_UNPARSABLE, names.UNIT_REPLY, "counter"
)

CONCURRENCY_WAIT_DURATION: Final = MetricSpec(
    names.METRIC_CONCURRENCY_WAIT_DURATION, names.UNIT_SECONDS, "histogram"
)
CONCURRENCY_ACTIVE: Final = MetricSpec(names.METRIC_CONCURRENCY_ACTIVE, names.UNIT_PERMIT, "updowncounter")
CONCURRENCY_LIMIT: Final = MetricSpec(names.METRIC_CONCURRENCY_LIMIT, names.UNIT_PERMIT, "updowncounter")
CONCURRENCY_CANCELLED_WAITS: Final = MetricSpec(
    names.METRIC_CONCURRENCY_CANCELLED_WAITS, names.UNIT_WAIT, "counter"
)
PROCESS_MEMORY_USAGE: Final = MetricSpec(names.METRIC_PROCESS_MEMORY_USAGE, names.UNIT_BYTES, "updowncounter")
PROCESS_CPU_UTILIZATION: Final = MetricSpec(names.METRIC_PROCESS_CPU_UTILIZATION, names.UNIT_RATIO, "gauge")
PROCESS_FILE_DESCRIPTORS: Final = MetricSpec(
    names.METRIC_PROCESS_FILE_DESCRIPTORS, names.UNIT_FILE_DESCRIPTOR, "updowncounter"
)
PROCESS_THREADS: Final = MetricSpec(names.METRIC_PROCESS_THREADS, names.UNIT_THREAD, "updowncounter")
EVENT_LOOP_LAG: Final = MetricSpec(names.METRIC_EVENT_LOOP_LAG, names.UNIT_SECONDS, "histogram")
GPU_UTILIZATION: Final = MetricSpec(names.METRIC_GPU_UTILIZATION, names.UNIT_RATIO, "gauge")
GPU_MEMORY_USAGE: Final = MetricSpec(names.METRIC_GPU_MEMORY_USAGE, names.UNIT_BYTES, "updowncounter")

GYM_METRICS: Final = (
    CLIENT_REQUEST_DURATION,
    SERVER_REQUEST_DURATION,
    CLIENT_RETRIES,
    POOL_WAIT_DURATION,
    POOL_PENDING_REQUESTS,
    POOL_CONNECTIONS,
    FAILURE_EVENTS,
    ROLLOUT_DURATION,
    ROLLOUTS,
    GEN_AI_SERVER_DURATION,
    GEN_AI_SERVER_TTFT,
    GEN_AI_SERVER_TOKENS,
    GEN_AI_SERVER_FINISHES,
    GEN_AI_SERVER_UNPARSABLE,

    CONCURRENCY_WAIT_DURATION,
    CONCURRENCY_ACTIVE,
    CONCURRENCY_LIMIT,
    CONCURRENCY_CANCELLED_WAITS,
    PROCESS_MEMORY_USAGE,
    PROCESS_CPU_UTILIZATION,
    PROCESS_FILE_DESCRIPTORS,
    PROCESS_THREADS,
    EVENT_LOOP_LAG,
    GPU_UTILIZATION,
    GPU_MEMORY_USAGE,
)


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard as a JSON-ready dict, keyed by its file name (``gym-rollouts.json``, ...)."""
    from gym_obs import _dashboard_defs  # the SDK is an optional extra: import only when building

    return _dashboard_defs.build_all()


def render_dashboard(model: dict[str, Any]) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, trailing newline (diff-friendly)."""
    return json.dumps(model, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def stale_dashboards(out_dir: Path = DEFAULT_OUT_DIR) -> list[Path]:
    """Dashboard files in ``out_dir`` that are missing or differ from what the code builds."""
    stale: list[Path] = []
    for file_name, model in sorted(build_dashboards().items()):
        path = out_dir / file_name
        if not path.is_file() or path.read_text(encoding="utf-8") != render_dashboard(model):
            stale.append(path)
    return stale


def write_dashboards(out_dir: Path = DEFAULT_OUT_DIR) -> list[Path]:
    """Write every dashboard to ``out_dir`` and return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for file_name, model in sorted(build_dashboards().items()):
        path = out_dir / file_name
        path.write_text(render_dashboard(model), encoding="utf-8")
        written.append(path)
    return written
