"""The telemetry config model and how it meets the ``OTEL_*``/``GYM_OBS_*`` environment.

:class:`TelemetryConfig` is the ``telemetry:`` section of the global config (``gym_obs.config`` nests it);
it lives here because the bottom layer owns what it reads. :func:`resolve_settings` merges it with the
environment: explicit config, else the standard ``OTEL_*`` variables, else defaults. Pure (the environment
is passed in) so every garbage value can be tested in-process. A bad value never raises: it becomes a
*problem* (one sentence naming the variable, the value and what happens instead) and the setting falls back
to something safe, usually "that part of telemetry is off".
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gym_obs.telemetry import names
from gym_obs.telemetry.groups import DEFAULT_GROUPS, SpanGroups, UnknownSpanGroup, parse_span_groups
from gym_obs.telemetry.propagation import parse_propagation_targets
from gym_obs.telemetry.redaction import scrub_text

__all__ = [
    "DEFAULT_FILE_EXPORT_DIR",
    "DEFAULT_METRIC_EXPORT_INTERVAL_MS",
    "DEFAULT_PROMETHEUS_HOST",
    "DEFAULT_PROMETHEUS_PORT",
    "DEFAULT_SAMPLER",
    "DEFAULT_SPAN_SCHEDULE_DELAY_MS",
    "ENV_FALSE",
    "ENV_TRUE",
    "METRICS_EXPORTERS",
    "PROTOCOLS",
    "SAMPLERS",
    "TRACES_EXPORTERS",
    "OtlpProtocol",
    "OtlpTarget",
    "Settings",
    "TelemetryConfig",
    "parse_resource_attributes",
    "resolve_run_id",
    "resolve_settings",
    "scheduler_job_id",
]

OtlpProtocol = Literal["http/protobuf", "grpc"]

TRACES_EXPORTERS: Final = ("otlp", "console", "file", "none")
METRICS_EXPORTERS: Final = ("otlp", "console", "prometheus", "file", "none")
# Logs go over OTLP only when asked for (OTEL_LOGS_EXPORTER or the config): the stderr lines always exist.
LOGS_EXPORTERS: Final = ("otlp", "file", "none")
DEFAULT_FILE_EXPORT_DIR: Final = "telemetry"
PROTOCOLS: Final = ("http/protobuf", "grpc")
SAMPLERS: Final = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
DEFAULT_SAMPLER: Final = "parentbased_always_on"
DEFAULT_METRIC_EXPORT_INTERVAL_MS: Final = names.DEFAULT_EXPORT_INTERVAL_S * 1000  # not the SDK's 60 s
DEFAULT_PROMETHEUS_HOST: Final = "localhost"
DEFAULT_PROMETHEUS_PORT: Final = 9464
DEFAULT_SPAN_SCHEDULE_DELAY_MS: Final = 5000
_DEFAULT_ENDPOINTS: Final = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
_HTTP_PATHS: Final = {"traces": "/v1/traces", "metrics": "/v1/metrics", "logs": "/v1/logs"}
ENV_TRUE: Final = frozenset({"1", "true", "yes", "on"})
"""Values of a boolean ``GYM_OBS_*`` switch that mean on (after strip and lower-case)."""
ENV_FALSE: Final = frozenset({"", "0", "false", "no", "off"})
"""Values that mean off; anything else is a problem reported once, and the switch stays off."""


class TelemetryConfig(BaseModel):
    """Telemetry settings. ``None`` means: take it from the standard ``OTEL_*`` environment, else default.

    Unknown keys are errors: a typo in a config file must not be silently ignored.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None
    traces_exporter: str | None = None  # otlp | console | none (comma-separated allowed)
    metrics_exporter: str | None = None  # otlp | console | prometheus | none
    otlp_endpoint: str | None = None
    otlp_protocol: OtlpProtocol | None = None
    sampler: str | None = None
    sampler_arg: str | None = None
    metric_export_interval_ms: int | None = Field(default=None, gt=0)
    prometheus_host: str | None = None
    prometheus_port: int | None = Field(default=None, ge=0, le=65535)
    resource_attributes: dict[str, str] = Field(default_factory=dict)
    run_id: str | None = None
    trace_propagation_targets: list[str] | None = None
    span_queue_size: int = Field(default=2048, gt=0)
    span_batch_size: int = Field(default=512, gt=0)
    export_timeout_ms: int = Field(default=10_000, gt=0)
    file_export_dir: str | None = None  # exporter `file`: OTLP JSON lines here (else GYM_OBS_TELEMETRY_DIR)
    logs_exporter: str | None = None  # otlp | file | none (default none; else OTEL_LOGS_EXPORTER)
    span_groups: str | None = None  # "default,model_call" (else GYM_OBS_SPAN_GROUPS; telemetry/groups.py)
    # Who writes the SERVER span: gym_obs's own layer, or opentelemetry-instrumentation-fastapi for its
    # extras (active requests, body sizes, header capture). Else GYM_OBS_SERVER_INSTRUMENTATION, else native.
    server_instrumentation: Literal["native", "contrib"] | None = None

    @field_validator("span_groups")
    @classmethod
    def _known_span_groups(cls, value: str | None) -> str | None:
        """An unknown group or preset fails config loading, naming every valid one."""
        if value is not None:
            parse_span_groups(value)
        return value


