"""One harness run: start the rollout system, drive it, stop it, summarise what happened.

Exit status 0 means the run completed (injected failures are results, not errors); a ``HarnessError``
means the harness itself could not run (bad plan, busy port, a server that did not start) and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from gym_obs.client import HeadServerUnavailableError, ServerClient
from gym_obs.client.http_client import (
    close_global_aiohttp_client,
    configure_global_aiohttp_client,
    get_global_aiohttp_control_client,
)
from gym_obs.config import ConfigError
from gym_obs.harness.driver import Driver
from gym_obs.harness.fault_middleware import CONTROL_PATH
from gym_obs.harness.faults import FaultPlanError
from gym_obs.harness.progress import RunProgress
from gym_obs.harness.rows import RolloutResult, RowWriter
from gym_obs.harness.stack import (
    DRIVER_NAME,
    HarnessError,
    HarnessOptions,
    StackLayout,
    build_layout,
    check_ports_free,
    plan_warnings,
    write_prometheus_targets,
)
from gym_obs.harness.summary import build_summary, render_summary, write_summary
from gym_obs.harness.tally import RunTally
from gym_obs.harness.telemetry_files import read_metric_totals
from gym_obs.server.launcher import Launch, LaunchError, launch, output_console
from gym_obs.server.uvicorn import ServerStartupError
from gym_obs.telemetry import names
from gym_obs.telemetry.logging import configure_logging
from gym_obs.telemetry.redaction import scrub_text
from gym_obs.telemetry.setup import TelemetryHandle, setup_telemetry

__all__ = ["run_harness"]

_FLUSH_TIMEOUT_S = 10.0
_PROGRESS_LOG_S = 1.0
_log = logging.getLogger("gym_obs.harness")


class _ConsoleWarnings(logging.Handler):
    """Warnings reach the terminal once per message template (the full log is in the run's log file)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self._console = console
        self._seen: set[tuple[str, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        key = (record.name, str(record.msg))
        if key in self._seen or len(self._seen) > 1000:
            return
        self._seen.add(key)
        with contextlib.suppress(Exception):
            self._console.print(
                f"[yellow]warning[/] {scrub_text(record.getMessage())}", markup=True, highlight=False
            )


def _configure_driver_logging(log_dir: Path, console: Console) -> None:
    """The driver logs like a server (scrubbed JSON lines with trace ids) into ``logs/harness.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    before = set(root.handlers)
    configure_logging(json=True)
    stream = (log_dir / f"{DRIVER_NAME}.log").open("a", encoding="utf-8")  # open for the process lifetime
    for handler in root.handlers:
        if handler not in before and isinstance(handler, logging.StreamHandler):
            handler.setStream(stream)
    if not any(isinstance(h, _ConsoleWarnings) for h in root.handlers):
        root.addHandler(_ConsoleWarnings(console))


def _peak_rss_mb(pid: int) -> float | None:
    """Peak resident set size of a live process (Linux ``VmHWM``)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (``/proc/<pid>/stat`` fields 14 and 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None


def _cpu_snapshot(running: Launch) -> dict[str, float | None]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    snapshot: dict[str, float | None] = {DRIVER_NAME: usage.ru_utime + usage.ru_stime}
    for proc in running.processes():
        snapshot[proc.name] = _cpu_seconds(proc.pid)
    return snapshot


def _processes(running: Launch, cpu_before: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """Peak memory, and CPU time spent while rollouts ran, per process: what the run cost, and proof that
    nothing grew unbounded."""
    cpu_after = _cpu_snapshot(running)

    def cpu(name: str) -> float | None:
        before, after = cpu_before.get(name), cpu_after.get(name)
        return None if before is None or after is None else round(after - before, 3)

    info: dict[str, dict[str, Any]] = {
        DRIVER_NAME: {
            "pid": os.getpid(),
            # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across fork + exec, so a driver
            # started by a large process (a test runner, a notebook) would report its parent's peak.
            "peak_rss_mb": _peak_rss_mb(os.getpid()),
            "cpu_seconds": cpu(DRIVER_NAME),
        }
    }
    for proc in running.processes():
        info[proc.name] = {
            "pid": proc.pid,
            "peak_rss_mb": _peak_rss_mb(proc.pid),
            "cpu_seconds": cpu(proc.name),
            "log": str(proc.log_path),
        }
    return info


async def _injected(client: ServerClient, servers: list[str]) -> dict[str, dict[str, int]]:
    """Faults each server injected, read from its control route (control pool: not part of the workload)."""
    session = get_global_aiohttp_control_client()
    counts: dict[str, dict[str, int]] = {}
    for name in servers:
        with contextlib.suppress(Exception):
            async with session.get(client.url(name, CONTROL_PATH)) as response:
                body = await response.json()
            if body.get("injected"):
                counts[name] = {str(k): int(v) for k, v in body["injected"].items()}
    return counts


@dataclass
class _Driven:
    """What driving the rollouts produced; ``stopped`` when Ctrl-C/SIGTERM ended it early."""

    tally: RunTally
    injected: dict[str, dict[str, int]]
    wall_s: float
    stopped: bool = False
    cancelled: int = 0  # rollouts in flight when it was stopped (no row: they did not finish)


@contextlib.contextmanager
def _stop_on_signals(stop: Callable[[], object]) -> Iterator[None]:
    """While rollouts run, SIGINT/SIGTERM ask the driver to stop instead of raising inside the event
    loop (which would lose the summary and leave a task's exception unretrieved)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, lambda _signum, _frame: stop())
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


async def _drive(
    options: HarnessOptions,
    layout: StackLayout,
    handle: TelemetryHandle,
    progress: RunProgress,
    writer: RowWriter,
) -> _Driven:
    configure_global_aiohttp_client(layout.config.client)
    try:
        client = ServerClient.load_from_global_config(layout.config.head_server)
    except HeadServerUnavailableError as exc:
        raise HarnessError(str(exc)) from None
    tracer = (
        handle.tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE) if handle.tracer_provider else None
    )
    driver = Driver(
        client=client,
        agents=layout.agents,
        run_id=options.run_id,
        rollout_timeout_s=options.rollout_timeout_s,
        tracer=tracer if handle.enabled else None,
    )

    def on_result(result: RolloutResult) -> None:
        try:
            writer.write(result)  # on disk before this worker awaits its next rollout
        except OSError as exc:
            raise HarnessError(f"cannot write {writer.path}: {exc.strerror or exc}") from None
        progress.record(result.duration_s, failed=result.outcome != names.ROLLOUT_OUTCOME_COMPLETED)

    async def log_progress() -> None:
        """A progress line in the run's log every few seconds, terminal or not: what finished so far."""
        while True:
            await asyncio.sleep(_PROGRESS_LOG_S)
            _log.info("%s", progress.status())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    ticker = asyncio.create_task(log_progress())
    # Until the loop is done, a signal only sets ``stop`` (a second Ctrl-C changes nothing).
    with _stop_on_signals(lambda: loop.call_soon_threadsafe(stop.set)):
        try:
            tally = await driver.run(options.rollouts, options.concurrency, on_result, stop)
            wall = time.perf_counter() - started
            _log.info("%s", progress.status())
            if stop.is_set():
                _log.warning("run stopped early: %d rollouts in flight were cancelled", driver.cancelled)
            injected = await _injected(client, list(layout.config.servers))
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            await close_global_aiohttp_client()
    return _Driven(tally, injected, wall, stopped=stop.is_set(), cancelled=driver.cancelled)


def _linger(seconds: float, console: Console) -> None:
    """Keep the rollout system up (every process still serves ``/metrics``) so a scraper sees the final
    values; Ctrl-C (or SIGTERM, under ``gym-obs harness run``) ends the wait early and the run still
    finishes normally."""
    if seconds <= 0:
        return
    console.print(
        f"gym-obs harness: rollouts done; every process stays up for {seconds:g} s (Ctrl-C to stop now)"
    )
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
    except KeyboardInterrupt:
        console.print("gym-obs harness: stopping")


LATEST_LINK = "latest"


def _run_folder(parent: Path, run_id: str) -> Path:
    """``parent/<run id>``: each run gets its own folder, so no run appends to an old run's logs or mixes
    its telemetry files with them (a run id used twice gets ``-2``, ``-3``, ...)."""
    folder = parent / run_id
    suffix = 2
    while folder.exists() or folder.is_symlink():
        folder = parent / f"{run_id}-{suffix}"
        suffix += 1
    return folder


def _prepare_out(parent: Path, out: Path) -> None:
    """Create the run's folder (a writable directory, found out before any process starts) and point
    ``parent/latest`` at it, so ``gym-obs report`` and ``explain`` find the newest run by default."""
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(20, "it is a file, not a directory")
    out.mkdir(parents=True)
    probe = out / f".gym-obs-write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def _point_latest(parent: Path, out: Path) -> None:
    latest = parent / LATEST_LINK
    if latest.exists() and not latest.is_symlink():
        _log.warning("%s is not a symlink; left as it is (this run is in %s)", latest, out)
        return
    staged = parent / f".{LATEST_LINK}-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    staged.symlink_to(out.name, target_is_directory=True)
    os.replace(staged, latest)  # atomic: a reader sees the old run or the new one, never no link


def _write_config(layout: StackLayout, out: Path) -> None:
    data = layout.config.model_dump(mode="json", exclude_none=True)
    (out / "global_config.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def run_harness(options: HarnessOptions, console: Console | None = None) -> dict[str, Any]:
    """Run the harness and return the summary; raises ``HarnessError`` when it could not run."""
    console = console or output_console()
    err_console = output_console(stderr=True)
    requested = options.out
    parent = requested.resolve()
    options = dataclasses.replace(options, out=_run_folder(parent, options.run_id))
    try:
        layout = build_layout(options)
    except (FaultPlanError, ConfigError) as exc:
        raise HarnessError(str(exc)) from None
    check_ports_free(layout)
    out = options.out
    log_dir = out / "logs"
    try:
        _prepare_out(parent, out)
        if options.telemetry:
            options.telemetry_dir.mkdir(parents=True, exist_ok=True)
        _configure_driver_logging(log_dir, err_console)
        _point_latest(parent, out)
        _write_config(layout, out)
        targets = write_prometheus_targets(layout, out)
    except OSError as exc:
        raise HarnessError(
            f"--out {requested}: cannot write the run's output there ({exc.strerror or exc})"
        ) from None
    handle = setup_telemetry(DRIVER_NAME, DRIVER_NAME, config=layout.driver_telemetry)
    if options.telemetry:  # process gauges are on in the harness: every launched server inherits the switch
        os.environ.setdefault(names.ENV_PROCESS_GAUGES, "1")
    for warning in plan_warnings(options.fault_plan) if options.fault_plan else ():
        err_console.print(f"[yellow]warning[/] {warning}", markup=True, highlight=False)
    err_console.print(
        f"gym-obs harness: {options.rollouts} rollouts, concurrency {options.concurrency}, "
        f"{options.agents} agent(s), {options.models} model(s), {options.resources} resources server(s); "
        f"output in {out}"
    )
    try:
        with launch(layout.config, log_dir=log_dir) as running:
            cpu_before = _cpu_snapshot(running)
            with (
                RowWriter(out / "rollouts.jsonl") as writer,
                RunProgress(options.rollouts, err_console) as bar,
            ):
                driven = asyncio.run(_drive(options, layout, handle, bar, writer))
            processes = _processes(running, cpu_before)
            if not driven.stopped:
                _linger(options.linger_s, err_console)
            # Flush the driver's telemetry while the servers flush theirs: a dead collector costs one
            # export timeout, not two in a row.
            flusher = threading.Thread(target=handle.shutdown, args=(_FLUSH_TIMEOUT_S,), daemon=True)
            flusher.start()
    except (LaunchError, ServerStartupError, ConfigError) as exc:
        raise HarnessError(f"the rollout system did not start: {exc}") from None
    flusher.join(_FLUSH_TIMEOUT_S + 1.0)
    mode = "off" if not options.telemetry else ("otlp" if options.otlp_endpoint else "file")
    run_info: dict[str, Any] = {
        "run_id": options.run_id,
        "partial": driven.stopped,  # True: stopped early (Ctrl-C, SIGTERM); the counts are what finished
        "out_dir": str(out),
        "concurrency": options.concurrency,
        "servers": {"agents": options.agents, "models": options.models, "resources": options.resources},
        "telemetry": {
            "mode": mode,
            "dir": str(options.telemetry_dir.resolve()) if options.telemetry else None,
            "otlp_endpoint": options.otlp_endpoint,
            "prometheus_targets": str(targets) if targets else None,
        },
        "processes": processes,
    }
    metrics = read_metric_totals(options.telemetry_dir, run_id=options.run_id) if options.telemetry else None
    if driven.stopped:
        run_info["interrupted"] = {
            "rollouts_planned": options.rollouts,
            "cancelled_in_flight": driven.cancelled,
        }
    summary = build_summary(
        driven.tally,
        wall_seconds=driven.wall_s,
        run=run_info,
        metrics=metrics,
        role_of=layout.roles,
        injected=driven.injected,
    )
    try:
        write_summary(summary, out)
    except OSError as exc:
        raise HarnessError(f"cannot write {out / 'summary.json'}: {exc.strerror or exc}") from None
    render_summary(summary, console)
    if options.report:
        _write_report(out)
    sys.stdout.flush()
    return summary


def _write_report(out: Path) -> None:
    """The HTML report is a convenience: a folder it cannot read is a warning, never a failed run."""
    from gym_obs.harness.report import ReportError, write_report

    try:
        print(f"report: {write_report(out)}")  # never wrapped: scripts and terminals can open the path
    except (ReportError, OSError) as exc:
        print(f"gym-obs harness: warning: no report written: {exc}", file=sys.stderr)
