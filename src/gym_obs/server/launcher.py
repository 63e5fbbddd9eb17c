"""Launcher: the head server and every configured server as separate processes, up and down together.

``launch(config)`` (a context manager, for tests and the harness) and ``gym-obs serve CONFIG.yaml`` (the
command) start the head server, then every server (``python -m gym_obs.server._child``) with the resolved
global config in its environment, wait for each ``/readyz`` (bounded per server by ``startup_timeout_s``),
and on failure stop everything and raise an error naming the server with the tail of its log. Each child is
its own process group, so Ctrl-C reaches the launcher only and servers are stopped in order (SIGTERM: uvicorn
shuts down gracefully and telemetry is flushed; SIGKILL after a grace period).

Children die with their launcher even when it is killed with SIGKILL and runs no cleanup: on Linux each
child asks the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, set only when the
launching thread is the main thread, since the signal follows the thread that forked), and every child
watches a pipe whose only write end the launcher holds; end-of-file means the launcher is gone, so the
child terminates itself gracefully and, after a grace period, SIGKILLs its own process group (its uvicorn
workers included). Both are armed before the child imports the server, and a child whose launcher died
before that exits at once. With ``echo_output`` (what
``gym-obs serve`` does on a terminal) each child's output also goes to this process's stdout, every line
prefixed with ``(<server name>) `` so several servers stay readable on one terminal.

Startup is one ``gym.startup`` trace (see :mod:`gym_obs.server.startup`): ``launch()`` records it through
this process's telemetry when that is on (the harness driver's, an application's), and ``gym-obs serve``
(``setup_launcher_telemetry=True``) sets up its own from the config's telemetry section as service
``gym/launcher``, never serving a Prometheus endpoint (that port is the servers'). Every server is polled for
readiness in the same loop, so each one's span ends at its own first healthy probe. With process gauges on
(``GYM_OBS_PROCESS_GAUGES``) the launcher also reports every server's whole process tree
(:mod:`gym_obs.telemetry.process_tree`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from gym_obs import _version
from gym_obs.client import server_base_url
from gym_obs.config import ConfigError, GlobalConfig, load_global_config, parse_global_config
from gym_obs.server.head_server import HEAD_SERVER_NAME
from gym_obs.server.ops import pump_output
from gym_obs.server.startup import StartupTrace, mark_entered
from gym_obs.server.uvicorn import ServerStartupError, validate_forwarded_allow_ips
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.process_tree import TreeRoot, start_process_tree_gauges
from gym_obs.telemetry.resources import process_gauges_requested
from gym_obs.telemetry.settings import resolve_settings
from gym_obs.telemetry.setup import TelemetryHandle, launch_run_id, setup_telemetry

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "UNWRAPPED_WIDTH",
    "Launch",
    "LaunchError",
    "LaunchedProcess",
    "launch",
    "output_console",
    "preflight",
    "resolve_config",
    "serve",
]

_POLL_S: Final = 0.1
_PROBE_TIMEOUT_S: Final = 1.0
_HEAD_STARTUP_TIMEOUT_S: Final = 30.0
_STOP_GRACE_S: Final = 10.0
_LOG_TAIL_LINES: Final = 40
_PUMP_JOIN_S: Final = 5.0
_ORPHAN_GRACE_S: Final = 5.0
_PR_SET_PDEATHSIG: Final = 1
#: A launched child runs this: arm the launcher watch, then the server's entry point with the same argv.
_CHILD_BOOTSTRAP: Final = (
    "import sys\nfrom gym_obs.server.launcher import _run_child\nsys.exit(_run_child())\n"
)


class LaunchError(RuntimeError):
    """A server could not be started or died; the message names it and shows the tail of its log."""


@dataclass
class LaunchedProcess:
    """One child process: its name, URL, log file and the Popen handle."""

    name: str
    server_type: str
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    num_workers: int = 1
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    _pump: threading.Thread | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _probe(url: str, pid: int) -> bool:
    """200 from ``url``, answered by ``pid`` or one of its workers (not a stray server on that port)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=_PROBE_TIMEOUT_S) as response:
            body = json.loads(response.read())
            status = response.status
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return status == 200 and isinstance(body, dict) and pid in (body.get("pid"), body.get("ppid"))


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class Launch:
    """The running deployment: head server and servers. ``stop()`` is idempotent."""

    def __init__(
        self,
        config: GlobalConfig,
        log_dir: Path,
        *,
        echo_output: bool = False,
        startup: StartupTrace | None = None,
    ) -> None:
        self.config = config
        self.log_dir = log_dir
        self.echo_output = echo_output
        self.startup = startup if startup is not None else StartupTrace()
        self.head: LaunchedProcess | None = None
        self.servers: dict[str, LaunchedProcess] = {}
        self._stopped = False
        self._watch_read, self._watch_write = os.pipe()  # children watch the read end for EOF

    @property
    def head_url(self) -> str:
        head = self.config.head_server
        return server_base_url(head.host, head.port)

    def processes(self) -> list[LaunchedProcess]:
        """Servers first, head last (the order they are stopped in)."""
        return [*self.servers.values(), *([self.head] if self.head is not None else [])]

    def dead(self) -> list[LaunchedProcess]:
        """Processes that have exited."""
        return [proc for proc in self.processes() if proc.exit_code() is not None]

    def check(self) -> None:
        """Raise :class:`LaunchError` if any process has exited."""
        for proc in self.dead():
            raise LaunchError(_died_message(proc))

    # -- start ---------------------------------------------------------------------------------------------

    def _spawn(
        self, name: str, server_type: str, url: str, args: list[str], env: Mapping[str, str], workers: int = 1
    ) -> LaunchedProcess:
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - owned by LaunchedProcess, closed in stop()
        watch = {
            names.ENV_LAUNCHER_PID: str(os.getpid()),
            names.ENV_LAUNCHER_PIPE_FD: str(self._watch_read),
            names.ENV_LAUNCHER_DEATH_SIGNAL: "1"
            if threading.current_thread() is threading.main_thread()
            else "0",
        }
        watch.update(self.startup.server_spawning(name, server_type))
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_BOOTSTRAP, *args],
                env={**env, **watch},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.echo_output else log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C goes to the launcher, which stops children in order
                pass_fds=(self._watch_read,),
            )
        except BaseException:
            log_file.close()
            raise
        self.startup.server_spawned(name, process.pid)
        pump = None
        if self.echo_output and process.stdout is not None:
            pump = pump_output(process.stdout, name, raw=[log_file], prefixed=[sys.stdout.buffer])
        return LaunchedProcess(name, server_type, url, log_path, process, workers, log_file, pump)

    def _wait_all_ready(self, waits: list[tuple[LaunchedProcess, float]]) -> None:
        """Poll every process's ``/readyz`` in one loop (each bounded by its own timeout from now), so each
        is seen ready at its own first healthy probe; the first that dies or times out raises."""
        start = time.monotonic()
        pending = {proc.name: (proc, timeout_s, start + timeout_s) for proc, timeout_s in waits}
        while pending:
            for name, (proc, timeout_s, deadline) in list(pending.items()):
                ready_url = proc.url + "/readyz"
                code = proc.exit_code()
                if code is not None:
                    self.startup.server_exited(name, code, _describe_exit(code), _last_line(proc))
                    raise LaunchError(_died_message(proc, before_ready=True))
                if _probe(ready_url, proc.pid):
                    self.startup.server_ready(name)
                    del pending[name]
                elif time.monotonic() > deadline:
                    self.startup.server_timed_out(name, timeout_s, _last_line(proc))
                    raise LaunchError(
                        f"server {proc.name!r} did not become ready at {ready_url} within {timeout_s:g}s "
                        f"(startup_timeout_s); last lines of {proc.log_path}:\n{proc.log_tail()}"
                    )
            if pending:
                time.sleep(_POLL_S)

    def start(self, env: Mapping[str, str], ready_timeout_s: float | None) -> None:
        startup = self.startup
        with startup.stage(names.STARTUP_STAGE_START_HEAD):
            head_env = {**env, names.ENV_SERVER_NAME: HEAD_SERVER_NAME}  # its name on every log line
            self.head = self._spawn(HEAD_SERVER_NAME, HEAD_SERVER_NAME, self.head_url, ["--head"], head_env)
            self._wait_ready_head()
        with startup.stage(names.STARTUP_STAGE_SPAWN_SERVERS):
            for name, server in self.config.servers.items():
                url = server_base_url(server.host, server.port)
                child_env = {**env, names.ENV_SERVER_NAME: name}
                self.servers[name] = self._spawn(
                    name, server.server_type, url, [name], child_env, server.num_workers
                )
        with startup.stage(names.STARTUP_STAGE_WAIT_READY):
            self._wait_all_ready(
                [
                    (proc, ready_timeout_s or self.config.servers[name].startup_timeout_s)
                    for name, proc in self.servers.items()
                ]
            )
            # The head's /readyz turns 200 once it has seen every server ready: one place for callers to wait.
            if self.head is not None and self.servers:
                self._wait_all_ready([(self.head, _HEAD_STARTUP_TIMEOUT_S)])

    def _wait_ready_head(self) -> None:
        head = self.head
        assert head is not None
        deadline = time.monotonic() + _HEAD_STARTUP_TIMEOUT_S
        while not _probe(head.url + "/livez", head.pid):
            code = head.exit_code()
            if code is not None:
                self.startup.server_exited(head.name, code, _describe_exit(code), _last_line(head))
                raise LaunchError(_died_message(head, before_ready=True))
            if time.monotonic() > deadline:
                self.startup.server_timed_out(head.name, _HEAD_STARTUP_TIMEOUT_S, _last_line(head))
                raise LaunchError(
                    f"the head server did not start at {head.url} within {_HEAD_STARTUP_TIMEOUT_S:g}s; "
                    f"last lines of {head.log_path}:\n{head.log_tail()}"
                )
            time.sleep(_POLL_S)
        self.startup.server_ready(head.name)

    def tree_roots(self) -> list[TreeRoot]:
        """Every running server's process-tree root (the head included), for the process-tree gauges."""
        return [
            TreeRoot(proc.name, proc.pid, workers=proc.num_workers > 1)
            for proc in self.processes()
            if proc.exit_code() is None
        ]

    # -- stop ----------------------------------------------------------------------------------------------

    def stop(self, grace_s: float = _STOP_GRACE_S) -> None:
        """SIGTERM every process (servers, then head), SIGKILL its group after ``grace_s``."""
        if self._stopped:
            return
        self._stopped = True
        procs = self.processes()
        for proc in procs:
            if proc.exit_code() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the child's own group: its uvicorn workers too
                proc.process.wait()
            if proc._pump is not None:
                proc._pump.join(_PUMP_JOIN_S)  # the last lines reach the log before it is closed
            if proc._log_file is not None:
                proc._log_file.close()
        for fd in (self._watch_read, self._watch_write):
            with contextlib.suppress(OSError):
                os.close(fd)


