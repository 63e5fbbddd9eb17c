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
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.harness.faults import ROLES, FaultPlan, FaultPlanError
from gym_obs.harness.servers import ENTRYPOINTS
from gym_obs.harness.servers._common import ROLE_SERVER_TYPES
from gym_obs.telemetry import names
from gym_obs.telemetry.settings import TelemetryConfig
from gym_obs.telemetry.setup import launch_run_id

__all__ = [
    "DRIVER_NAME",
    "HarnessError",
    "HarnessOptions",
    "StackLayout",
    "build_layout",
    "check_ports_free",
    "plan_warnings",
    "write_prometheus_targets",
]

DRIVER_NAME: Final = "harness"
MODEL_MAX_LATENCY_S: Final = 5.0  # the demo model's latency clamp (LatencySpec.max_s)
AGENT_MAX_TRIES: Final = 4  # the demo agent's tries per call (AgentSettings.max_tries)
_DEFAULT_CALL_TIMEOUT_S: Final = 5.0
_METRIC_EXPORT_INTERVAL_MS: Final = 5_000
_EXPORT_TIMEOUT_MS: Final = 5_000  # a dead collector must not hold the run's shutdown for long


def _default_run_id() -> str:
    """``GYM_OBS_RUN_ID``, else the batch scheduler's job id, else a short new id (as every launcher)."""
    return launch_run_id(None) if _configured_run_id() else uuid.uuid4().hex[:12]


def _configured_run_id() -> bool:
    return any(os.environ.get(name, "").strip() for name in (names.ENV_RUN_ID, *names.SCHEDULER_JOB_ID_ENVS))


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
    stream: bool = False  # model replies as SSE streams (the model servers' and the agent's setting)
    turns: int = 3
    fanout: int = 3
    request_timeout_s: float | None = None  # None: 5 s, more when the model latency needs it
    seed: int | None = None
    pool_limit_per_host: int | None = None  # data-pool connections per destination, per process
    linger_s: float = 0.0  # keep every process (and its /metrics) up this long after the rollouts
    report: bool = True  # write OUT/report.html at the end of the run (gym_obs.harness.report)
    run_id: str = field(default_factory=lambda: _default_run_id())

    @property
    def telemetry_dir(self) -> Path:
        return self.out / "telemetry"

    @property
    def call_timeout_s(self) -> float:
        """Timeout of each agent -> model/resources call: what ends a ``hang``.

        Short by default so an injected hang costs seconds, not minutes; never shorter than twice the
        longest latency the demo model can draw (its samples are clamped to ``MODEL_MAX_LATENCY_S``).
        """
        if self.request_timeout_s is not None:
            return self.request_timeout_s
        longest = min(MODEL_MAX_LATENCY_S, 20 * self.model_latency_s)
        return max(_DEFAULT_CALL_TIMEOUT_S, 2 * longest)

    @property
    def rollout_timeout_s(self) -> float:
        """The driver's bound on one ``/run``: every turn and the verify at one call timeout each, plus one
        call that used all of the agent's tries, so a hung model or verifier is reported by the agent (with
        its root cause) before the driver gives up, and a hung agent costs a bounded wait."""
        return self.call_timeout_s * (self.turns + 1 + AGENT_MAX_TRIES) + 2.0


@dataclass
class StackLayout:
    """The generated global config plus what the driver needs to know about it."""

    config: GlobalConfig
    roles: dict[str, str]  # server name -> role
    agents: list[str]
    driver_telemetry: TelemetryConfig
    prometheus_targets: dict[str, int] = field(default_factory=dict)  # service.name -> port

    def ports(self) -> list[tuple[int, str]]:
        """Every TCP port the run will listen on, with what listens there (for the busy-port check)."""
        ports = [(self.config.head_server.port, "head_server")]
        for name, server in self.config.servers.items():
            ports.append((server.port, f"servers.{name}"))
        for service, port in self.prometheus_targets.items():
            ports.append((port, f"/metrics of {service}"))
        return ports


