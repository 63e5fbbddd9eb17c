"""The startup trace: why a fleet took four minutes to come up, as one ``gym.startup`` trace.

Launcher side (:class:`StartupTrace`): a root ``gym.startup`` span, one ``gym.startup.<stage>`` child per
launcher stage (load config, start head server, spawn servers, wait for readiness) and one
``gym.startup.server`` span per launched process, from spawn to its first healthy probe; a server that never
becomes ready ends its span with an error saying why (exit code and last log line, scrubbed and bounded, or
the timeout). The launcher records ``gym.server.startup.duration`` by ``gym.server.type`` for every server
that became ready.

Server side (:func:`mark_entered`, :func:`app_build`, :func:`emit_process_startup`): each launched process
(every uvicorn worker of a multi-worker server too) joins the trace through
``GYM_OBS_STARTUP_TRACEPARENT`` with a ``gym.startup.process`` span and its stages (interpreter start, app
build, uvicorn start).

Both sides stamp wall-clock times first and create spans only once telemetry is up, with explicit start and
end times: the config that says where telemetry goes is itself a startup stage, and a server's telemetry is
set up inside its app build. With telemetry (or traces) off nothing is created: each call is a flag check
plus, at most, a ``time.time_ns()``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.propagation import format_traceparent

__all__ = [
    "ProcessStartup",
    "StartupTrace",
    "app_build",
    "emit_process_startup",
    "mark_entered",
    "mark_workers_spawning",
]

_LAST_LINE_CHARS: Final = 300
_REASON_CHARS: Final = 500
_W3C: Final = TraceContextTextMapPropagator()


def _tracer() -> trace.Tracer | None:
    tracer = STATE.tracer
    on = STATE.enabled and STATE.traces_enabled and STATE.groups.startup  # the startup span group
    return tracer if on and tracer is not None else None


def _fail(span: Span, error_type: str, reason: str) -> None:
    span.set_attribute(names.ATTR_ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, bounded_excerpt(reason, _REASON_CHARS)))


# --- launcher side ---------------------------------------------------------------------------------------
@dataclass
class _Server:
    server_type: str
    spawned_ns: int
    span: Span | None
    done: bool = False


class StartupTrace:
    """The launcher's half of the startup trace. Create it first thing; call :meth:`activate` once the
    process's telemetry is decided, :meth:`finish` when startup succeeded or failed."""

    def __init__(self) -> None:
        self._start_ns = time.time_ns()
        self._pending: list[tuple[str, int, int]] = []  # stages that ended before telemetry was up
        self._decided = False
        self._root: Span | None = None
        self._context: Context | None = None
        self._servers: dict[str, _Server] = {}
        self._finished = False

    @property
    def traced(self) -> bool:
        """True when the startup trace is being recorded (telemetry and traces on)."""
        return self._root is not None

    def activate(self) -> None:
        """Telemetry is up (or off for good): open the root span at the real start, emit recorded stages."""
        if self._decided:
            return
        self._decided = True
        tracer = _tracer()
        if tracer is None:
            self._pending.clear()
            return
        self._root = tracer.start_span(names.SPAN_STARTUP, kind=SpanKind.INTERNAL, start_time=self._start_ns)
        self._context = trace.set_span_in_context(self._root)
        for stage, start, end in self._pending:
            self._stage_span(stage, start).end(end_time=end)
        self._pending.clear()

    def _stage_span(self, stage: str, start_ns: int) -> Span:
        assert self._root is not None
        return self._root_tracer().start_span(
            names.SPAN_STARTUP_STAGE_PREFIX + stage,
            context=self._context,
            start_time=start_ns,
            attributes={names.ATTR_STARTUP_STAGE: stage},
        )

    def _root_tracer(self) -> trace.Tracer:
        return _tracer() or trace.NoOpTracer()

    @contextlib.contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """One launcher stage; recorded now when tracing, or kept until :meth:`activate` decides."""
        start = time.time_ns()
        span = self._stage_span(stage, start) if self._root is not None else None
        try:
            yield
        except BaseException as error:
            if span is not None:
                _fail(span, type(error).__qualname__, str(error))
            raise
        finally:
            if span is not None:
                span.end()
            elif not self._decided:
                self._pending.append((stage, start, time.time_ns()))

    def server_spawning(self, name: str, server_type: str) -> dict[str, str]:
        """Open ``name``'s span; the environment that lets its process join this trace."""
        spawned = time.time_ns()
        env = {names.ENV_STARTUP_SPAWNED_NS: str(spawned)}
        span = None
        if self._root is not None:
            span = self._root_tracer().start_span(
                names.SPAN_STARTUP_SERVER,
                context=self._context,
                start_time=spawned,
                attributes={names.ATTR_SERVER_NAME: name, names.ATTR_SERVER_TYPE: server_type},
            )
            ctx = span.get_span_context()
            if ctx.is_valid:
                env[names.ENV_STARTUP_TRACEPARENT] = format_traceparent(
                    ctx.trace_id, ctx.span_id, int(ctx.trace_flags)
                )
        self._servers[name] = _Server(server_type, spawned, span)
        return env

    def server_spawned(self, name: str, pid: int) -> None:
        server = self._servers.get(name)
        if server is not None and server.span is not None:
            server.span.set_attribute(names.ATTR_PROCESS_PID, pid)

    def server_ready(self, name: str) -> None:
        """Its first healthy probe: end its span and record how long it took."""
        server = self._servers.get(name)
        if server is None or server.done:
            return
        server.done = True
        now = time.time_ns()
        if server.span is not None:
            server.span.end(end_time=now)
        instruments = STATE.instruments
        if STATE.enabled and instruments is not None:
            _startup_histogram(instruments.meter).record(
                (now - server.spawned_ns) / 1e9, {names.ATTR_SERVER_TYPE: server.server_type}
            )

    def server_exited(self, name: str, exit_code: int, description: str, last_line: str | None) -> None:
        """It exited before becoming ready: error span with the exit code and its last log line."""
        span = self._close(name)
        if span is None:
            return
        span.set_attribute(names.ATTR_PROCESS_EXIT_CODE, exit_code)
        reason = description
        if last_line:
            line = bounded_excerpt(last_line, _LAST_LINE_CHARS)
            span.set_attribute(names.ATTR_STARTUP_LAST_LOG_LINE, line)
            reason = f"{description}; last log line: {line}"
        _fail(span, names.STARTUP_ERROR_EXITED, reason)
        span.end()

    def server_timed_out(self, name: str, timeout_s: float, last_line: str | None) -> None:
        span = self._close(name)
        if span is None:
            return
        span.set_attribute(names.ATTR_STARTUP_TIMEOUT_S, timeout_s)
        reason = f"not ready within {timeout_s:g}s"
        if last_line:
            line = bounded_excerpt(last_line, _LAST_LINE_CHARS)
            span.set_attribute(names.ATTR_STARTUP_LAST_LOG_LINE, line)
            reason = f"{reason}; last log line: {line}"
        _fail(span, names.STARTUP_ERROR_TIMEOUT, reason)
        span.end()

    def _close(self, name: str) -> Span | None:
        server = self._servers.get(name)
        if server is None or server.done:
            return None
        server.done = True
        return server.span

    def finish(self, error: BaseException | None = None) -> None:
        """End the root (error when startup failed); servers still starting end as not ready."""
        if self._finished:
            return
        self._finished = True
        self.activate()  # a launch that failed before telemetry was decided still decides it once
        for server in self._servers.values():
            if not server.done and server.span is not None:
                server.done = True
                reason = "the launch stopped before it was ready"
                _fail(server.span, names.STARTUP_ERROR_LAUNCH_FAILED, reason)
                server.span.end()
        if self._root is not None:
            if error is not None:
                _fail(self._root, names.STARTUP_ERROR_LAUNCH_FAILED, f"{type(error).__name__}: {error}")
            self._root.end()


