"""Pydantic models of the global config: head server, telemetry, client pools and every server process.

One module so that the YAML global config is validated in one place with errors that name the bad key.
It sits just above the bottom layer: the ``telemetry`` section is
:class:`~gym_obs.telemetry.settings.TelemetryConfig`, owned by telemetry (which reads it), and secret keys
are recognised by :func:`~gym_obs.telemetry.redaction.is_secret_key`. Client, server and harness import
this module; telemetry and failures never do.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gym_obs.telemetry.groups import UnknownSpanGroup, parse_span_groups
from gym_obs.telemetry.names import ENV_SPAN_GROUPS
from gym_obs.telemetry.redaction import REDACTED, is_secret_key
from gym_obs.telemetry.settings import TelemetryConfig


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a config file must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class GlobalAIOHTTPAsyncClientConfig(_Strict):
    """Connection pools of the process-wide aiohttp sessions (data and control)."""

    # Bounds of the fields below (the kernel's TCP keepalive maxima; the retry backoff floor).
    TCP_KEEPALIVE_MAX_SECONDS: ClassVar[int] = 32767
    TCP_KEEPALIVE_MAX_PROBES: ClassVar[int] = 127
    RETRY_BACKOFF_MIN_SECONDS: ClassVar[float] = 0.001

    global_aiohttp_connector_limit: int = Field(default=100 * 1024, ge=0)
    global_aiohttp_connector_limit_per_host: int = Field(default=1024, ge=0)
    global_aiohttp_control_connector_limit: int = Field(default=256, ge=0)
    global_aiohttp_control_connector_limit_per_host: int = Field(default=64, ge=0)
    # Machine-wide load the capacity report checks the limits against: positive, or unset (no check).
    global_aiohttp_intended_concurrency: int | None = Field(default=None, gt=0)
    global_aiohttp_intended_concurrency_per_host: int | None = Field(default=None, gt=0)
    # Linux refuses TCP_KEEPIDLE/TCP_KEEPINTVL above 32767 s and TCP_KEEPCNT above 127 with EINVAL, which
    # would fail every connect for the whole retry budget: refused here, at config load.
    global_aiohttp_tcp_keepalive_idle_seconds: int = Field(default=60, gt=0, le=TCP_KEEPALIVE_MAX_SECONDS)
    global_aiohttp_tcp_keepalive_interval_seconds: int = Field(
        default=10, gt=0, le=TCP_KEEPALIVE_MAX_SECONDS
    )
    global_aiohttp_tcp_keepalive_probes: int = Field(default=3, gt=0, le=TCP_KEEPALIVE_MAX_PROBES)
    global_aiohttp_client_request_debug: bool = False
    global_aiohttp_max_retry_seconds: float = Field(default=60.0, gt=0)
    # Idle pooled connections are closed by the client after this long. Kept below uvicorn's default
    # ``timeout_keep_alive`` (5 s) so the client, not the server, closes an idle connection first: a request
    # written onto a connection the server is closing at that moment is the classic lost-request race.
    global_aiohttp_keepalive_timeout_seconds: float = Field(default=4.0, gt=0)
    # Backoff between connection-level retries: full jitter over ``base * 2**(retry - 1)``, capped. A base
    # of 0 (or a cap below the base) cannot back off: a refused port would be hammered thousands of times
    # a second, so both have a floor.
    global_aiohttp_retry_backoff_base_seconds: float = Field(
        default=0.1, ge=RETRY_BACKOFF_MIN_SECONDS, allow_inf_nan=False
    )
    global_aiohttp_retry_backoff_cap_seconds: float = Field(
        default=5.0, ge=RETRY_BACKOFF_MIN_SECONDS, allow_inf_nan=False
    )
    # The control pool (health checks, head server) gets a finite total timeout; data calls (model
    # generations) may legitimately take minutes and have none unless the caller passes one.
    global_aiohttp_control_timeout_seconds: float = Field(default=30.0, gt=0)

    @field_validator(
        "global_aiohttp_connector_limit",
        "global_aiohttp_connector_limit_per_host",
        "global_aiohttp_control_connector_limit",
        "global_aiohttp_control_connector_limit_per_host",
        "global_aiohttp_intended_concurrency",
        "global_aiohttp_intended_concurrency_per_host",
        "global_aiohttp_tcp_keepalive_idle_seconds",
        "global_aiohttp_tcp_keepalive_interval_seconds",
        "global_aiohttp_tcp_keepalive_probes",
        mode="before",
    )
    @classmethod
    def _whole_numbers_only(cls, value: object) -> object:
        if isinstance(value, bool):  # YAML's yes/on would otherwise become 1
            raise ValueError(f"must be a whole number, not a boolean (got {value!r})")
        return value

    @model_validator(mode="after")
    def _check_backoff(self) -> GlobalAIOHTTPAsyncClientConfig:
        base = self.global_aiohttp_retry_backoff_base_seconds
        cap = self.global_aiohttp_retry_backoff_cap_seconds
        if cap < base:
            raise ValueError(
                f"global_aiohttp_retry_backoff_cap_seconds ({cap:g}) must be >= "
                f"global_aiohttp_retry_backoff_base_seconds ({base:g}): a cap below the base cannot back off"
            )
        return self


# --- server runtime: head server, server instances, the global config ------------------------------------

_SERVER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_ENTRYPOINT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
#: The server types of a global config (NeMo Gym's): each decides the boundary its failures are reported
#: at (model, resources_server, agent) and what the runtime adds (model-call metrics, the in-flight table).
SERVER_TYPES: Final = ("responses_api_agents", "responses_api_models", "resources_servers")
#: A server's own-config section for its model-call layer (``server/model_calls.py``); callers read it too.
MODEL_CALLS_CONFIG_KEY: Final = "model_calls"


def model_calls_enabled(server_type: str, switch: object) -> bool:
    """Whether a server's dialect routes are model calls: its ``model_calls.enabled`` when that is a bool,
    else on for ``responses_api_models``. The server's own layer and its callers (``ServerClient``) follow
    this one rule, so both ends of a hop agree."""
    return switch if isinstance(switch, bool) else server_type == "responses_api_models"


class ConfigError(ValueError):
    """A global config that cannot be used; the message names every bad key."""


def _no_bool(value: object) -> object:
    """YAML reads ``yes``/``on``/``true`` as booleans, and pydantic would take them as 1: refuse them."""
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number, not a boolean (got {value!r})")
    return value


class HeadServerConfig(_Strict):
    """Where the head server listens; every process finds the others through it."""

    host: str = "127.0.0.1"
    port: int = Field(default=11000, ge=1, le=65535)

    _check_port = field_validator("port", mode="before")(_no_bool)


class ServerInstanceConfig(BaseModel):
    """One server process of the global config.

    Keys not declared here are the server's own configuration and are kept (``model_extra``, or attribute
    access on the instance); only a key that looks like a misspelt runtime key is rejected.
    """

    model_config = ConfigDict(extra="allow")

    entrypoint: str
    server_type: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    num_workers: int = Field(default=1, ge=1)
    proxy_headers: bool = False
    forwarded_allow_ips: list[str] | None = None
    backlog: int = Field(default=2048, gt=0)
    reuse_port: bool = False
    # Longer than client pools keep idle connections, so the server never closes one under a client.
    timeout_keep_alive_s: int = Field(default=75, gt=0)
    access_log: bool = False
    log_level: str = "info"
    # Request limits, enforced by the HTTP protocol before the app runs (see docs/runtime.md).
    http_head_max_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    http_head_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    http_body_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024)
    startup_timeout_s: float = Field(default=60.0, gt=0)
    # Sessions: the secret this server's session keys derive from. Unset: a secret generated per
    # deployment (sessions then end with the server). Never served by the head server (redacted there, as
    # every secret-looking key is); launched servers get it from the launcher's environment.
    session_secret: str | None = Field(default=None, min_length=16)
    # CPU profiling for the server's lifetime (extra `profiling`); reports on shutdown and GET /stats.
    profiling_enabled: bool = False
    profiling_results_dirpath: str | None = None
    # Who may read the control routes (``/_gym/inflight``) besides loopback: addresses or CIDR networks.
    control_allow_ips: list[str] = Field(default_factory=list)

    _check_numbers = field_validator(
        "port", "num_workers", "backlog", "timeout_keep_alive_s", "startup_timeout_s", mode="before"
    )(_no_bool)
    _check_limits = field_validator(
        "http_head_max_bytes", "http_head_timeout_s", "http_body_max_bytes", mode="before"
    )(_no_bool)

    @field_validator("session_secret", mode="before")
    @classmethod
    def _redacted_secret_is_unset(cls, value: object) -> object:
        """A config fetched from the head server has ``[REDACTED]`` here: no secret, not a 10-char one."""
        return None if value == REDACTED else value

    @field_validator("server_type")
    @classmethod
    def _check_server_type(cls, value: str) -> str:
        if value not in SERVER_TYPES:
            raise ValueError(f"unknown server_type {value!r}; valid: {', '.join(SERVER_TYPES)}")
        return value

    @field_validator("control_allow_ips")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
        return value

    @field_validator("entrypoint")
    @classmethod
    def _check_entrypoint(cls, value: str) -> str:
        if not re.match(_ENTRYPOINT_PATTERN, value):
            raise ValueError("must look like 'package.module:ClassName'")
        return value

    @model_validator(mode="after")
    def _reject_misspelt_keys(self) -> ServerInstanceConfig:
        for key in self.model_extra or {}:
            close = difflib.get_close_matches(key, type(self).model_fields, n=1, cutoff=0.85)
            if close:
                raise ValueError(f"unknown key {key!r} (did you mean {close[0]!r}?)")
        return self

    def own_config(self) -> dict[str, Any]:
        """The server's own keys (everything the runtime does not interpret)."""
        return dict(self.model_extra or {})


