"""Process telemetry set-up: tracer and meter providers from config, the ``OTEL_*`` environment or defaults.

``setup_telemetry`` runs once per process (once it turned telemetry on, later calls return the same
handle; a call that found telemetry off installed nothing and may be repeated), is thread-safe and never
raises: a bad endpoint, an unknown exporter or a garbage environment value is logged once on the
``gym_obs.telemetry`` logger and that part of telemetry stays off while the program runs on.

Telemetry is off unless ``TelemetryConfig.enabled`` or ``GYM_OBS_TELEMETRY=1`` turns it on; off means every
instrumented site costs one ``STATE.enabled`` check. When the application (or a test) already installed SDK
providers globally, they are reused as they are and never shut down by gym_obs.

Resource: ``service.name`` is ``gym/<server_name>`` (the explicit server name beats ``OTEL_SERVICE_NAME``,
which is used only when ``server_name`` is empty, because dashboards select services by this name),
``service.instance.id`` is a fresh UUID per process, plus ``gym.server.name``, ``gym.server.type``,
``gym.run.id`` (config, else ``GYM_OBS_RUN_ID``, else the batch scheduler's job id -- ``SLURM_JOB_ID``,
``PBS_JOBID``, ``LSB_JOBID``, ``JOB_ID`` --, else generated and exported to ``GYM_OBS_RUN_ID`` so child
processes share it), ``service.version`` (gym_obs's version, else ``OTEL_SERVICE_VERSION`` or
``service.version`` in ``OTEL_RESOURCE_ATTRIBUTES``) and ``OTEL_RESOURCE_ATTRIBUTES``;
``TelemetryConfig.resource_attributes`` wins over all. Metrics are exported every 10 s unless
``OTEL_METRIC_EXPORT_INTERVAL`` or the config says otherwise (the SDK's 60 s leaves gaps in every rate).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import (
    PROCESS_PID,
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.version import __version__ as sdk_version

from gym_obs._version import __version__
from gym_obs.telemetry import _override, names
from gym_obs.telemetry._exemplars import exemplar_filter
from gym_obs.telemetry._exporters import (
    LOGGER,
    build_metric_exporters,
    build_span_exporters,
    quiet_sdk_loggers,
)
from gym_obs.telemetry._fanout import fan_in
from gym_obs.telemetry._sdk_env import SDK_ENV_PROBLEMS
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.log_export import start_log_export
from gym_obs.telemetry.metrics import instruments_for
from gym_obs.telemetry.redaction import scrub_text
from gym_obs.telemetry.settings import Settings, TelemetryConfig, resolve_run_id, resolve_settings
from gym_obs.telemetry.span_batches import CompactBatchSpanProcessor

__all__ = ["TelemetryHandle", "launch_run_id", "sampler_for", "setup_telemetry", "shutdown_telemetry"]

_ATEXIT_TIMEOUT_S: Final = 3.0


class TelemetryHandle:
    """What ``setup_telemetry`` set up, and the bounded way to flush and stop it."""

    def __init__(
        self,
        *,
        enabled: bool,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        resource: Resource | None = None,
        problems: tuple[str, ...] = (),
        owns_tracer_provider: bool = False,
        owns_meter_provider: bool = False,
        stoppers: tuple[Callable[[], None], ...] = (),
    ) -> None:
        self.enabled = enabled
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.resource = resource
        self.problems = problems
        self._owns_tracer_provider = owns_tracer_provider
        self._owns_meter_provider = owns_meter_provider
        self._stoppers = stoppers
        self._lock = threading.Lock()
        self._shut_down = False

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export everything buffered, waiting at most ``timeout_s``. True when every flush succeeded."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        failures = self._flush(deadline)
        if failures:
            LOGGER.warning("telemetry flush incomplete: %s", "; ".join(failures))
        return not failures

    def _flush(self, deadline: float) -> list[str]:
        failures: list[str] = []
        tp, mp = self.tracer_provider, self.meter_provider
        if tp is not None:
            _bounded("span flush", lambda: tp.force_flush(_ms_until(deadline)), deadline, failures)
        if mp is not None:
            _bounded("metric flush", lambda: mp.force_flush(_ms_until(deadline)), deadline, failures)
        return failures

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Flush and stop what this handle owns (providers it reused are only flushed); telemetry is off
        afterwards. Flushing gets up to 70% of ``timeout_s``, stopping the rest; each stop step gets at
        least ``0.25`` s so sockets are released even after a slow flush. Idempotent; True when clean."""
        with self._lock:
            if self._shut_down:
                return True
            self._shut_down = True
        global _handle
        with _LOCK:
            if _handle is self:
                _handle = None
                if not _override.capture_active():
                    _disable_state()
        start = time.monotonic()
        budget = max(timeout_s, 0.0)
        failures = self._flush(start + 0.7 * budget)
        tp, mp = self.tracer_provider, self.meter_provider
        end = start + budget
        if tp is not None and self._owns_tracer_provider:
            _bounded("span shutdown", tp.shutdown, _at_least(end), failures)
        if mp is not None and self._owns_meter_provider:
            deadline = _at_least(end)
            _bounded("metric shutdown", lambda: mp.shutdown(_ms_until(deadline)), deadline, failures)
        for stop in self._stoppers:
            _bounded("endpoint stop", stop, _at_least(end), failures)
        if failures:
            LOGGER.warning("telemetry shutdown incomplete: %s", "; ".join(failures))
        return not failures