def _run_child() -> int:
    """A launched child's entry point: die with the launcher, then run ``gym_obs.server._child``."""
    mark_entered()
    _die_with_launcher()
    from gym_obs.server._child import main

    return main(sys.argv[1:])


def _die_with_launcher() -> None:
    """Arm the parent-death signal and the pipe watch (see the module docstring); exit if already orphaned."""
    launcher = _env_int(names.ENV_LAUNCHER_PID)
    pipe_fd = _env_int(names.ENV_LAUNCHER_PIPE_FD)
    if os.environ.pop(names.ENV_LAUNCHER_DEATH_SIGNAL, "0") == "1" and sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # no prctl: the pipe watch still works
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if launcher is not None and os.getppid() != launcher:
        print("gym_obs: the launcher exited before this server started; not starting", file=sys.stderr)
        sys.exit(1)
    if pipe_fd is not None:
        threading.Thread(
            target=_watch_launcher, args=(pipe_fd,), name="gym-obs-launcher-watch", daemon=True
        ).start()


def _env_int(name: str) -> int | None:
    value = os.environ.pop(name, None)  # the server's own children (uvicorn workers) must not inherit it
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _watch_launcher(pipe_fd: int) -> None:
    """Block until the launcher's end of the pipe closes, then stop: SIGTERM, SIGKILL of the group later."""
    try:
        while os.read(pipe_fd, 1):
            pass
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(_ORPHAN_GRACE_S)
    with contextlib.suppress(OSError):
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _last_line(proc: LaunchedProcess) -> str | None:
    """The last non-empty line of a process's log (the startup span scrubs and bounds it)."""
    lines = [line for line in proc.log_tail(5).splitlines() if line.strip()]
    return lines[-1] if lines else None


