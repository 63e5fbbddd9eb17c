"""Grafana dashboards as code, built from the names in :mod:`gym_obs.telemetry.names`.

Three layers, each importing only the ones before it: :mod:`~gym_obs.dashboards.naming` (how an
OpenTelemetry name reads in Prometheus), :mod:`~gym_obs.dashboards.metrics` (the gym instruments the
dashboards draw) and :mod:`~gym_obs.dashboards.files` (build, render, write, check), which loads the boards
(``_boards`` on ``_panels``, the grafana-foundation-sdk of the ``dashboards`` extra) only when one is built.
``gym-obs dashboards build`` writes the JSON in the repository's ``dashboards/`` folder.
"""

from __future__ import annotations

from gym_obs.dashboards.files import (
    DEFAULT_OUT_DIR,
    build_dashboards,
    render_dashboard,
    stale_dashboards,
    write_dashboards,
)
from gym_obs.dashboards.metrics import (
    CLIENT_REQUEST_DURATION,
    CLIENT_RETRIES,
    CONCURRENCY_ACTIVE,
    CONCURRENCY_CANCELLED_WAITS,
    CONCURRENCY_LIMIT,
    CONCURRENCY_WAIT_DURATION,
    EVENT_LOOP_LAG,
    FAILURE_EVENTS,
    GEN_AI_SERVER_DURATION,
    GEN_AI_SERVER_FINISHES,
    GEN_AI_SERVER_TOKENS,
    GEN_AI_SERVER_TTFT,
    GEN_AI_SERVER_UNPARSABLE,
    GPU_MEMORY_USAGE,
    GPU_UTILIZATION,
    GYM_METRICS,
    POOL_CONNECTIONS,
    POOL_PENDING_REQUESTS,
    POOL_WAIT_DURATION,
    PROCESS_CPU_UTILIZATION,
    PROCESS_FILE_DESCRIPTORS,
    PROCESS_MEMORY_USAGE,
    PROCESS_THREADS,
    ROLLOUT_DURATION,
    ROLLOUTS,
    SERVER_REQUEST_DURATION,
    MetricSpec,
)
from gym_obs.dashboards.naming import (
    JOB_LABEL,
    PROMETHEUS_DATASOURCE_UID,
    TEMPO_DATASOURCE_UID,
    MetricKind,
    prometheus_label,
    prometheus_metric_name,
    prometheus_unit,
)

__all__ = [
    "CLIENT_REQUEST_DURATION",
    "CLIENT_RETRIES",
    "CONCURRENCY_ACTIVE",
    "CONCURRENCY_CANCELLED_WAITS",
    "CONCURRENCY_LIMIT",
    "CONCURRENCY_WAIT_DURATION",
    "DEFAULT_OUT_DIR",
    "EVENT_LOOP_LAG",
    "FAILURE_EVENTS",
    "GEN_AI_SERVER_DURATION",
    "GEN_AI_SERVER_FINISHES",
    "GEN_AI_SERVER_TOKENS",
    "GEN_AI_SERVER_TTFT",
    "GEN_AI_SERVER_UNPARSABLE",
    "GPU_MEMORY_USAGE",
    "GPU_UTILIZATION",
    "GYM_METRICS",
    "JOB_LABEL",
    "POOL_CONNECTIONS",
    "POOL_PENDING_REQUESTS",
    "POOL_WAIT_DURATION",
    "PROCESS_CPU_UTILIZATION",
    "PROCESS_FILE_DESCRIPTORS",
    "PROCESS_MEMORY_USAGE",
    "PROCESS_THREADS",
    "PROMETHEUS_DATASOURCE_UID",
    "ROLLOUTS",
    "ROLLOUT_DURATION",
    "SERVER_REQUEST_DURATION",
    "TEMPO_DATASOURCE_UID",
    "MetricKind",
    "MetricSpec",
    "build_dashboards",
    "prometheus_label",
    "prometheus_metric_name",
    "prometheus_unit",
    "render_dashboard",
    "stale_dashboards",
    "write_dashboards",
]