_MIN_STEP_S: Final = 0.25


def _at_least(deadline: float) -> float:
    return max(deadline, time.monotonic() + _MIN_STEP_S)


def _ms_until(deadline: float) -> int:
    return int(max(deadline - time.monotonic(), 0.0) * 1000)


def _first_line(exc: BaseException) -> str:
    return (scrub_text(str(exc)).splitlines() or [repr(exc)])[0][:200]


def _bounded(step: str, fn: Callable[[], Any], deadline: float, failures: list[str]) -> None:
    """Run ``fn`` in a daemon thread until ``deadline``: a hung exporter cannot hang the caller.

    A step that raises, returns False or runs out of time is appended to ``failures``.
    """
    outcome: list[str] = []

    def run() -> None:
        try:
            outcome.append("" if fn() is not False else f"{step} failed")
        except Exception as exc:
            outcome.append(f"{step} failed ({_first_line(exc)})")

    worker = threading.Thread(target=run, name="gym-obs-telemetry-stop", daemon=True)
    worker.start()
    worker.join(max(deadline - time.monotonic(), 0.0))
    if worker.is_alive():
        failures.append(f"{step} did not finish in time")
    elif outcome and outcome[0]:
        failures.append(outcome[0])


_LOCK: Final = threading.RLock()
_handle: TelemetryHandle | None = None
_own_provider_ids: set[int] = set()
_atexit_registered = False


def setup_telemetry(
    server_name: str, server_type: str | None = None, *, config: TelemetryConfig | None = None
) -> TelemetryHandle:
    """Set up process telemetry once and return its handle; later calls return the same handle."""
    global _handle
    try:
        with _LOCK:
            if _override.capture_active():
                return _capture_handle()
            if _handle is not None:
                if server_name and server_name != STATE.server_name:
                    LOGGER.debug(
                        "telemetry already set up for %r; ignoring %r", STATE.server_name, server_name
                    )
                return _handle
            if isinstance(config, Mapping):  # a plain dict (from YAML) is accepted and validated
                config = TelemetryConfig.model_validate(dict(config))
            handle = _setup(server_name, server_type, config or TelemetryConfig())
            if handle.enabled:  # a disabled set-up installs nothing, so a later call may still turn it on
                _handle = handle
            return handle
    except Exception as exc:
        LOGGER.error("telemetry set-up failed (%r); telemetry is off, the program continues", exc)
        _disable_state()
        return TelemetryHandle(enabled=False, problems=(repr(exc),))