def _died_message(proc: LaunchedProcess, *, before_ready: bool = False) -> str:
    code = proc.exit_code()
    when = " before becoming ready" if before_ready else ""
    what = _describe_exit(code) if code is not None else "stopped"
    return f"server {proc.name!r} {what}{when}; last lines of {proc.log_path}:\n{proc.log_tail()}"


def preflight(config: GlobalConfig) -> None:
    """Checks that need no child process: every proxy allow-list (raises ServerStartupError)."""
    for name, server in config.servers.items():
        validate_forwarded_allow_ips(
            server.forwarded_allow_ips,
            proxy_headers=server.proxy_headers,
            where=f"servers.{name}.forwarded_allow_ips",
        )


def _child_environment(config: GlobalConfig, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    if extra:
        env.update(extra)
    # One run id for every process of this launch (config, else the environment or scheduler, else new).
    env[names.ENV_RUN_ID] = launch_run_id(config.telemetry.run_id, env)
    env[names.ENV_GLOBAL_CONFIG] = config.model_dump_json()
    env["PYTHONUNBUFFERED"] = "1"
    # Children run the same gym_obs as the launcher, installed or not.
    package_root = str(Path(_version.__file__).resolve().parent.parent)
    paths = [package_root, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def resolve_config(config: object) -> GlobalConfig:
    """A GlobalConfig from what :func:`launch` was given: a GlobalConfig, a dict (validated like the YAML
    file would be) or the path of a YAML file; anything else is a :class:`ConfigError` saying so."""
    if isinstance(config, GlobalConfig):
        return config
    if isinstance(config, Mapping):
        return parse_global_config(dict(config), source="launch(config=<dict>)")
    if isinstance(config, str | os.PathLike):
        return load_global_config(config)
    raise ConfigError(
        "launch(): config must be a GlobalConfig, a dict or the path of a YAML file, "
        f"not {type(config).__name__}"
    )


@contextlib.contextmanager
def launch(
    config: GlobalConfig | Mapping[str, object] | str | os.PathLike[str],
    *,
    log_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float | None = None,
    stop_grace_s: float = _STOP_GRACE_S,
    echo_output: bool = False,
    setup_launcher_telemetry: bool = False,
) -> Iterator[Launch]:
    """Start the head server and every server, wait until all are ready, stop them all on exit.

    A context manager: ``with launch(config) as running:``. ``config`` is a GlobalConfig, a dict of the
    same shape as the YAML file, or a YAML path; anything else is a ConfigError. ``env`` adds environment
    variables for the children.
    ``echo_output`` copies every child's output to stdout, each line prefixed ``(<server name>) ``.
    The startup trace and the process-tree gauges go through this process's telemetry when it is on;
    ``setup_launcher_telemetry`` sets it up from the config (service ``gym/launcher``) when it is not,
    and shuts it down when the launch ends.
    Raises :class:`~gym_obs.config.ConfigError` / :class:`ServerStartupError` before starting anything
    for a bad config, and :class:`LaunchError` (everything already started is stopped) when a server
    fails to start.
    """
    startup = StartupTrace()
    with startup.stage(names.STARTUP_STAGE_LOAD_CONFIG):
        resolved = resolve_config(config)
        preflight(resolved)
    owned = _launcher_telemetry(resolved) if setup_launcher_telemetry else None
    try:
        with _tree_gauges() as add_source:
            startup.activate()
            running = _start(resolved, log_dir, env, ready_timeout_s, echo_output, startup, stop_grace_s)
            try:
                add_source(running.tree_roots)
                yield running
            finally:
                running.stop(stop_grace_s)
    finally:
        if owned is not None:
            owned.shutdown()


def _start(
    resolved: GlobalConfig,
    log_dir: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    ready_timeout_s: float | None,
    echo_output: bool,
    startup: StartupTrace,
    stop_grace_s: float,
) -> Launch:
    """Create the log directory and start everything; on failure stop what started and end the trace."""
    try:
        directory = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="gym-obs-"))
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        where = log_dir if log_dir is not None else "a temporary directory"
        failure = LaunchError(f"cannot create the log directory {where}: {error.strerror or error}")
        startup.finish(failure)
        raise failure from None
    running = Launch(resolved, directory, echo_output=echo_output, startup=startup)
    try:
        running.start(_child_environment(resolved, env), ready_timeout_s)
    except BaseException as error:
        startup.finish(error)
        running.stop(stop_grace_s)
        raise
    startup.finish()
    return running