def _names(role: str, count: int) -> list[str]:
    return [f"{role}_{index}" for index in range(count)]


def _check_plan_targets(plan: FaultPlan, servers: list[str]) -> None:
    for index, rule in enumerate(plan.faults):
        if rule.server not in ROLES and rule.server not in servers:
            known = ", ".join([*ROLES, *servers])
            raise FaultPlanError(
                f"{plan.source}: faults[{index}].server: {rule.server!r} is neither a role nor a "
                f"server of this run (known: {known})"
            )


#: The routes each demo role serves (a fault on another path never fires).
ROLE_ROUTES: Final[dict[str, tuple[str, ...]]] = {
    "agent": ("/run",),
    "model": ("/v1/responses",),
    "resources": ("/verify",),
}


def plan_warnings(plan: FaultPlan) -> list[str]:
    """Rules that can never fire because their route matches none of the target role's routes."""
    warnings = []
    for index, rule in enumerate(plan.faults):
        role = rule.server if rule.server in ROLES else rule.server.rsplit("_", 1)[0]
        routes = ROLE_ROUTES.get(role, ())
        if routes and not any(rule.matches_path(route) for route in routes):
            warnings.append(
                f"{plan.source}: faults[{index}].route {rule.route!r} matches no route of the {role} "
                f"servers ({', '.join(routes)}); this rule will inject nothing"
            )
    return warnings


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


def _check_port_ranges(options: HarnessOptions, servers: int) -> None:
    """Both port ranges must fit below 65536 and must not overlap: say which flag to change."""
    last = options.port_base + servers
    if not options.port_base >= 1 or last > 65535:
        raise HarnessError(
            f"--port-base {options.port_base}: the head server and {servers} servers need ports "
            f"{options.port_base}-{last}, beyond 65535; pick a lower --port-base"
        )
    base = options.prometheus_port_base
    if base is None or not options.telemetry:
        return
    prom_last = base + servers
    if base < 1 or prom_last > 65535:
        raise HarnessError(
            f"--prometheus-port-base {base}: the driver and {servers} servers need /metrics ports "
            f"{base}-{prom_last}, beyond 65535; pick a lower --prometheus-port-base"
        )
    if base <= last and options.port_base <= prom_last:
        raise HarnessError(
            f"--prometheus-port-base {base}: /metrics ports {base}-{prom_last} overlap the server ports "
            f"{options.port_base}-{last} (--port-base {options.port_base}); pick ranges that do not overlap"
        )


def build_layout(options: HarnessOptions) -> StackLayout:
    """The validated global config of the run; raises ``FaultPlanError`` / ``ConfigError`` naming the key,
    ``HarnessError`` for port ranges that do not fit."""
    _check_port_ranges(options, options.agents + options.models + options.resources)
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
                request_timeout_s=options.call_timeout_s,
                max_tries=AGENT_MAX_TRIES,
                stream=options.stream,
            )
        elif role == "model":
            own["latency"] = {
                "distribution": options.latency_distribution,
                "median_s": options.model_latency_s,
                "max_s": MODEL_MAX_LATENCY_S,
            }
            own["stream"] = options.stream
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
    owners: dict[int, str] = {}
    for port, owner in layout.ports():
        if port in owners:
            raise HarnessError(
                f"port {port} is assigned twice ({owners[port]} and {owner}); change the port bases"
            )
        owners[port] = owner
    for port, owner in sorted(owners.items()):
        host = layout.config.head_server.host
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                sock.bind((host, port))
            except (OSError, OverflowError) as exc:
                if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
                    why = "is already in use; stop what uses it or pick other ports with --port-base"
                    if layout.prometheus_targets:
                        why += " / --prometheus-port-base"
                else:
                    why = f"cannot be bound ({getattr(exc, 'strerror', None) or exc}); check --host"
                raise HarnessError(f"port {port} on {host} ({owner}) {why}") from None


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