def _startup_histogram(meter: Meter) -> Histogram:
    """Created at each ready server (a few per launch, never a hot path; the SDK returns the same one)."""
    return meter.create_histogram(
        names.METRIC_SERVER_STARTUP_DURATION,
        unit=names.UNIT_SECONDS,
        description="From spawning a server process to its first healthy readiness probe.",
        explicit_bucket_boundaries_advisory=list(names.SERVER_STARTUP_BUCKETS_S),
    )


# --- server side -----------------------------------------------------------------------------------------
@dataclass
class ProcessStartup:
    """Wall-clock stamps (ns) of this process's startup; spans are made from them once it serves."""

    entered_ns: int | None = None
    build_start_ns: int | None = None
    build_end_ns: int | None = None
    emitted: bool = False


_PROCESS: Final = ProcessStartup()


def mark_entered() -> None:
    """gym_obs code runs in this (launched or worker) process: the end of its interpreter start."""
    if _PROCESS.entered_ns is None:
        _PROCESS.entered_ns = time.time_ns()


def mark_workers_spawning() -> None:
    """A multi-worker server is about to start its workers: their interpreter start begins now."""
    if names.ENV_STARTUP_SPAWNED_NS in os.environ:
        os.environ[names.ENV_STARTUP_SPAWNED_NS] = str(time.time_ns())


@contextlib.contextmanager
def app_build() -> Iterator[None]:
    """Around building the app (telemetry set-up included): the app-build stage."""
    start = time.time_ns()
    try:
        yield
    finally:
        if _PROCESS.build_start_ns is None:
            _PROCESS.build_start_ns, _PROCESS.build_end_ns = start, time.time_ns()


def emit_process_startup(server_name: str) -> None:
    """This process serves (lifespan startup done): emit its ``gym.startup.process`` span and stages as
    a child of the launcher's ``gym.startup.server`` span. Once per process; a flag check when off."""
    tracer = _tracer()
    if tracer is None or _PROCESS.emitted:
        return
    _PROCESS.emitted = True
    parent = os.environ.get(names.ENV_STARTUP_TRACEPARENT)
    try:
        spawned = int(os.environ.get(names.ENV_STARTUP_SPAWNED_NS, ""))
    except ValueError:
        return
    if not parent:
        return
    context = _W3C.extract({names.TRACEPARENT_HEADER: parent})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return
    ready = time.time_ns()
    span = tracer.start_span(
        names.SPAN_STARTUP_PROCESS,
        context=context,
        start_time=spawned,
        attributes={names.ATTR_SERVER_NAME: server_name, names.ATTR_PROCESS_PID: os.getpid()},
    )
    inside = trace.set_span_in_context(span)
    build_end = _PROCESS.build_end_ns or ready
    stages = (
        (names.STARTUP_STAGE_INTERPRETER, spawned, _PROCESS.entered_ns),
        (names.STARTUP_STAGE_APP_BUILD, _PROCESS.build_start_ns, _PROCESS.build_end_ns),
        (names.STARTUP_STAGE_UVICORN, build_end, ready),
    )
    for stage, start, end in stages:
        if start is not None and end is not None and end >= start:
            tracer.start_span(
                names.SPAN_STARTUP_STAGE_PREFIX + stage,
                context=inside,
                start_time=start,
                attributes={names.ATTR_STARTUP_STAGE: stage},
            ).end(end_time=end)
    span.end(end_time=ready)
