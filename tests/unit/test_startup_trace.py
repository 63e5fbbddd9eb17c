"""The launcher's half of the startup trace with real SDK spans (in memory): stages recorded before
telemetry is up keep their real timestamps, failures say why, off creates nothing."""

from __future__ import annotations

import time

import pytest
from opentelemetry.trace import StatusCode

from gym_obs.server import startup
from gym_obs.server.startup import StartupTrace
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture

_SECRET = "sk-live-0123456789abcdef0123456789"


def test_stages_before_telemetry_keep_their_times_and_servers_join_the_root(telemetry: Capture) -> None:
    before = time.time_ns()
    trace = StartupTrace()
    with trace.stage(names.STARTUP_STAGE_LOAD_CONFIG):
        time.sleep(0.05)
    loaded = time.time_ns()
    time.sleep(0.05)  # telemetry comes up later than the stage ended
    trace.activate()
    env = trace.server_spawning("model_0", "model")
    trace.server_spawned("model_0", 4242)
    trace.server_ready("model_0")
    trace.finish()

    (root,) = telemetry.spans(names.SPAN_STARTUP)
    (stage,) = telemetry.spans(names.SPAN_STARTUP_STAGE_PREFIX + names.STARTUP_STAGE_LOAD_CONFIG)
    (server,) = telemetry.spans(names.SPAN_STARTUP_SERVER)
    assert root.parent is None and before <= root.start_time <= stage.start_time
    assert stage.end_time is not None and stage.end_time <= loaded  # its real end, not the emission time
    assert stage.end_time - stage.start_time >= 40_000_000
    assert stage.parent is not None and stage.parent.span_id == root.context.span_id
    assert server.parent is not None and server.parent.span_id == root.context.span_id
    assert server.attributes == {
        names.ATTR_SERVER_NAME: "model_0",
        names.ATTR_SERVER_TYPE: "model",
        names.ATTR_PROCESS_PID: 4242,
    }
    ctx = server.context
    expected = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert env[names.ENV_STARTUP_TRACEPARENT] == expected
    assert int(env[names.ENV_STARTUP_SPAWNED_NS]) == server.start_time
    assert root.status.status_code is StatusCode.UNSET


def test_a_server_that_exits_or_times_out_ends_with_an_error_saying_why(telemetry: Capture) -> None:
    trace = StartupTrace()
    trace.activate()
    trace.server_spawning("dies", "resources_server")
    trace.server_spawning("slow", "model")
    trace.server_spawning("never_probed", "model")
    trace.server_exited("dies", 3, "exited with code 3", f"boom: api_key={_SECRET}\x1b[31m")
    trace.server_timed_out("slow", 2.5, None)
    trace.finish(RuntimeError("server 'dies' exited"))

    spans = {s.attributes[names.ATTR_SERVER_NAME]: s for s in telemetry.spans(names.SPAN_STARTUP_SERVER)}
    dies = spans["dies"]
    assert dies.status.status_code is StatusCode.ERROR
    assert dies.attributes[names.ATTR_ERROR_TYPE] == names.STARTUP_ERROR_EXITED
    assert dies.attributes[names.ATTR_PROCESS_EXIT_CODE] == 3
    assert "exited with code 3" in (dies.status.description or "")
    line = str(dies.attributes[names.ATTR_STARTUP_LAST_LOG_LINE])
    assert line.startswith("boom") and _SECRET not in line and "\x1b" not in line
    assert _SECRET not in (dies.status.description or "")
    slow = spans["slow"]
    assert slow.attributes[names.ATTR_ERROR_TYPE] == names.STARTUP_ERROR_TIMEOUT
    assert slow.attributes[names.ATTR_STARTUP_TIMEOUT_S] == 2.5
    assert "not ready within 2.5s" in (slow.status.description or "")
    assert spans["never_probed"].attributes[names.ATTR_ERROR_TYPE] == names.STARTUP_ERROR_LAUNCH_FAILED
    (root,) = telemetry.spans(names.SPAN_STARTUP)
    assert root.status.status_code is StatusCode.ERROR
    assert telemetry.metric_points(names.METRIC_SERVER_STARTUP_DURATION) == []  # only ready servers count


def test_telemetry_off_creates_nothing() -> None:
    trace = StartupTrace()
    with trace.stage(names.STARTUP_STAGE_LOAD_CONFIG):
        pass
    trace.activate()
    env = trace.server_spawning("a", "model")
    trace.server_ready("a")
    trace.finish()
    assert not trace.traced
    assert names.ENV_STARTUP_TRACEPARENT not in env  # no trace for the child to join
    assert trace._pending == [] and trace._root is None


def test_process_side_without_a_parent_emits_nothing(
    telemetry: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(names.ENV_STARTUP_TRACEPARENT, raising=False)
    monkeypatch.setattr(startup, "_PROCESS", startup.ProcessStartup())
    startup.emit_process_startup("x")
    assert telemetry.spans() == []


def test_process_side_joins_the_launchers_span(telemetry: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = StartupTrace()
    launcher.activate()
    env = launcher.server_spawning("agent", "agent")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(startup, "_PROCESS", startup.ProcessStartup())
    startup.mark_entered()
    with startup.app_build():
        time.sleep(0.01)
    startup.emit_process_startup("agent")
    startup.emit_process_startup("agent")  # once per process
    launcher.server_ready("agent")

    (server,) = telemetry.spans(names.SPAN_STARTUP_SERVER)
    (process,) = telemetry.spans(names.SPAN_STARTUP_PROCESS)
    assert process.parent is not None and process.parent.span_id == server.context.span_id
    assert process.context.trace_id == server.context.trace_id
    stages = {
        s.attributes[names.ATTR_STARTUP_STAGE]: s
        for s in telemetry.spans()
        if s.parent is not None and s.parent.span_id == process.context.span_id
    }
    assert list(stages) == list(names.STARTUP_PROCESS_STAGES)
    assert stages[names.STARTUP_STAGE_INTERPRETER].start_time == int(env[names.ENV_STARTUP_SPAWNED_NS])
    build = stages[names.STARTUP_STAGE_APP_BUILD]
    assert build.end_time is not None and build.end_time - build.start_time >= 10_000_000