def _launcher_telemetry(config: GlobalConfig) -> TelemetryHandle | None:
    """Set up telemetry for this launcher process when none is on; the handle when it did (it owns it).

    The launcher never binds the Prometheus port of the config: it belongs to the servers.
    """
    if STATE.enabled:
        return None
    telemetry = config.telemetry
    exporters = [e for e in resolve_settings(telemetry, os.environ).metrics_exporters if e != "prometheus"]
    telemetry = telemetry.model_copy(update={"metrics_exporter": ",".join(exporters) or "none"})
    handle = setup_telemetry(names.LAUNCHER_SERVICE_NAME, names.LAUNCHER_SERVICE_NAME, config=telemetry)
    return handle if handle.enabled else None


@contextlib.contextmanager
def _tree_gauges() -> Iterator[Callable[[Callable[[], list[TreeRoot]]], None]]:
    """Report the launched servers' process trees while the launch runs (process gauges on only)."""
    stops: list[Callable[[], None]] = []

    def add(source: Callable[[], list[TreeRoot]]) -> None:
        if STATE.enabled and process_gauges_requested():
            stop = start_process_tree_gauges(source)
            if stop is not None:
                stops.append(stop)

    try:
        yield add
    finally:
        for stop in stops:
            stop()


# --- the `gym-obs serve` command ---------------------------------------------------------------------------


