"""Pure reads of ``/proc`` for one process, and a cached background command (``nvidia-smi``).

Shared by the gauges a process reports about itself (:mod:`gym_obs.telemetry.resources`, ``/proc/self``)
and the ones a launcher reports about the process trees it started (:mod:`gym_obs.telemetry.process_tree`,
``/proc/<pid>``). Every reader returns None where the platform (or a process that just exited) does not
provide the value: a vanished process is a missing point, never an exception in a metric callback.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final, Generic, TypeVar

__all__ = [
    "CachedCommand",
    "command_line",
    "cpu_count",
    "cpu_seconds",
    "fd_count",
    "parent_pids",
    "pss_bytes",
    "rss_bytes",
    "thread_count",
]

_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_T = TypeVar("_T")


def rss_bytes(proc: str) -> int | None:
    """Resident set size of the process whose ``/proc`` directory is ``proc``."""
    try:
        with open(f"{proc}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def pss_bytes(proc: str) -> int | None:
    """Proportional set size (shared pages divided among their users): what workers really add up to."""
    try:
        with open(f"{proc}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fd_count(proc: str, *, own: bool = False) -> int | None:
    """Open descriptors; ``own`` (reading ``/proc/self``) leaves out the one ``listdir`` itself holds."""
    try:
        return len(os.listdir(f"{proc}/fd")) - (1 if own else 0)
    except OSError:
        return None


def thread_count(proc: str) -> int | None:
    try:
        with open(f"{proc}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def command_line(proc: str) -> list[str] | None:
    """The process's argv (empty for a kernel thread or a zombie)."""
    try:
        with open(f"{proc}/cmdline", "rb") as f:
            raw = f.read(64 * 1024)
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _stat_fields(proc: str) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"{proc}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(proc: str) -> tuple[float, float] | None:
    """(user, system) CPU seconds the process has used (clock-tick resolution)."""
    fields = _stat_fields(proc)
    try:
        return (int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS) if fields else None
    except (ValueError, IndexError):
        return None


def parent_pids(root: str = "/proc") -> dict[int, int]:
    """``{pid: parent pid}`` of every process visible in ``root`` (one pass; vanished ones are skipped)."""
    found: dict[int, int] = {}
    try:
        entries = os.listdir(root)
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            fields = _stat_fields(f"{root}/{entry}")
            if fields and len(fields) > 1 and fields[1].isdigit():
                found[int(entry)] = int(fields[1])
    return found


def cpu_count() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class CachedCommand(Generic[_T]):
    """The parsed answer of a command, refreshed in a daemon thread when stale; :meth:`samples` never waits.

    A metric reader must not block on a hung tool: it reports the last answer (empty until the first
    one arrives) while a refresh, bounded by ``timeout_s``, runs in the background.
    """

    def __init__(
        self,
        argv: Sequence[str],
        parse: Callable[[str], list[_T]],
        *,
        refresh_s: float,
        timeout_s: float,
        thread_name: str,
    ) -> None:
        self._argv = list(argv)
        self._parse = parse
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._thread_name = thread_name
        self._lock = threading.Lock()
        self._samples: list[_T] = []
        self._fetched = -refresh_s
        self._running = False

    def samples(self) -> list[_T]:
        with self._lock:
            stale = time.monotonic() - self._fetched >= self._refresh_s
            if stale and not self._running:
                self._running = True
                threading.Thread(target=self._refresh, name=self._thread_name, daemon=True).start()
            return list(self._samples)

    def _refresh(self) -> None:
        samples: list[_T] = []
        try:
            out = subprocess.run(
                self._argv,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            if out.returncode == 0:
                samples = self._parse(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass  # a hung or broken tool means no points, never a stuck export
        with self._lock:
            self._samples, self._fetched, self._running = samples, time.monotonic(), False
