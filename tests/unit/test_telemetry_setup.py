"""Settings resolution (in-process, pure) and setup_telemetry itself (in subprocesses: global state)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gym_obs
from gym_obs.config import TelemetryConfig
from gym_obs.telemetry.settings import resolve_settings

_SRC = str(Path(gym_obs.__file__).resolve().parents[1])


def run_python(
    code: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with a clean telemetry environment plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    clean["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, clean.get("PYTHONPATH")) if p)
    clean.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- settings resolution ---------------------------------------------------------------------------------


def test_defaults_are_off() -> None:
    settings = resolve_settings(TelemetryConfig(), {})
    assert settings.enabled is False
    assert settings.problems == ()


def test_defaults_when_enabled() -> None:
    settings = resolve_settings(TelemetryConfig(enabled=True), {})
    assert settings.traces_exporters == ("otlp",)
    assert settings.metrics_exporters == ("otlp",)
    assert settings.otlp_traces is not None
    assert settings.otlp_traces.endpoint == "http://localhost:4318/v1/traces"
    assert settings.otlp_traces.protocol == "http/protobuf"
    assert settings.sampler == "parentbased_always_on"
    assert settings.metric_export_interval_ms == 10_000  # gym processes: 10 s, not the SDK's 60 s
    assert (settings.prometheus_host, settings.prometheus_port) == ("localhost", 9464)
    assert settings.problems == ()


def test_environment_is_honoured() -> None:
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "otlp,console",
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "9999",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,team=rl%20infra",
        "GYM_OBS_RUN_ID": "run-7",
        "GYM_OBS_TRACE_PROPAGATION_TARGETS": "api.example.com,localhost:8000",
    }
    s = resolve_settings(TelemetryConfig(), env)
    assert s.enabled
    assert s.traces_exporters == ("otlp", "console")
    assert s.metrics_exporters == ("prometheus",)
    assert s.otlp_traces is not None and s.otlp_traces.endpoint == "http://collector:4317"
    assert s.otlp_traces.protocol == "grpc"
    assert (s.sampler, s.sampler_ratio) == ("parentbased_traceidratio", 0.25)
    assert s.metric_export_interval_ms == 1000
    assert (s.prometheus_host, s.prometheus_port) == ("0.0.0.0", 9999)
    assert s.resource_attributes == {"deployment.environment": "test", "team": "rl infra"}
    assert s.run_id == "run-7"
    assert s.propagation_targets == {"api.example.com", "localhost:8000"}
    assert s.problems == ()


def test_signal_specific_endpoint_is_used_as_is() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://x:1/custom",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://y:2",
    }
    s = resolve_settings(TelemetryConfig(enabled=True), env)
    assert s.otlp_traces is not None and s.otlp_traces.endpoint == "https://x:1/custom"
    assert s.otlp_metrics is not None and s.otlp_metrics.endpoint == "http://y:2/v1/metrics"


def test_explicit_config_beats_the_environment() -> None:
    config = TelemetryConfig(
        enabled=False,
        traces_exporter="console",
        otlp_endpoint="http://explicit:4318",
        sampler="always_off",
        run_id="cfg-run",
        trace_propagation_targets=["cfg.host"],
    )
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "otlp",
        "GYM_OBS_RUN_ID": "env-run",
        "GYM_OBS_TRACE_PROPAGATION_TARGETS": "env.host",
    }
    off = resolve_settings(config, env)
    assert off.enabled is False
    assert off.run_id == "cfg-run"
    assert off.propagation_targets == {"cfg.host"}
    on = resolve_settings(config.model_copy(update={"enabled": True, "metrics_exporter": "otlp"}), env)
    assert on.traces_exporters == ("console",)
    assert on.sampler == "always_off"
    assert on.otlp_metrics is not None and on.otlp_metrics.endpoint == "http://explicit:4318/v1/metrics"


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "unknown exporter 'zipkin'"),
        ({"OTEL_METRICS_EXPORTER": "statsd,otlp"}, "unknown exporter 'statsd'"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "not a url"}, "is not an http(s) URL"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://host:port"}, "is not an http(s) URL"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "not a supported OTLP protocol"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "not a known sampler"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "not a ratio"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "-1"}, "not a positive integer"),
        ({"OTEL_EXPORTER_PROMETHEUS_PORT": "99999"}, "not a TCP port"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "novalue,ok=1"}, "not key=value"),
    ],
)
def test_garbage_values_become_problems_not_errors(env: dict[str, str], fragment: str) -> None:
    settings = resolve_settings(TelemetryConfig(), {"GYM_OBS_TELEMETRY": "1", **env})
    assert settings.enabled
    assert any(fragment in p for p in settings.problems), settings.problems


def test_a_bad_endpoint_switches_only_otlp_off() -> None:
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "otlp,console",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://x",
    }
    settings = resolve_settings(TelemetryConfig(), env)
    assert settings.traces_exporters == ("console",)
    assert settings.otlp_traces is None


def test_endpoint_credentials_are_not_echoed_in_problems() -> None:
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:hunter2@host:notaport/?k=SECRET",
    }
    settings = resolve_settings(TelemetryConfig(), env)
    assert settings.problems
    assert not any("hunter2" in p or "SECRET" in p for p in settings.problems)


def test_garbage_switch_keeps_telemetry_off_and_says_so() -> None:
    settings = resolve_settings(TelemetryConfig(), {"GYM_OBS_TELEMETRY": "maybe"})
    assert settings.enabled is False
    assert settings.problems == (
        "GYM_OBS_TELEMETRY='maybe' is not a boolean (use 1 or 0); telemetry stays off",
    )


# --- setup_telemetry (subprocesses) ----------------------------------------------------------------------

_SETUP_AND_REPORT = """
    from gym_obs.telemetry.setup import setup_telemetry
    from gym_obs.telemetry.testing import telemetry_state
    STATE = telemetry_state()
    from gym_obs.telemetry.spans import client_span
    handle = setup_telemetry("model", "model_server")
    with client_span("GET"):
        pass
    print("ENABLED", handle.enabled, STATE.enabled, STATE.traces_enabled)
    print("SHUTDOWN", handle.shutdown(timeout_s=2.0), STATE.enabled)
    print("ALIVE")
