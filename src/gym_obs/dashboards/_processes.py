"""The "gym / Processes" dashboard: which server is eating memory or CPU, and how long servers took to start.

Self-contained (one function, names only from :mod:`gym_obs.dashboards` specs and
:mod:`gym_obs.telemetry.names`) so it moves with the dashboards package as it is. Two sources: each server
process's own gauges (``job`` = that server's service) and the launcher's process-tree gauges, which sum a
server's whole tree (uvicorn workers, subprocess agents) by ``gym.server.name`` and ``gym.process.role``
(``job`` = the launcher's service: ``gym/launcher`` under ``gym-obs serve``, the driver under the harness).
GPU gauges are not drawn: they exist only where ``nvidia-smi`` does, and every panel here is proved against
a real run.
"""

from __future__ import annotations

from typing import Any

from gym_obs.dashboards import _panels as p
from gym_obs.dashboards.metrics import (
    EVENT_LOOP_LAG,
    PROCESS_CPU_UTILIZATION,
    PROCESS_FILE_DESCRIPTORS,
    PROCESS_MEMORY_USAGE,
    PROCESS_THREADS,
    SERVER_STARTUP_DURATION,
    TREE_CPU_UTILIZATION,
    TREE_MEMORY_USAGE,
    TREE_PROCESSES,
)
from gym_obs.dashboards.naming import JOB_LABEL
from gym_obs.telemetry import names

_MEMORY_TYPE = p.label(names.ATTR_MEMORY_TYPE)
_CPU_MODE = p.label(names.ATTR_CPU_MODE)
_SERVER = p.label(names.ATTR_SERVER_NAME)
_ROLE = p.label(names.ATTR_PROCESS_ROLE)
_SERVER_TYPE = p.label(names.ATTR_SERVER_TYPE)


def _legend(*labels: str) -> str:
    return " ".join("{{" + name + "}}" for name in labels)


def _sum_by(series_selector: str, *group: str) -> str:
    return f"sum by ({p.by(*group)}) ({series_selector})"


def processes() -> dict[str, Any]:
    board = p.Board(
        "gym-processes",
        "gym / Processes",
        "Memory, CPU, descriptors, threads and event-loop lag per server process and per launched process "
        "tree, and how long each kind of server took to start.",
    )
    board.query_variable(
        p.JOB_VAR,
        p.job_variable_query(
            PROCESS_MEMORY_USAGE, EVENT_LOOP_LAG, TREE_MEMORY_USAGE, SERVER_STARTUP_DURATION
        ),
        "Service",
    )
    rss = f'{_MEMORY_TYPE}="{names.MEMORY_TYPE_RSS}"'
    pss = f'{_MEMORY_TYPE}="{names.MEMORY_TYPE_PSS}"'
    board.timeseries(
        "Resident memory (RSS) by service",
        "Resident memory of each server process, summed over a service's instances (uvicorn workers).",
        [p.Target(_sum_by(p.selector(PROCESS_MEMORY_USAGE.series(), rss), JOB_LABEL), _legend(JOB_LABEL))],
        unit="bytes",
    )
    board.timeseries(
        "Proportional memory (PSS) by service",
        "Shared pages divided among the processes sharing them: what a service's workers really add up to.",
        [p.Target(_sum_by(p.selector(PROCESS_MEMORY_USAGE.series(), pss), JOB_LABEL), _legend(JOB_LABEL))],
        unit="bytes",
    )
    board.timeseries(
        "CPU utilisation by service and mode",
        "CPU time over wall time and the CPUs a process may use; near 1 per worker means CPU-saturated.",
        [
            p.Target(
                _sum_by(p.selector(PROCESS_CPU_UTILIZATION.series()), JOB_LABEL, _CPU_MODE),
                _legend(JOB_LABEL, _CPU_MODE),
            )
        ],
        unit="percentunit",
    )
    board.timeseries(
        "Event-loop lag p99 by service",
        "How late a periodic event-loop callback ran: the first sign of a CPU-bound or blocked asyncio "
        "server.",
        [p.Target(p.quantile(0.99, EVENT_LOOP_LAG, JOB_LABEL), _legend(JOB_LABEL))],
        unit="s",
        histogram=True,
    )
    board.timeseries(
        "Open file descriptors by service",
        "Descriptors held by each service's processes (sockets included): a leak climbs without falling.",
        [p.Target(_sum_by(p.selector(PROCESS_FILE_DESCRIPTORS.series()), JOB_LABEL), _legend(JOB_LABEL))],
        unit="short",
    )
    board.timeseries(
        "Threads by service",
        "OS threads of each service's processes.",
        [p.Target(_sum_by(p.selector(PROCESS_THREADS.series()), JOB_LABEL), _legend(JOB_LABEL))],
        unit="short",
    )
    board.timeseries(
        "Process-tree memory (RSS) by server and role",
        "Each launched server's whole tree as the launcher sees it: the main process, its uvicorn workers, "
        "and their subprocesses (role child).",
        [
            p.Target(
                _sum_by(p.selector(TREE_MEMORY_USAGE.series(), rss), _SERVER, _ROLE), _legend(_SERVER, _ROLE)
            )
        ],
        unit="bytes",
    )
    board.timeseries(
        "Process-tree CPU by server and role",
        "CPU of each launched server's tree over wall time and the host's CPUs, user and system together.",
        [
            p.Target(
                _sum_by(p.selector(TREE_CPU_UTILIZATION.series()), _SERVER, _ROLE), _legend(_SERVER, _ROLE)
            )
        ],
        unit="percentunit",
    )
    board.timeseries(
        "Processes per server tree by role",
        "How many processes each launched server runs: workers that died or subprocesses that pile up.",
        [p.Target(_sum_by(p.selector(TREE_PROCESSES.series()), _SERVER, _ROLE), _legend(_SERVER, _ROLE))],
        unit="short",
    )
    count = p.selector(SERVER_STARTUP_DURATION.series("_count"))
    total = p.selector(SERVER_STARTUP_DURATION.series("_sum"))
    board.timeseries(
        "Mean startup duration by server type",
        "From spawn to the first healthy readiness probe, averaged over the servers of each type this "
        "launcher started. The startup trace (gym.startup) shows each stage.",
        [
            p.Target(
                f"{_sum_by(total, _SERVER_TYPE)} / {_sum_by(count, _SERVER_TYPE)}", _legend(_SERVER_TYPE)
            )
        ],
        unit="s",
    )
    return board.build()
