"""The harness's rollout system as a global config: head server, agents, models, resources, telemetry.

The embedded default needs no collector and no Docker: every process writes its spans and metrics as OTLP
JSON lines under ``<out>/telemetry/``. With an OTLP endpoint, spans and metrics go there instead (metrics are
still written to files as well: they are small, and the summary reads them). With a Prometheus port base,
every process also serves ``/metrics`` on ``base + index`` and the scrape targets are written for Prometheus
with ``job`` = ``service.name``.
"""

from __future__ import annotations

import errno
import json
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gym_obs.config import GlobalConfig, TelemetryConfig, parse_global_config
from gym_obs.harness.faults import ROLES, FaultPlan, FaultPlanError
from gym_obs.harness.servers import ENTRYPOINTS
from gym_obs.harness.servers._common import ROLE_SERVER_TYPES
from gym_obs.telemetry import names

__all__ = [
    "DRIVER_NAME",
    "HarnessError",
    "HarnessOptions",
    "StackLayout",
    "build_layout",
    "check_ports_free",
    "write_prometheus_targets",
]

DRIVER_NAME: Final = "harness"
_METRIC_EXPORT_INTERVAL_MS: Final = 5_000
_EXPORT_TIMEOUT_MS: Final = 5_000  # a dead collector must not hold the run's shutdown for long


class HarnessError(RuntimeError):
    """The harness itself could not run (bad plan, busy port, a server that did not start)."""


@dataclass
class HarnessOptions:
    """Everything ``gym-obs harness run`` can be told."""

    rollouts: int = 200
    concurrency: int = 32
    agents: int = 1
    models: int = 1
    resources: int = 1
    fault_plan: FaultPlan | None = None
    otlp_endpoint: str | None = None
    prometheus_port_base: int | None = None
    out: Path = Path("harness-out")
    host: str = "127.0.0.1"
    port_base: int = 11000
    telemetry: bool = True
    model_latency_s: float = 0.01
    latency_distribution: str = "lognormal"
    turns: int = 3
    fanout: int = 3
    request_timeout_s: float = 10.0
    seed: int | None = None
    pool_limit_per_host: int | None = None  # data-pool connections per destination, per process
    linger_s: float = 0.0  # keep every process (and its /metrics) up this long after the rollouts
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def telemetry_dir(self) -> Path:
        return self.out / "telemetry"


@dataclass
class StackLayout:
    """The generated global config plus what the driver needs to know about it."""

    config: GlobalConfig
    roles: dict[str, str]  # server name -> role
    agents: list[str]
    driver_telemetry: TelemetryConfig
    prometheus_targets: dict[str, int] = field(default_factory=dict)  # service.name -> port

    def ports(self) -> dict[int, str]:
        """Every TCP port the run will listen on, with what listens there (for the busy-port check)."""
        ports = {self.config.head_server.port: "head_server"}
        for name, server in self.config.servers.items():
            ports[server.port] = f"servers.{name}"
        for service, port in self.prometheus_targets.items():
            ports[port] = f"/metrics of {service}"
        return ports


def _names(role: str, count: int) -> list[str]:
    return [f"{role}_{index}" for index in range(count)]


def _check_plan_targets(plan: FaultPlan, servers: list[str]) -> None:
    for index, rule in enumerate(plan.faults):
        if rule.server not in ROLES and rule.server not in servers:
            known = ", ".join([*ROLES, *servers])
            raise FaultPlanError(
                f"fault plan: faults[{index}].server: {rule.server!r} is neither a role nor a server of this "
                f"run (known: {known})"
            )


def _telemetry(options: HarnessOptions, prometheus_port: int | None) -> TelemetryConfig:
    if not options.telemetry:
        return TelemetryConfig(enabled=False, run_id=options.run_id)
    metrics = ["file"]
    if options.otlp_endpoint:
        metrics.insert(0, "otlp")
    if prometheus_port is not None:
        metrics.append("prometheus")
    return TelemetryConfig(
        enabled=True,
        traces_exporter="otlp" if options.otlp_endpoint else "file",
        metrics_exporter=",".join(metrics),
        otlp_endpoint=options.otlp_endpoint,
        metric_export_interval_ms=_METRIC_EXPORT_INTERVAL_MS,
        export_timeout_ms=_EXPORT_TIMEOUT_MS,
        prometheus_host=options.host if prometheus_port is not None else None,
        prometheus_port=prometheus_port,
        run_id=options.run_id,
        file_export_dir=str(options.telemetry_dir.resolve()),
    )