"""


def test_disabled_by_default() -> None:
    result = run_python(_SETUP_AND_REPORT)
    assert result.returncode == 0, result.stderr
    assert "ENABLED False False False" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GYM_OBS_TELEMETRY": "definitely"}, "GYM_OBS_TELEMETRY='definitely' is not a boolean"),
        ({"OTEL_TRACES_EXPORTER": "jaeger", "OTEL_METRICS_EXPORTER": "none"}, "unknown exporter 'jaeger'"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "::garbage::", "OTEL_METRICS_EXPORTER": "none"},
            "'::garbage::' is not an http(s) URL",
        ),
        (
            {
                "OTEL_TRACES_SAMPLER": "sometimes; rm -rf /",
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_METRICS_EXPORTER": "none",
            },
            "is not a known sampler",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:20001",
            },
            "'carrier-pigeon' is not a supported OTLP protocol",
        ),
        (
            {
                "OTEL_METRICS_EXPORTER": "prometheus",
                "OTEL_EXPORTER_PROMETHEUS_PORT": "http",
                "OTEL_TRACES_EXPORTER": "none",
            },
            "OTEL_EXPORTER_PROMETHEUS_PORT='http' is not a TCP port",
        ),
    ],
)
def test_garbage_environment_keeps_the_process_alive_and_says_what_was_wrong(
    env: dict[str, str], message: str
) -> None:
    result = run_python(_SETUP_AND_REPORT, {"GYM_OBS_TELEMETRY": "1", **env})
    assert result.returncode == 0, result.stderr
    assert "ALIVE" in result.stdout
    assert message in result.stderr
    assert result.stderr.count(message) == 1
    assert "Traceback" not in result.stderr


def test_unreachable_collector_does_not_block_requests_and_shutdown_is_bounded() -> None:
    code = """
        import time
        from gym_obs.telemetry.setup import setup_telemetry
        from gym_obs.telemetry.spans import client_span
        from gym_obs.telemetry.testing import telemetry_state
        STATE = telemetry_state()
        handle = setup_telemetry("agent")
        started = time.perf_counter()
        for _ in range(2000):
            with client_span("GET"):
                STATE.instruments.client_retries.add(1)
        print("PER_SPAN_US", (time.perf_counter() - started) / 2000 * 1e6)
        started = time.perf_counter()
        print("SHUTDOWN", handle.shutdown(timeout_s=1.5))
        print("SHUTDOWN_S", time.perf_counter() - started)
    """
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:20002",  # nothing listens here
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert float(lines["PER_SPAN_US"]) < 1000
    assert float(lines["SHUTDOWN_S"]) < 1.5 + 1.0
    # Failures are reported, but not once per batch.
    assert result.stderr.count("Transient error") <= 2
    assert "Traceback" not in result.stderr


def test_setup_is_idempotent_and_sets_the_resource() -> None:
    code = """
        import os
        from opentelemetry import trace
        from gym_obs.telemetry.setup import setup_telemetry
        first = setup_telemetry("resources", "resources_server")
        second = setup_telemetry("other")
        assert first is second
        assert trace.get_tracer_provider() is first.tracer_provider
        attrs = dict(first.resource.attributes)
        print("SERVICE", attrs["service.name"])
        print("TYPE", attrs["gym.server.type"])
        print("NAME", attrs["gym.server.name"])
        print("RUN", attrs["gym.run.id"], os.environ["GYM_OBS_RUN_ID"])
        print("INSTANCE", attrs["service.instance.id"])
        print("EXTRA", attrs["deployment.environment"])
        first.shutdown(1.0)
    """
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "ignored",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,service.name=also-ignored",
    }
    one, two = run_python(code, env), run_python(code, env)
    for result in (one, two):
        assert result.returncode == 0, result.stderr
        assert "SERVICE gym/resources" in result.stdout
        assert "TYPE resources_server" in result.stdout
        assert "NAME resources" in result.stdout
        assert "EXTRA ci" in result.stdout
        run_line = next(line for line in result.stdout.splitlines() if line.startswith("RUN"))
        _, attr_run, env_run = run_line.split()
        assert attr_run == env_run
    instance = [next(x for x in r.stdout.splitlines() if x.startswith("INSTANCE")) for r in (one, two)]
    assert instance[0] != instance[1]


def test_application_providers_are_reused_and_never_shut_down() -> None:
    code = """
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from gym_obs.telemetry.setup import setup_telemetry
        from gym_obs.telemetry.spans import client_span
        from gym_obs.telemetry.testing import telemetry_state
        STATE = telemetry_state()
        exporter = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tp)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        handle = setup_telemetry("app")
        assert handle.tracer_provider is tp
        with client_span("GET"):
            STATE.instruments.rollouts.add(1)
        handle.shutdown(1.0)
        with tp.get_tracer("after").start_as_current_span("after-shutdown"):
            pass
        print("SPANS", sorted(s.name for s in exporter.get_finished_spans()))
        data = reader.get_metrics_data()
        scopes = [sm for rm in data.resource_metrics for sm in rm.scope_metrics]
        print("METRICS", [m.name for sm in scopes for m in sm.metrics])
    """
    result = run_python(code, {"GYM_OBS_TELEMETRY": "1"})
    assert result.returncode == 0, result.stderr
    assert "SPANS ['GET', 'after-shutdown']" in result.stdout
    assert "gym.rollouts" in result.stdout


def test_prometheus_endpoint_serves_metrics_with_target_info() -> None:
    code = """
        import urllib.request
        from gym_obs.telemetry.setup import setup_telemetry
        from gym_obs.telemetry.testing import telemetry_state
        STATE = telemetry_state()
        handle = setup_telemetry("model", "model_server")
        STATE.instruments.client_retries.add(2, {"gym.retry.reason": "timeout"})
        body = urllib.request.urlopen("http://127.0.0.1:20010/metrics", timeout=5).read().decode()
        print(body)
        handle.shutdown(2.0)
    """
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "20010",
    }
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    assert 'gym_client_retries_total{gym_retry_reason="timeout"' in result.stdout
    target_info = next(line for line in result.stdout.splitlines() if line.startswith("target_info{"))
    assert 'service_name="gym/model"' in target_info
    assert 'gym_server_type="model_server"' in target_info


def test_prometheus_port_in_use_degrades_with_one_clear_line() -> None:
    code = """
        import socket
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", 20011))
        blocker.listen()
        from gym_obs.telemetry.setup import setup_telemetry
        handle = setup_telemetry("model")
        print("ENABLED", handle.enabled)
    """
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "20011",
    }
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    assert "cannot serve Prometheus metrics on 127.0.0.1:20011" in result.stderr
    assert "ENABLED False" in result.stdout


def test_console_exporter_writes_spans_at_shutdown() -> None:
    code = """
        from gym_obs.telemetry.setup import setup_telemetry, shutdown_telemetry
        from gym_obs.telemetry.spans import client_span
        setup_telemetry("console-test")
        with client_span("GET", **{"url.full": "http://u:p@h/x?secret=1"}):
            pass
        print("SHUTDOWN", shutdown_telemetry(3.0))
    """
    env = {"GYM_OBS_TELEMETRY": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    assert '"name": "GET"' in result.stdout
    assert "http://REDACTED:REDACTED@h/x" in result.stdout
    assert "secret=1" not in result.stdout
    assert "SHUTDOWN True" in result.stdout


def test_setup_inside_a_test_capture_leaves_the_capture_in_charge() -> None:
    code = """
        from gym_obs.telemetry.setup import setup_telemetry
        from gym_obs.telemetry.testing import capture_telemetry
        from gym_obs.telemetry.spans import client_span
        with capture_telemetry() as capture:
            handle = setup_telemetry("server-in-test")  # telemetry "off" by env, but the test owns it
            with client_span("GET"):
                pass
            print("SPANS", [s.name for s in capture.spans()], handle.enabled)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "SPANS ['GET'] True" in result.stdout