@dataclass(frozen=True)
class OtlpTarget:
    """Where one signal is exported over OTLP."""

    protocol: str
    endpoint: str


@dataclass(frozen=True)
class Settings:
    """Everything ``setup_telemetry`` needs, already validated."""

    enabled: bool
    traces_exporters: tuple[str, ...]
    metrics_exporters: tuple[str, ...]
    otlp_traces: OtlpTarget | None
    otlp_metrics: OtlpTarget | None
    sampler: str
    sampler_ratio: float
    metric_export_interval_ms: int
    prometheus_host: str
    prometheus_port: int
    resource_attributes: dict[str, str]  # from OTEL_RESOURCE_ATTRIBUTES; config ones are applied last
    run_id: str
    propagation_targets: frozenset[str]
    span_queue_size: int
    span_batch_size: int
    export_timeout_ms: int
    problems: tuple[str, ...] = field(default=())
    file_export_dir: str = DEFAULT_FILE_EXPORT_DIR  # for the `file` exporter
    span_schedule_delay_ms: int = DEFAULT_SPAN_SCHEDULE_DELAY_MS  # OTEL_BSP_SCHEDULE_DELAY
    logs_exporters: tuple[str, ...] = ()
    otlp_logs: OtlpTarget | None = None
    span_groups: SpanGroups = DEFAULT_GROUPS


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        if message not in self.items:
            self.items.append(message)


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value.strip() if isinstance(value, str) and value.strip() else None


def _parse_bool(name: str, raw: str | None, problems: _Problems) -> bool:
    value = (raw or "").strip().lower()
    if value in ENV_TRUE:
        return True
    if value not in ENV_FALSE:
        problems.add(f"{name}={raw!r} is not a boolean (use 1 or 0); telemetry stays off")
    return False


def _exporters(source: str, raw: str, allowed: tuple[str, ...], problems: _Problems) -> tuple[str, ...]:
    chosen: list[str] = []
    for item in raw.split(","):
        name = item.strip().lower()
        if not name:
            continue
        if name not in allowed:
            problems.add(
                f"{source}: unknown exporter {item.strip()!r} (expected one of {', '.join(allowed)}); ignored"
            )
        elif name != "none" and name not in chosen:
            chosen.append(name)
    return tuple(chosen)


def _protocol(source: str, raw: str, problems: _Problems) -> str:
    value = raw.strip().lower()
    if value in PROTOCOLS:
        return value
    problems.add(
        f"{source}={raw!r} is not a supported OTLP protocol ({', '.join(PROTOCOLS)}); using http/protobuf"
    )
    return "http/protobuf"