def build_layout(options: HarnessOptions) -> StackLayout:
    """The validated global config of the run; raises ``FaultPlanError`` / ``ConfigError`` naming the key."""
    agents = _names("agent", options.agents)
    models = _names("model", options.models)
    resources = _names("resources", options.resources)
    everyone = [*agents, *models, *resources]
    plan = options.fault_plan or FaultPlan()
    _check_plan_targets(plan, everyone)
    plan_data = plan.model_dump(mode="json", exclude_none=True) if plan.faults else None

    prom_base = options.prometheus_port_base if options.telemetry else None
    targets: dict[str, int] = {}
    if prom_base is not None:
        targets[names.SERVICE_NAME_PREFIX + DRIVER_NAME] = prom_base

    roles: dict[str, str] = {}
    servers: dict[str, Any] = {}
    for index, name in enumerate(everyone, start=1):
        role = name.rsplit("_", 1)[0]
        roles[name] = role
        own: dict[str, Any] = {"seed": None if options.seed is None else options.seed + index}
        if plan_data is not None:
            own["fault_plan"] = plan_data
        if prom_base is not None:
            own["prometheus_port"] = prom_base + index
            targets[names.SERVICE_NAME_PREFIX + name] = prom_base + index
        if role == "agent":
            own.update(
                models=models,
                resources=resources,
                turns=options.turns,
                fanout=options.fanout,
                request_timeout_s=options.request_timeout_s,
            )
        elif role == "model":
            own["latency"] = {
                "distribution": options.latency_distribution,
                "median_s": options.model_latency_s,
            }
        servers[name] = {
            "entrypoint": ENTRYPOINTS[role],
            "server_type": ROLE_SERVER_TYPES[role],
            "host": options.host,
            "port": options.port_base + index,
            "startup_timeout_s": 60.0,
            **own,
        }
    data: dict[str, Any] = {
        "head_server": {"host": options.host, "port": options.port_base},
        "telemetry": _telemetry(options, None).model_dump(exclude_none=True),
        "servers": servers,
    }
    if options.pool_limit_per_host is not None:
        data["client"] = {"global_aiohttp_connector_limit_per_host": options.pool_limit_per_host}
    config = parse_global_config(data, source="harness")
    return StackLayout(
        config=config,
        roles=roles,
        agents=agents,
        driver_telemetry=_telemetry(options, prom_base),
        prometheus_targets=targets,
    )


def check_ports_free(layout: StackLayout) -> None:
    """Fail before starting anything when a port is taken: a clear message beats a dead child process."""
    for port, owner in sorted(layout.ports().items()):
        host = layout.config.head_server.host
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                sock.bind((host, port))
            except OSError as exc:
                why = (
                    "is already in use"
                    if exc.errno == errno.EADDRINUSE
                    else f"cannot be bound ({exc.strerror})"
                )
                raise HarnessError(
                    f"port {port} on {host} ({owner}) {why}; stop what uses it or pick other ports with "
                    "--port-base / --prometheus-port-base"
                ) from None


def write_prometheus_targets(layout: StackLayout, out: Path) -> Path | None:
    """``prometheus_targets.json`` in file_sd format: one target per process, ``job`` = ``service.name``."""
    if not layout.prometheus_targets:
        return None
    host = layout.config.head_server.host
    groups = [
        {"targets": [f"{host}:{port}"], "labels": {"job": service}}
        for service, port in layout.prometheus_targets.items()
    ]
    path = out / "prometheus_targets.json"
    path.write_text(json.dumps(groups, indent=2) + "\n", encoding="utf-8")
    return path