#: The width of a console that is not a terminal: a file or a pipe has no columns to fit, and a table cut
#: to rich's default 80 would fold every path and URL in it.
UNWRAPPED_WIDTH: Final = 10_000


def output_console(*, stderr: bool = False) -> Console:
    """A rich console for tables: the terminal's width on a terminal; otherwise ``COLUMNS`` when set, else
    wide enough that no line is cut (``gym-obs serve > file``, a harness run in CI)."""
    from rich.console import Console as _Console

    console = _Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").strip():
        console.width = UNWRAPPED_WIDTH
    return console


def _print_table(running: Launch) -> None:
    from rich.table import Table

    table = Table(title="gym_obs servers", title_justify="left")
    for column in ("server", "type", "url", "pid", "workers", "log"):
        table.add_column(column)
    for proc in [*([running.head] if running.head is not None else []), *running.servers.values()]:
        table.add_row(
            proc.name, proc.server_type, proc.url, str(proc.pid), str(proc.num_workers), str(proc.log_path)
        )
    console = output_console()
    console.print(table)
    console.print("All servers are ready. Press Ctrl-C to stop them.")


def _stdout_is_a_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _raise_keyboard_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def serve(
    config_path: str | os.PathLike[str],
    *,
    log_dir: str | os.PathLike[str] | None = None,
    ready_timeout_s: float | None = None,
) -> int:
    """Run a deployment in the foreground until Ctrl-C (exit 0) or until a server dies (exit 1)."""
    # Both installed explicitly: a process started in the background by a non-interactive shell (a CI
    # script, `serve &`) inherits SIGINT as ignored, and Python then installs no KeyboardInterrupt for it.
    previous = {sig: signal.signal(sig, _raise_keyboard_interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # On a terminal, the servers' output is shown there too, each line prefixed with its server's name.
        echo = _stdout_is_a_terminal()
        with launch(
            config_path,
            log_dir=log_dir,
            ready_timeout_s=ready_timeout_s,
            echo_output=echo,
            setup_launcher_telemetry=True,
        ) as running:
            _print_table(running)
            while True:
                running.check()
                time.sleep(0.5)
    except KeyboardInterrupt:
        print("gym_obs: stopping servers", file=sys.stderr)
        return 0
    except (LaunchError, ServerStartupError, ValueError) as error:  # ConfigError is a ValueError
        print(f"gym_obs: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # spawning a child, writing a log: one line, not a traceback
        print(f"gym_obs: cannot start the servers: {error}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
