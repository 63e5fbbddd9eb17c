"""Every gym instrument the dashboards draw: its OpenTelemetry name, unit and kind, from the names registry.

Specs are data only (no SDK): the alert rules, the stack checks and the tests read them as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gym_obs.dashboards.naming import MetricKind, prometheus_metric_name
from gym_obs.telemetry import names

__all__ = [
    "CLIENT_REQUEST_DURATION",
    "CLIENT_RETRIES",
    "CLIENT_TIMEOUTS",
    "CONCURRENCY_ACTIVE",
    "CONCURRENCY_CANCELLED_WAITS",
    "CONCURRENCY_LIMIT",
    "CONCURRENCY_WAIT_DURATION",
    "EVENT_LOOP_LAG",
    "FAILURE_EVENTS",
    "GEN_AI_CLIENT_DURATION",
    "GEN_AI_CLIENT_TOKENS",
    "GEN_AI_CLIENT_TTFC",
    "GEN_AI_CLIENT_UNPARSABLE",
    "GEN_AI_SERVER_DURATION",
    "GEN_AI_SERVER_FINISHES",
    "GEN_AI_SERVER_TOKENS",
    "GEN_AI_SERVER_TTFT",
    "GEN_AI_SERVER_UNPARSABLE",
    "GPU_MEMORY_USAGE",
    "GPU_UTILIZATION",
    "GYM_METRICS",
    "POOL_CONNECTIONS",
    "POOL_CONNECTS",
    "POOL_PENDING_REQUESTS",
    "POOL_WAIT_DURATION",
    "PROCESS_CPU_UTILIZATION",
    "PROCESS_FILE_DESCRIPTORS",
    "PROCESS_MEMORY_USAGE",
    "PROCESS_THREADS",
    "ROLLOUTS",
    "ROLLOUT_DURATION",
    "SERVER_REQUEST_DURATION",
    "SERVER_STARTUP_DURATION",
    "TREE_CPU_UTILIZATION",
    "TREE_FILE_DESCRIPTORS",
    "TREE_GPU_MEMORY_USAGE",
    "TREE_MEMORY_USAGE",
    "TREE_PROCESSES",
    "TREE_THREADS",
    "MetricSpec",
]


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
POOL_CONNECTS: Final = MetricSpec(names.METRIC_POOL_CONNECTS, names.UNIT_CONNECTION, "counter")
CLIENT_TIMEOUTS: Final = MetricSpec(names.METRIC_CLIENT_TIMEOUTS, names.UNIT_TIMEOUT, "counter")
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
GEN_AI_SERVER_FINISHES: Final = MetricSpec(names.METRIC_GEN_AI_SERVER_FINISHES, names.UNIT_FINISH, "counter")
GEN_AI_SERVER_UNPARSABLE: Final = MetricSpec(
    names.METRIC_GEN_AI_SERVER_UNPARSABLE, names.UNIT_REPLY, "counter"
)
GEN_AI_CLIENT_DURATION: Final = MetricSpec(
    names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION, names.UNIT_SECONDS, "histogram"
)
GEN_AI_CLIENT_TOKENS: Final = MetricSpec(
    names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE, names.UNIT_TOKEN, "histogram"
)
GEN_AI_CLIENT_TTFC: Final = MetricSpec(
    names.METRIC_GEN_AI_CLIENT_TIME_TO_FIRST_CHUNK, names.UNIT_SECONDS, "histogram"
)
GEN_AI_CLIENT_UNPARSABLE: Final = MetricSpec(
    names.METRIC_GEN_AI_CLIENT_UNPARSABLE, names.UNIT_REPLY, "counter"
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
# Issue 16.2 / 16.4: startup and the launcher's process-tree gauges.
SERVER_STARTUP_DURATION: Final = MetricSpec(
    names.METRIC_SERVER_STARTUP_DURATION, names.UNIT_SECONDS, "histogram"
)
TREE_PROCESSES: Final = MetricSpec(names.METRIC_TREE_PROCESSES, names.UNIT_PROCESS, "updowncounter")
TREE_MEMORY_USAGE: Final = MetricSpec(names.METRIC_TREE_MEMORY_USAGE, names.UNIT_BYTES, "updowncounter")
TREE_CPU_UTILIZATION: Final = MetricSpec(names.METRIC_TREE_CPU_UTILIZATION, names.UNIT_RATIO, "gauge")
TREE_FILE_DESCRIPTORS: Final = MetricSpec(
    names.METRIC_TREE_FILE_DESCRIPTORS, names.UNIT_FILE_DESCRIPTOR, "updowncounter"
)
TREE_THREADS: Final = MetricSpec(names.METRIC_TREE_THREADS, names.UNIT_THREAD, "updowncounter")
TREE_GPU_MEMORY_USAGE: Final = MetricSpec(
    names.METRIC_TREE_GPU_MEMORY_USAGE, names.UNIT_BYTES, "updowncounter"
)

GYM_METRICS: Final = (
    CLIENT_REQUEST_DURATION,
    SERVER_REQUEST_DURATION,
    CLIENT_RETRIES,
    POOL_WAIT_DURATION,
    POOL_PENDING_REQUESTS,
    POOL_CONNECTIONS,
    POOL_CONNECTS,
    CLIENT_TIMEOUTS,
    FAILURE_EVENTS,
    ROLLOUT_DURATION,
    ROLLOUTS,
    GEN_AI_SERVER_DURATION,
    GEN_AI_SERVER_TTFT,
    GEN_AI_SERVER_TOKENS,
    GEN_AI_SERVER_FINISHES,
    GEN_AI_SERVER_UNPARSABLE,
    GEN_AI_CLIENT_DURATION,
    GEN_AI_CLIENT_TOKENS,
    GEN_AI_CLIENT_TTFC,
    GEN_AI_CLIENT_UNPARSABLE,
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
    SERVER_STARTUP_DURATION,
    TREE_PROCESSES,
    TREE_MEMORY_USAGE,
    TREE_CPU_UTILIZATION,
    TREE_FILE_DESCRIPTORS,
    TREE_THREADS,
    TREE_GPU_MEMORY_USAGE,
)