def test_a_disabled_setup_can_be_followed_by_an_enabled_one() -> None:
    code = """
        from gym_obs.config import TelemetryConfig
        from gym_obs.telemetry.setup import setup_telemetry
        off = setup_telemetry("late")
        on = setup_telemetry("late", config=TelemetryConfig(enabled=True, traces_exporter="console",
                                                            metrics_exporter="none"))
        print("STATES", off.enabled, on.enabled, setup_telemetry("late") is on)
        on.shutdown(1.0)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "STATES False True True" in result.stdout


def test_setup_after_a_capture_exports_through_its_own_provider() -> None:
    code = """
        from gym_obs.telemetry.setup import setup_telemetry
        from gym_obs.telemetry.spans import client_span
        from gym_obs.telemetry.testing import capture_telemetry
        with capture_telemetry() as capture:
            pass
        handle = setup_telemetry("after-capture")
        with client_span("AFTER"):
            pass
        print("OWN", handle.tracer_provider is not capture.tracer_provider, capture.spans() == [])
        handle.shutdown(2.0)
    """
    env = {"GYM_OBS_TELEMETRY": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    assert "OWN True True" in result.stdout
    assert '"name": "AFTER"' in result.stdout


# --- audit additions: samplers, precedence, concurrency, black holes, a garbage environment ---------------


def _sampler_description(env: dict[str, str], config: TelemetryConfig | None = None) -> str:
    from gym_obs.telemetry.setup import sampler_for

    settings = resolve_settings(config or TelemetryConfig(), {"GYM_OBS_TELEMETRY": "1", **env})
    return sampler_for(settings).get_description()


@pytest.mark.parametrize(
    ("env", "description"),
    [
        ({}, "ParentBased{root:AlwaysOnSampler"),
        ({"OTEL_TRACES_SAMPLER": "always_on"}, "AlwaysOnSampler"),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, "AlwaysOffSampler"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
            "TraceIdRatioBased{0.25}",
        ),
        ({"OTEL_TRACES_SAMPLER": "traceidratio"}, "TraceIdRatioBased{1.0}"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, "ParentBased{root:AlwaysOnSampler"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, "ParentBased{root:AlwaysOffSampler"),
        (
            {"OTEL_TRACES_SAMPLER": "PARENTBASED_TRACEIDRATIO", "OTEL_TRACES_SAMPLER_ARG": "0"},
            "ParentBased{root:TraceIdRatioBased{0.0}",
        ),
        ({"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "junk"}, "AlwaysOnSampler"),
    ],
)
def test_sampler_from_the_environment(env: dict[str, str], description: str) -> None:
    assert _sampler_description(env).startswith(description)


@pytest.mark.parametrize("arg", ["junk", "-0.1", "1.5", "nan", "inf", "", "0.5.5", "\udcff"])
def test_bad_sampler_arg_samples_everything_and_says_so(arg: str) -> None:
    env = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": arg}
    settings = resolve_settings(TelemetryConfig(), {"GYM_OBS_TELEMETRY": "1", **env})
    assert settings.sampler == "traceidratio" and settings.sampler_ratio == 1.0
    if arg:
        assert any("OTEL_TRACES_SAMPLER_ARG" in p and "not a ratio" in p for p in settings.problems)


def test_config_sampler_beats_the_environment() -> None:
    env = {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "0.9"}
    config = TelemetryConfig(sampler="parentbased_traceidratio", sampler_arg="0.1")
    assert _sampler_description(env, config).startswith("ParentBased{root:TraceIdRatioBased{0.1}")


@pytest.mark.parametrize(
    ("field", "value", "env_name", "env_value", "attribute", "expected"),
    [
        ("otlp_protocol", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "otlp_traces", "grpc"),
        ("metric_export_interval_ms", 1234, "OTEL_METRIC_EXPORT_INTERVAL", "999", "", 1234),
        ("prometheus_host", "10.0.0.1", "OTEL_EXPORTER_PROMETHEUS_HOST", "0.0.0.0", "", "10.0.0.1"),
        ("prometheus_port", 0, "OTEL_EXPORTER_PROMETHEUS_PORT", "9999", "", 0),
        ("metrics_exporter", "console", "OTEL_METRICS_EXPORTER", "prometheus", "", ("console",)),
        ("traces_exporter", "none", "OTEL_TRACES_EXPORTER", "console", "", ()),
        ("enabled", False, "GYM_OBS_TELEMETRY", "1", "", False),
        ("enabled", True, "OTEL_SDK_DISABLED", "true", "", True),
    ],
)
def test_each_explicit_setting_beats_its_environment_variable(
    field: str, value: object, env_name: str, env_value: str, attribute: str, expected: object
) -> None:
    env = {"GYM_OBS_TELEMETRY": "1", env_name: env_value}
    settings = resolve_settings(TelemetryConfig(**{field: value}), env)  # type: ignore[arg-type]
    actual = {
        "otlp_protocol": lambda: settings.otlp_traces.protocol if settings.otlp_traces else None,
        "metric_export_interval_ms": lambda: settings.metric_export_interval_ms,
        "prometheus_host": lambda: settings.prometheus_host,
        "prometheus_port": lambda: settings.prometheus_port,
        "metrics_exporter": lambda: settings.metrics_exporters,
        "traces_exporter": lambda: settings.traces_exporters,
        "enabled": lambda: settings.enabled,
    }[field]()
    assert actual == expected


def test_environment_beats_defaults_for_the_span_schedule_delay() -> None:
    assert resolve_settings(TelemetryConfig(enabled=True), {}).span_schedule_delay_ms == 5000
    on = resolve_settings(TelemetryConfig(enabled=True), {"OTEL_BSP_SCHEDULE_DELAY": "50"})
    assert on.span_schedule_delay_ms == 50
    bad = resolve_settings(TelemetryConfig(enabled=True), {"OTEL_BSP_SCHEDULE_DELAY": "soon"})
    assert bad.span_schedule_delay_ms == 5000
    assert any("OTEL_BSP_SCHEDULE_DELAY='soon'" in p for p in bad.problems)


def test_setup_from_eight_threads_at_once_installs_one_set_of_providers() -> None:
    code = """
        import logging, threading
        logging.basicConfig(level=logging.INFO)
        from opentelemetry import metrics, trace
        from gym_obs.telemetry.setup import setup_telemetry
        barrier = threading.Barrier(8)
        handles = []
        def run(i):
            barrier.wait()
            handles.append(setup_telemetry(f"server{i}", "type"))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        first = handles[0]
        print("HANDLES", len({id(h) for h in handles}), all(h.enabled for h in handles))
        print("GLOBAL", trace.get_tracer_provider() is first.tracer_provider,
              metrics.get_meter_provider() is first.meter_provider)
        print("SHUTDOWN", first.shutdown(2.0))
    """
    env = {"GYM_OBS_TELEMETRY": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"}
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    assert "HANDLES 1 True" in result.stdout
    assert "GLOBAL True True" in result.stdout
    assert result.stderr.count("telemetry on for") == 1


@pytest.mark.parametrize(("protocol", "port"), [("http/protobuf", 20050), ("grpc", 20051)])
def test_shutdown_is_bounded_against_a_black_holed_collector(protocol: str, port: int) -> None:
    code = f"""
        import socket, time
        hole = socket.socket()
        hole.bind(("127.0.0.1", {port}))
        hole.listen(64)  # accepts connections (kernel backlog) and never answers
        from gym_obs.telemetry.setup import setup_telemetry
        from gym_obs.telemetry.spans import client_span
        from gym_obs.telemetry.testing import telemetry_state
        STATE = telemetry_state()
        handle = setup_telemetry("blackhole")
        started = time.perf_counter()
        for _ in range(500):
            with client_span("GET"):
                STATE.instruments.client_retries.add(1)
        print("PER_SPAN_US", (time.perf_counter() - started) / 500 * 1e6)
        time.sleep(0.3)  # let the exporters get stuck on the black hole
        started = time.perf_counter()
        print("SHUTDOWN", handle.shutdown(timeout_s=1.0))
        print("SHUTDOWN_S", time.perf_counter() - started)
        print("ENABLED_AFTER", STATE.enabled)
    """
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
        "OTEL_BSP_SCHEDULE_DELAY": "20",
    }
    started = time.perf_counter()
    result = run_python(code, env)
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert float(lines["PER_SPAN_US"]) < 1000
    assert lines["SHUTDOWN"] == "False"  # nothing was delivered, and the handle says so
    assert float(lines["SHUTDOWN_S"]) < 1.0 + 1.0
    assert lines["ENABLED_AFTER"] == "False"
    assert elapsed < 30  # the interpreter exits too: no exporter thread keeps it alive
    assert "did not finish in time" in result.stderr


_OTEL_GARBAGE_VARS = [
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_EXPORTER_PROMETHEUS_HOST",
    "OTEL_EXPORTER_PROMETHEUS_PORT",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_SDK_DISABLED",
    "OTEL_PROPAGATORS",
    "OTEL_PYTHON_CONTEXT",
    "OTEL_PYTHON_TRACER_PROVIDER",
    "OTEL_PYTHON_METER_PROVIDER",
    "OTEL_METRICS_EXEMPLAR_FILTER",
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
    "GYM_OBS_RUN_ID",
    "GYM_OBS_TRACE_PROPAGATION_TARGETS",
]
_GARBAGE = "-1,\udcff\udcfe ;=,"  # negative, comma-split, '=', a lone surrogate (undecodable bytes)

_USE_EVERYTHING = """
    import gym_obs
    from gym_obs.telemetry.logging import configure_logging, get_logger
    from gym_obs.telemetry.propagation import inject_trace_headers
    from gym_obs.telemetry.setup import setup_telemetry
    from gym_obs.telemetry.spans import client_span
    from gym_obs.telemetry.testing import telemetry_state
    STATE = telemetry_state()
    from opentelemetry import metrics, trace
    configure_logging()
    handle = setup_telemetry("garbage")
    trace.get_tracer_provider()
    metrics.get_meter_provider()
    with client_span("GET"):
        headers = {}
        inject_trace_headers(headers)
        if STATE.instruments is not None:
            STATE.instruments.client_retries.add(1)
        get_logger("garbage").info("still running")
    print("ALIVE", handle.enabled)
    handle.shutdown(1.0)