class GlobalConfig(_Strict):
    """The whole deployment: head server, telemetry, client pools and every server process."""

    head_server: HeadServerConfig = Field(default_factory=HeadServerConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    client: GlobalAIOHTTPAsyncClientConfig = Field(default_factory=GlobalAIOHTTPAsyncClientConfig)
    servers: dict[str, ServerInstanceConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_names_and_ports(self) -> GlobalConfig:
        seen: dict[tuple[str, int], str] = {(self.head_server.host, self.head_server.port): "head_server"}
        for name, server in self.servers.items():
            if not re.match(_SERVER_NAME_PATTERN, name):
                raise ValueError(f"servers.{name}: server names use letters, digits, '_', '.', '-'")
            key = (server.host, server.port)
            if key in seen:
                raise ValueError(
                    f"servers.{name}.port: {server.host}:{server.port} is already used by {seen[key]}"
                )
            seen[key] = f"servers.{name}"
        return self

    def server(self, name: str) -> ServerInstanceConfig:
        """The named server's config, with an error that lists the known names."""
        try:
            return self.servers[name]
        except KeyError:
            known = ", ".join(sorted(self.servers)) or "none"
            raise KeyError(f"no server named {name!r} in the global config (known: {known})") from None


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid global config ({source}):"]
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        elif any(is_secret_key(part) for part in item["loc"]):
            pass  # never echo a secret, not even a malformed one
        elif item["type"] not in ("missing", "value_error", "assertion_error"):
            shown = repr(item.get("input"))
            message += f" (got {shown[:80]})"
        lines.append(f"  {where}: {message}" if where else f"  {message}")
    return "\n".join(lines)


def parse_global_config(data: object, *, source: str = "<config>") -> GlobalConfig:
    """Validate an already-parsed mapping (YAML/JSON) into a GlobalConfig or raise ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid global config ({source}): the top level must be a mapping")
    try:
        config = GlobalConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, source)) from None
    _check_span_groups_environment(config, source)
    return config


def _check_span_groups_environment(config: GlobalConfig, source: str) -> None:
    """``GYM_OBS_SPAN_GROUPS`` (used when the config names no ``span_groups``) fails config loading too."""
    raw = os.environ.get(ENV_SPAN_GROUPS, "")
    if config.telemetry.span_groups is not None or not raw.strip():
        return
    try:
        parse_span_groups(raw)
    except UnknownSpanGroup as error:
        raise ConfigError(f"invalid global config ({source}): {ENV_SPAN_GROUPS}: {error}") from None


def _unique_key_loader() -> type[Any]:
    """A safe YAML loader that refuses duplicate keys (PyYAML silently keeps the last one)."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable: the constructor reports it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return _Loader


def _describe_yaml_error(error: Exception) -> str:
    """``line L, column C: problem`` (1-based, where the parser gave up), not PyYAML's multi-line dump."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None or not problem:
        return str(error)
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if context and context_mark is not None:
        text += f" ({context} started at line {context_mark.line + 1}, column {context_mark.column + 1})"
    return text


def load_global_config(path: str | os.PathLike[str]) -> GlobalConfig:
    """Read a YAML global config file; errors name the file and the bad key (or line, for YAML errors).

    An empty file is an error: it is almost always the wrong path or an unsaved editor buffer, and serving
    a deployment without a single server hides that.
    """
    import yaml

    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=_unique_key_loader())  # a SafeLoader subclass
    except OSError as error:
        raise ConfigError(f"cannot read global config {source}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"cannot read global config {source}: not UTF-8 text (byte {error.start}: {error.reason})"
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"invalid YAML in global config {source}: {_describe_yaml_error(error)}") from None
    if data is None:
        raise ConfigError(f"invalid global config ({source}): the file is empty")
    return parse_global_config(data, source=source)