def _valid_endpoint(url: str) -> bool:
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _otlp_target(
    signal: str, config: TelemetryConfig, env: Mapping[str, str], problems: _Problems
) -> OtlpTarget | None:
    upper = signal.upper()
    protocol_source = f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"
    raw_protocol = _env(env, protocol_source)
    if raw_protocol is None:
        protocol_source = "OTEL_EXPORTER_OTLP_PROTOCOL"
        raw_protocol = _env(env, protocol_source)
    protocol = config.otlp_protocol or (
        _protocol(protocol_source, raw_protocol, problems) if raw_protocol else "http/protobuf"
    )
    signal_endpoint = _env(env, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    if config.otlp_endpoint:
        source, base, exact = "config otlp_endpoint", config.otlp_endpoint.strip(), False
    elif signal_endpoint:
        source, base, exact = f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT", signal_endpoint, True
    elif _env(env, "OTEL_EXPORTER_OTLP_ENDPOINT"):
        source, base, exact = (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            _env(env, "OTEL_EXPORTER_OTLP_ENDPOINT") or "",
            False,
        )
    else:
        source, base, exact = "default", _DEFAULT_ENDPOINTS[protocol], False
    if not _valid_endpoint(base):
        problems.add(
            f"{source}={scrub_text(base)[:120]!r} is not an http(s) URL with a host;"
            f" OTLP {signal} export is off"
        )
        return None
    endpoint = base if exact or protocol == "grpc" else base.rstrip("/") + _HTTP_PATHS[signal]
    return OtlpTarget(protocol=protocol, endpoint=endpoint)


def _sampler(config: TelemetryConfig, env: Mapping[str, str], problems: _Problems) -> tuple[str, float]:
    source = "config sampler" if config.sampler else "OTEL_TRACES_SAMPLER"
    raw = config.sampler or _env(env, "OTEL_TRACES_SAMPLER") or DEFAULT_SAMPLER
    name = raw.strip().lower()
    if name not in SAMPLERS:
        problems.add(
            f"{source}={raw!r} is not a known sampler ({', '.join(SAMPLERS)}); using {DEFAULT_SAMPLER}"
        )
        name = DEFAULT_SAMPLER
    ratio = 1.0
    arg_source = "config sampler_arg" if config.sampler_arg else "OTEL_TRACES_SAMPLER_ARG"
    raw_arg = config.sampler_arg or _env(env, "OTEL_TRACES_SAMPLER_ARG")
    if name.endswith("traceidratio") and raw_arg is not None:
        try:
            ratio = float(raw_arg)
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(raw_arg)
        except ValueError:
            problems.add(f"{arg_source}={raw_arg!r} is not a ratio between 0 and 1; sampling everything")
            ratio = 1.0
    return name, ratio


def _int_setting(
    source: str, raw: str | None, default: int, problems: _Problems, *, low: int, high: int, what: str
) -> int:
    """``raw`` as an integer in ``[low, high]``; anything else is reported once and ``default`` used."""
    if raw is None:
        return default
    try:
        value = int(raw)
        if not low <= value <= high:
            raise ValueError(raw)
    except ValueError:
        problems.add(f"{source}={raw!r} is not {what}; using {default}")
        return default
    return value


def _positive_int(source: str, raw: str | None, default: int, problems: _Problems) -> int:
    return _int_setting(source, raw, default, problems, low=1, high=2**63 - 1, what="a positive integer")


def _port(source: str, raw: str | None, default: int, problems: _Problems) -> int:
    return _int_setting(source, raw, default, problems, low=0, high=65535, what="a TCP port")


def parse_resource_attributes(raw: str | None, problems: _Problems | None = None) -> dict[str, str]:
    """Parse ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``, values percent-decoded); bad pairs are skipped."""
    result: dict[str, str] = {}
    if not raw:
        return result
    bad: list[str] = []
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            bad.append(item.strip())
            continue
        result[key.strip()] = unquote(value.strip())
    if bad and problems is not None:
        shown = ", ".join(repr(b[:40]) for b in bad[:3])
        problems.add(
            f"OTEL_RESOURCE_ATTRIBUTES has entries that are not key=value ({shown}); they are ignored"
        )
    return result


def resolve_settings(config: TelemetryConfig, env: Mapping[str, str]) -> Settings:
    """Merge ``config`` (wins), ``env`` and defaults into validated :class:`Settings`."""
    problems = _Problems()
    if config.enabled is not None:
        enabled = config.enabled
    else:
        enabled = _parse_bool(names.ENV_TELEMETRY, env.get(names.ENV_TELEMETRY), problems)
    if enabled and (_env(env, "OTEL_SDK_DISABLED") or "").lower() == "true" and config.enabled is None:
        enabled = False
        problems.add("OTEL_SDK_DISABLED=true; telemetry stays off")

    if not enabled:
        return _disabled_settings(config, env, problems)

    traces_source = "config traces_exporter" if config.traces_exporter else "OTEL_TRACES_EXPORTER"
    traces_raw = config.traces_exporter or _env(env, "OTEL_TRACES_EXPORTER") or "otlp"
    traces = _exporters(traces_source, traces_raw, TRACES_EXPORTERS, problems)
    metrics_source = "config metrics_exporter" if config.metrics_exporter else "OTEL_METRICS_EXPORTER"
    metrics_raw = config.metrics_exporter or _env(env, "OTEL_METRICS_EXPORTER") or "otlp"
    metrics = _exporters(metrics_source, metrics_raw, METRICS_EXPORTERS, problems)

    logs_source = "config logs_exporter" if config.logs_exporter else "OTEL_LOGS_EXPORTER"
    logs_raw = config.logs_exporter or _env(env, "OTEL_LOGS_EXPORTER") or "none"
    logs = _exporters(logs_source, logs_raw, LOGS_EXPORTERS, problems)

    otlp_traces = _otlp_target("traces", config, env, problems) if "otlp" in traces else None
    otlp_metrics = _otlp_target("metrics", config, env, problems) if "otlp" in metrics else None
    otlp_logs = _otlp_target("logs", config, env, problems) if "otlp" in logs else None
    if otlp_logs is None:
        logs = tuple(item for item in logs if item != "otlp")
    if otlp_traces is None:
        traces = tuple(t for t in traces if t != "otlp")
    if otlp_metrics is None:
        metrics = tuple(m for m in metrics if m != "otlp")

    sampler, ratio = _sampler(config, env, problems)
    interval = config.metric_export_interval_ms or _positive_int(
        "OTEL_METRIC_EXPORT_INTERVAL",
        _env(env, "OTEL_METRIC_EXPORT_INTERVAL"),
        DEFAULT_METRIC_EXPORT_INTERVAL_MS,
        problems,
    )
    prom_host = (
        config.prometheus_host or _env(env, "OTEL_EXPORTER_PROMETHEUS_HOST") or DEFAULT_PROMETHEUS_HOST
    )
    prom_port = (
        config.prometheus_port
        if config.prometheus_port is not None
        else _port(
            "OTEL_EXPORTER_PROMETHEUS_PORT",
            _env(env, "OTEL_EXPORTER_PROMETHEUS_PORT"),
            DEFAULT_PROMETHEUS_PORT,
            problems,
        )
    )
    resource = parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES"), problems)
    groups = _span_groups(config, env, problems)
    schedule_delay = _positive_int(
        "OTEL_BSP_SCHEDULE_DELAY",
        _env(env, "OTEL_BSP_SCHEDULE_DELAY"),
        DEFAULT_SPAN_SCHEDULE_DELAY_MS,
        problems,
    )
    return Settings(
        enabled=enabled,
        traces_exporters=traces,
        metrics_exporters=metrics,
        otlp_traces=otlp_traces,
        otlp_metrics=otlp_metrics,
        sampler=sampler,
        sampler_ratio=ratio,
        metric_export_interval_ms=interval,
        prometheus_host=prom_host,
        prometheus_port=prom_port,
        resource_attributes=resource,
        run_id=_run_id(config, env),
        propagation_targets=_targets(config, env),
        span_queue_size=config.span_queue_size,
        span_batch_size=min(config.span_batch_size, config.span_queue_size),
        export_timeout_ms=config.export_timeout_ms,
        problems=tuple(problems.items),
        file_export_dir=config.file_export_dir
        or _env(env, names.ENV_TELEMETRY_DIR)
        or DEFAULT_FILE_EXPORT_DIR,
        span_schedule_delay_ms=schedule_delay,
        logs_exporters=logs,
        otlp_logs=otlp_logs,
        span_groups=groups,
    )


def _span_groups(config: TelemetryConfig, env: Mapping[str, str], problems: _Problems) -> SpanGroups:
    """Config beats ``GYM_OBS_SPAN_GROUPS``; an unknown name in the environment is reported (with the valid
    names) and the default preset used, since setting telemetry up never raises."""
    if config.span_groups is not None:
        return parse_span_groups(config.span_groups)
    raw = _env(env, names.ENV_SPAN_GROUPS)
    try:
        return parse_span_groups(raw)
    except UnknownSpanGroup as exc:
        problems.add(f"{names.ENV_SPAN_GROUPS}: {exc}; using the default preset")
        return DEFAULT_GROUPS


def _run_id(config: TelemetryConfig, env: Mapping[str, str]) -> str:
    return resolve_run_id(config.run_id, env)


def scheduler_job_id(env: Mapping[str, str]) -> str | None:
    """The batch scheduler's job id (Slurm, PBS, LSF, SGE), if this process runs inside a job."""
    for name in names.SCHEDULER_JOB_ID_ENVS:
        value = _clean_run_id(_env(env, name))
        if value:
            return value
    return None


def resolve_run_id(configured: str | None, env: Mapping[str, str]) -> str:
    """``gym.run.id``: the configured one, else ``GYM_OBS_RUN_ID`` (set by a launcher for its children),
    else the scheduler's job id, else a new random id (which a launcher then shares with its children)."""
    return (
        _clean_run_id(configured)
        or _clean_run_id(_env(env, names.ENV_RUN_ID))
        or scheduler_job_id(env)
        or uuid.uuid4().hex
    )


def _clean_run_id(value: str | None) -> str | None:
    """A run id is a short printable label (it goes on every resource): trimmed and bounded."""
    if value is None:
        return None
    text = "".join(ch for ch in value.strip() if ch.isprintable())
    return text[: names.MAX_RUN_ID_CHARS] or None


def _targets(config: TelemetryConfig, env: Mapping[str, str]) -> frozenset[str]:
    raw: str | list[str] | None = config.trace_propagation_targets
    if raw is None:
        raw = env.get(names.ENV_TRACE_PROPAGATION_TARGETS)
    return parse_propagation_targets(raw)


def _disabled_settings(config: TelemetryConfig, env: Mapping[str, str], problems: _Problems) -> Settings:
    """Telemetry is off: nothing else is validated (or reported), but routing-relevant parts still apply."""
    return Settings(
        enabled=False,
        traces_exporters=(),
        metrics_exporters=(),
        otlp_traces=None,
        otlp_metrics=None,
        sampler=DEFAULT_SAMPLER,
        sampler_ratio=1.0,
        metric_export_interval_ms=DEFAULT_METRIC_EXPORT_INTERVAL_MS,
        prometheus_host=DEFAULT_PROMETHEUS_HOST,
        prometheus_port=DEFAULT_PROMETHEUS_PORT,
        resource_attributes={},
        run_id=_run_id(config, env),
        propagation_targets=_targets(config, env),
        span_queue_size=config.span_queue_size,
        span_batch_size=min(config.span_batch_size, config.span_queue_size),
        export_timeout_ms=config.export_timeout_ms,
        problems=tuple(problems.items),
    )


def resolve_server_instrumentation(config: TelemetryConfig, env: Mapping[str, str]) -> tuple[str, str | None]:
    """Who writes the SERVER span (``native`` | ``contrib``): config, else ``GYM_OBS_SERVER_INSTRUMENTATION``,
    else ``native``; with the problem sentence of a bad environment value (which falls back to native)."""
    if config.server_instrumentation is not None:
        return config.server_instrumentation, None
    raw = _env(env, names.ENV_SERVER_INSTRUMENTATION)
    if raw is None:
        return names.SERVER_INSTRUMENTATION_NATIVE, None
    value = raw.lower()
    if value in names.SERVER_INSTRUMENTATIONS:
        return value, None
    allowed = " or ".join(names.SERVER_INSTRUMENTATIONS)
    problem = (
        f"{names.ENV_SERVER_INSTRUMENTATION}={raw[:40]!r} is not {allowed};"
        f" using {names.SERVER_INSTRUMENTATION_NATIVE}"
    )
    return names.SERVER_INSTRUMENTATION_NATIVE, problem