"""


@pytest.mark.parametrize("name", _OTEL_GARBAGE_VARS)
def test_each_variable_with_garbage_keeps_the_process_alive(name: str) -> None:
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:20052",
        name: _GARBAGE,
    }
    result = run_python(_USE_EVERYTHING, env)  # surrogates reach the child as the raw bytes 0xff 0xfe
    assert result.returncode == 0, result.stderr
    assert "ALIVE" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_PROPAGATORS", "tracecontext,nosuchpropagator"),
        ("OTEL_PROPAGATORS", "tracecontext,"),
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "-1"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "lots"),
        ("OTEL_PYTHON_TRACER_PROVIDER", "nosuchprovider"),
        ("OTEL_PYTHON_METER_PROVIDER", ""),
        ("OTEL_PYTHON_CONTEXT", "nosuchcontext"),
        ("OTEL_METRICS_EXEMPLAR_FILTER", "sometimes"),
    ],
)
def test_values_the_sdk_would_raise_on_are_repaired_and_reported(name: str, value: str) -> None:
    for enabled in ("1", "0"):  # the SDK would raise at import, so this matters with telemetry off too
        result = run_python(
            _USE_EVERYTHING,
            {
                "GYM_OBS_TELEMETRY": enabled,
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_METRICS_EXPORTER": "console",
                name: value,
            },
        )
        assert result.returncode == 0, result.stderr
        assert f"ALIVE {enabled == '1'}" in result.stdout
        assert "Traceback" not in result.stderr
        assert name in result.stderr  # said what was wrong


def test_sdk_environment_repair_is_pure_on_a_given_mapping() -> None:
    from gym_obs.telemetry._sdk_env import repair_sdk_environment

    env = {
        "OTEL_PROPAGATORS": "tracecontext,b3nope,baggage",
        "OTEL_SPAN_EVENT_COUNT_LIMIT": " 12 ",
        "OTEL_SPAN_LINK_COUNT_LIMIT": "",
        "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "-3",
        "OTEL_METRICS_EXEMPLAR_FILTER": "trace_based",
    }
    problems = repair_sdk_environment(env)
    assert env == {
        "OTEL_PROPAGATORS": "tracecontext,baggage",
        "OTEL_SPAN_EVENT_COUNT_LIMIT": " 12 ",
        "OTEL_SPAN_LINK_COUNT_LIMIT": "",
        "OTEL_METRICS_EXEMPLAR_FILTER": "trace_based",
    }
    assert len(problems) == 2
    assert repair_sdk_environment({"OTEL_PROPAGATORS": "none"}) == []


def test_undecodable_run_id_does_not_break_export() -> None:
    code = """
        from gym_obs.telemetry.setup import setup_telemetry
        from gym_obs.telemetry.spans import client_span
        handle = setup_telemetry("surrogates")
        with client_span("GET"):
            pass
        print("FLUSH", handle.force_flush(3.0))
        handle.shutdown(1.0)
    """
    env = {"GYM_OBS_TELEMETRY": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    result = run_python(code, {**env, "GYM_OBS_RUN_ID": "run-\udcff\udcfe"})  # undecodable bytes
    assert result.returncode == 0, result.stderr
    assert '"name": "GET"' in result.stdout
    assert '"gym.run.id": "run-' in result.stdout
    assert "Traceback" not in result.stderr


def test_odd_arguments_never_raise() -> None:
    code = """
        from gym_obs.telemetry.setup import setup_telemetry
        bad = setup_telemetry("x", config={"enabld": True})  # a typo in a YAML mapping
        print("BAD", bad.enabled, "enabld" in bad.problems[0])
        odd = setup_telemetry(None, 5)  # wrong types from an untyped caller
        print("ODD", type(odd).__name__)
        good = setup_telemetry("x", config={"enabled": True, "traces_exporter": "console",
                                            "metrics_exporter": "none"})
        print("GOOD", good.enabled)
        good.shutdown(1.0)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "BAD False True" in result.stdout
    assert "ODD TelemetryHandle" in result.stdout
    assert "GOOD True" in result.stdout
