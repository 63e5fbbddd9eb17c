"""Pydantic models for every piece of gym_obs configuration.

One module so that the YAML global config, the environment and explicit arguments are validated in one
place with errors that name the bad key. Standard library and pydantic only: every layer may import it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

OtlpProtocol = Literal["http/protobuf", "grpc"]


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a config file must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class TelemetryConfig(_Strict):
    """Telemetry settings. ``None`` means: take it from the standard ``OTEL_*`` environment, else default."""

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


class GlobalAIOHTTPAsyncClientConfig(_Strict):
    """Connection pools of the process-wide aiohttp sessions (data and control)."""

    global_aiohttp_connector_limit: int = Field(default=100 * 1024, ge=0)
    global_aiohttp_connector_limit_per_host: int = Field(default=1024, ge=0)
    global_aiohttp_control_connector_limit: int = Field(default=256, ge=0)
    global_aiohttp_control_connector_limit_per_host: int = Field(default=64, ge=0)
    global_aiohttp_intended_concurrency: int | None = Field(default=None, ge=0)
    global_aiohttp_intended_concurrency_per_host: int | None = Field(default=None, ge=0)
    global_aiohttp_tcp_keepalive_idle_seconds: int = Field(default=60, gt=0)
    global_aiohttp_tcp_keepalive_interval_seconds: int = Field(default=10, gt=0)
    global_aiohttp_tcp_keepalive_probes: int = Field(default=3, gt=0)
    global_aiohttp_client_request_debug: bool = False
    global_aiohttp_max_retry_seconds: float = Field(default=60.0, gt=0)