def launch_run_id(configured: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The run id a launcher decides once and gives every process it starts (``GYM_OBS_RUN_ID``): the
    configured one, else ``GYM_OBS_RUN_ID``, else the batch scheduler's job id, else a new one."""
    return resolve_run_id(configured, os.environ if env is None else env)


def shutdown_telemetry(timeout_s: float = 5.0) -> bool:
    """Shut down the process telemetry set up by :func:`setup_telemetry` (no-op when there is none)."""
    with _LOCK:
        handle = _handle
    return handle.shutdown(timeout_s) if handle is not None else True


def _capture_handle() -> TelemetryHandle:
    """A test capture owns telemetry: describe its providers, change nothing."""
    tp = trace.get_tracer_provider()
    mp = otel_metrics.get_meter_provider()
    return TelemetryHandle(
        enabled=True,
        tracer_provider=tp if isinstance(tp, TracerProvider) else None,
        meter_provider=mp if isinstance(mp, MeterProvider) else None,
    )


def _disable_state() -> None:
    STATE.enabled = False
    STATE.traces_enabled = False
    STATE.tracer = None
    STATE.instruments = None


def _setup(server_name: str, server_type: str | None, config: TelemetryConfig) -> TelemetryHandle:
    settings = resolve_settings(config, os.environ)
    problems = [*_sdk_env_problems_once(), *settings.problems]
    STATE.server_name = server_name
    STATE.propagation_targets = settings.propagation_targets
    os.environ.setdefault(names.ENV_RUN_ID, settings.run_id)
    if not settings.enabled:
        _report(problems)
        _disable_state()
        return TelemetryHandle(enabled=False, problems=tuple(problems))

    quiet_sdk_loggers()
    resource = _resource(server_name, server_type, settings, config)
    timeout_s = settings.export_timeout_ms / 1000
    stoppers: list[Callable[[], None]] = []

    try:
        tp, owns_tp = _tracer_provider(settings, resource, timeout_s, problems)
    except Exception as exc:  # one signal failing must not take the other down
        problems.append(f"cannot set up tracing ({_first_line(exc)}); traces are off")
        tp, owns_tp = None, False
    try:
        mp, owns_mp = _meter_provider(
            settings, resource, timeout_s, problems, stoppers, tracing=tp is not None
        )
    except Exception as exc:
        problems.append(f"cannot set up metrics ({_first_line(exc)}); metrics are off")
        mp, owns_mp = None, False
        for stop in stoppers:  # e.g. a Prometheus endpoint started before the failure
            _bounded("endpoint stop", stop, time.monotonic() + 2.0, [])
        stoppers.clear()
    stop_logs = start_log_export(settings, resource, timeout_s, problems) if tp or mp else None
    if stop_logs is not None:
        stoppers.append(stop_logs)
    _report(problems)
    if tp is None and mp is None:
        LOGGER.warning("telemetry was enabled but no exporter is usable; telemetry is off")
        _disable_state()
        return TelemetryHandle(enabled=False, resource=resource, problems=tuple(problems))

    scope_version = sdk_version
    STATE.tracer = tp.get_tracer(names.INSTRUMENTATION_SCOPE, scope_version) if tp else trace.NoOpTracer()
    STATE.traces_enabled = tp is not None
    meter = mp.get_meter(names.INSTRUMENTATION_SCOPE) if mp else NoOpMeter(names.INSTRUMENTATION_SCOPE)
    STATE.instruments = instruments_for(meter)
    STATE.groups = settings.span_groups
    STATE.enabled = True
    missing = settings.span_groups.missing_spine()
    if missing and tp is not None:
        LOGGER.warning(
            "span group(s) %s off: traces will break apart at every hop between processes",
            ", ".join(missing),
        )
    handle = TelemetryHandle(
        enabled=True,
        tracer_provider=tp,
        meter_provider=mp,
        resource=resource,
        problems=tuple(problems),
        owns_tracer_provider=owns_tp,
        owns_meter_provider=owns_mp,
        stoppers=tuple(stoppers),
    )
    _register_atexit()
    LOGGER.info(
        "telemetry on for %s: traces -> %s; metrics -> %s; logs -> %s; span groups %s",
        resource.attributes.get(names.SERVICE_NAME),
        ", ".join(settings.traces_exporters) or "off",
        ", ".join(settings.metrics_exporters) or "off",
        ", ".join(settings.logs_exporters) or "stderr only",
        ",".join(sorted(settings.span_groups.enabled)) or "none",
    )
    return handle


_sdk_env_reported = False


def _sdk_env_problems_once() -> list[str]:
    """The environment repairs made at import, the first time telemetry is set up (they happen once)."""
    global _sdk_env_reported
    if _sdk_env_reported:
        return []
    _sdk_env_reported = True
    return list(SDK_ENV_PROBLEMS)


def _report(problems: list[str]) -> None:
    for problem in problems:
        LOGGER.warning("telemetry configuration: %s", problem)


def _resource(
    server_name: str, server_type: str | None, settings: Settings, config: TelemetryConfig
) -> Resource:
    service = names.SERVICE_NAME_PREFIX + server_name if server_name else None
    service = service or os.environ.get("OTEL_SERVICE_NAME") or names.SERVICE_NAME_PREFIX + "unknown"
    attributes: dict[str, Any] = {
        TELEMETRY_SDK_LANGUAGE: "python",
        TELEMETRY_SDK_NAME: "opentelemetry",
        TELEMETRY_SDK_VERSION: sdk_version,
        PROCESS_PID: os.getpid(),
    }
    attributes[names.SERVICE_VERSION] = __version__
    attributes.update(settings.resource_attributes)
    version = os.environ.get(names.ENV_SERVICE_VERSION, "").strip()
    if version:
        attributes[names.SERVICE_VERSION] = version
    attributes[names.SERVICE_NAME] = service
    attributes[names.SERVICE_INSTANCE_ID] = str(uuid.uuid4())
    attributes[names.ATTR_SERVER_NAME] = server_name
    if server_type:
        attributes[names.ATTR_SERVER_TYPE] = server_type
    attributes[names.ATTR_RUN_ID] = settings.run_id
    attributes.update(config.resource_attributes)
    return Resource({key: _encodable(value) for key, value in attributes.items()})


def _encodable(value: Any) -> Any:
    """Strings that cannot be UTF-8 encoded (lone surrogates from a garbage environment) would make every
    export fail; their bad characters are replaced."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
    return value


def sampler_for(settings: Settings) -> Sampler:
    """The SDK sampler the resolved settings name (``OTEL_TRACES_SAMPLER`` and its argument)."""
    ratio = TraceIdRatioBased(settings.sampler_ratio)
    samplers: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": ratio,
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(ratio),
    }
    return samplers[settings.sampler]


def _reusable(provider: object) -> bool:
    """An application's SDK provider is reused; ours (shut down) and a test capture's are not."""
    return id(provider) not in _own_provider_ids and id(provider) not in _override.TEST_PROVIDER_IDS


def _tracer_provider(
    settings: Settings, resource: Resource, timeout_s: float, problems: list[str]
) -> tuple[TracerProvider | None, bool]:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider) and _reusable(current):
        LOGGER.info("reusing the application's tracer provider")
        return current, False
    if not settings.traces_exporters:
        return None, False
    exporters = build_span_exporters(
        settings.traces_exporters,
        settings.otlp_traces,
        timeout_s,
        problems,
        file_dir=settings.file_export_dir,
        service_label=str(resource.attributes.get(names.SERVICE_NAME, "gym")),
    )
    if not exporters:
        return None, False
    tp = TracerProvider(resource=resource, sampler=sampler_for(settings), shutdown_on_exit=False)
    for _, exporter in exporters:
        tp.add_span_processor(
            CompactBatchSpanProcessor(
                exporter,
                schedule_delay_millis=settings.span_schedule_delay_ms,
                max_queue_size=settings.span_queue_size,
                max_export_batch_size=settings.span_batch_size,
                export_timeout_millis=settings.export_timeout_ms,
            )
        )
    _own_provider_ids.add(id(tp))
    if isinstance(current, trace.ProxyTracerProvider):
        trace.set_tracer_provider(tp)
    return tp, True


def _meter_provider(
    settings: Settings,
    resource: Resource,
    timeout_s: float,
    problems: list[str],
    stoppers: list[Callable[[], None]],
    *,
    tracing: bool = True,
) -> tuple[MeterProvider | None, bool]:
    """One periodic reader for all push exporters (``fan_in``: every point is aggregated once), plus the
    Prometheus pull reader when chosen."""
    current = otel_metrics.get_meter_provider()
    if isinstance(current, MeterProvider) and _reusable(current):
        LOGGER.info("reusing the application's meter provider")
        return current, False
    built = build_metric_exporters(
        settings.metrics_exporters,
        settings.otlp_metrics,
        timeout_s,
        problems,
        file_dir=settings.file_export_dir,
        service_label=str(resource.attributes.get(names.SERVICE_NAME, "gym")),
    )
    readers: list[MetricReader] = [
        PeriodicExportingMetricReader(
            exporter,
            export_interval_millis=settings.metric_export_interval_ms,
            export_timeout_millis=settings.export_timeout_ms,
        )
        for exporter in fan_in([exporter for _, exporter in built])
    ]
    if "prometheus" in settings.metrics_exporters:
        reader = _prometheus_reader(settings, problems, stoppers)
        if reader is not None:
            readers.append(reader)
    if not readers:
        return None, False
    mp = MeterProvider(
        metric_readers=readers,
        resource=resource,
        shutdown_on_exit=False,
        exemplar_filter=exemplar_filter(tracing, os.environ),
    )
    _own_provider_ids.add(id(mp))
    if type(current).__name__ == "_ProxyMeterProvider":
        otel_metrics.set_meter_provider(mp)
    return mp, True


def _prometheus_reader(
    settings: Settings, problems: list[str], stoppers: list[Callable[[], None]]
) -> MetricReader | None:
    """A Prometheus pull reader plus its HTTP endpoint; ``target_info`` carries the resource."""
    host, port = settings.prometheus_host, settings.prometheus_port
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        reader = PrometheusMetricReader()
    except Exception as exc:
        problems.append(f"cannot create the Prometheus reader ({exc!r}); Prometheus metrics are off")
        return None
    try:
        server, thread = start_http_server(port, addr=host)
    except Exception as exc:
        reader.shutdown()
        problems.append(
            f"cannot serve Prometheus metrics on {host}:{port} ({exc}); Prometheus metrics are off"
        )
        return None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2.0)

    stoppers.append(stop)
    LOGGER.info("Prometheus metrics on http://%s:%d/metrics", host, server.server_port)
    return reader


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(shutdown_telemetry, _ATEXIT_TIMEOUT_S)
