"""Gauges of whole process trees a launcher started: each server with its uvicorn workers and subprocesses.

A server's own gauges (:mod:`gym_obs.telemetry.resources`) see one process; a multi-worker server or an
agent that runs tools as subprocesses is a tree, and only the launcher, which started its root, sees all of
it. Points are summed per (``gym.server.name``, ``gym.process.role``): the role is ``main`` for the process
the launcher spawned, ``worker`` for a direct child of a multi-worker server started the way uvicorn starts
its workers (``multiprocessing`` spawn: ``--multiprocessing-fork`` in its argv), ``child`` for anything else
below (subprocess agents, tools, multiprocessing's resource tracker). Pids are never labels (a restarted
worker would be a new series forever); the ``gym.server.process_tree.processes`` gauge says how many
processes each point sums.

Sampling happens in the metric reader's export thread, never on a request path: one pass over ``/proc``
per collection (cached for ``_SNAPSHOT_S``, so the six instruments share it). GPU memory per tree comes
from ``nvidia-smi --query-compute-apps`` run in a background thread (``_procfs.CachedCommand``); without
``nvidia-smi`` that instrument is never created.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from gym_obs.telemetry import _procfs, names
from gym_obs.telemetry._state import STATE

__all__ = ["ProcessTreeGauges", "TreeRoot", "start_process_tree_gauges"]

LOGGER: Final = logging.getLogger("gym_obs.telemetry")
_SNAPSHOT_S: Final = 1.0
_MAX_TREE: Final = 4096  # processes followed below one root: a fork bomb cannot make a sample unbounded
_APPS_QUERY: Final = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
_APPS_LINE: Final = re.compile(r"\s*(\d{1,10})\s*,\s*([0-9.]+)\s*")
_MAX_APPS: Final = 1024
_GPU_REFRESH_S: Final = 10.0
_GPU_TIMEOUT_S: Final = 5.0
_SPAWNED_WORKER_ARG: Final = "--multiprocessing-fork"  # argv of a multiprocessing (uvicorn) spawn worker

_Key = tuple[str, str]  # (gym.server.name, gym.process.role)


@dataclass(frozen=True)
class TreeRoot:
    """One launched server: its name, the pid the launcher spawned, and whether its children are workers."""

    server_name: str
    pid: int
    workers: bool = False


@dataclass
class _Totals:
    processes: int = 0
    rss: int = 0
    pss: int = 0
    fds: int = 0
    threads: int = 0
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    gpu_memory: int = 0
    has_pss: bool = False


@dataclass
class _Snapshot:
    taken: float = -_SNAPSHOT_S
    totals: dict[_Key, _Totals] = field(default_factory=dict)


def _parse_compute_apps(text: str) -> list[tuple[int, int]]:
    """``(pid, GPU memory bytes)`` per line of ``nvidia-smi --query-compute-apps=pid,used_memory`` CSV."""
    apps: list[tuple[int, int]] = []
    for line in text.splitlines()[:_MAX_APPS]:
        match = _APPS_LINE.fullmatch(line)
        if match is not None:
            apps.append((int(match.group(1)), int(float(match.group(2)) * 1024 * 1024)))
    return apps


def _children(parents: dict[int, int]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid, ppid in parents.items():
        children[ppid].append(pid)
    return children


def _tree(root: TreeRoot, parents: dict[int, int], children: dict[int, list[int]]) -> list[tuple[int, str]]:
    """``(pid, role)`` of the root and every descendant (breadth first, bounded)."""
    if root.pid not in parents:
        return []
    found = [(root.pid, names.PROCESS_ROLE_MAIN)]
    queue = deque((child, 1) for child in children.get(root.pid, ()))
    while queue and len(found) < _MAX_TREE:
        pid, depth = queue.popleft()
        worker = depth == 1 and root.workers and _is_spawned_worker(pid)
        found.append((pid, names.PROCESS_ROLE_WORKER if worker else names.PROCESS_ROLE_CHILD))
        queue.extend((child, depth + 1) for child in children.get(pid, ()))
    return found


def _is_spawned_worker(pid: int) -> bool:
    return _SPAWNED_WORKER_ARG in (_procfs.command_line(f"/proc/{pid}") or ())


class ProcessTreeGauges:
    """The observable instruments of one meter, summing every registered source's trees at collection."""

    def __init__(self, meter: Meter, *, gpu: bool = True) -> None:
        self.meter = meter
        self._lock = threading.Lock()
        self._sources: list[Callable[[], Sequence[TreeRoot]]] = []
        self._snapshot = _Snapshot()
        self._cpu_last: dict[int, tuple[float, float, float]] = {}  # pid -> (monotonic, user s, system s)
        executable = shutil.which("nvidia-smi") if gpu else None
        self.gpu = (
            _procfs.CachedCommand(
                [executable, *_APPS_QUERY],
                _parse_compute_apps,
                refresh_s=_GPU_REFRESH_S,
                timeout_s=_GPU_TIMEOUT_S,
                thread_name="gym-obs-nvidia-smi-apps",
            )
            if executable
            else None
        )
        updown = meter.create_observable_up_down_counter
        updown(
            names.METRIC_TREE_PROCESSES,
            callbacks=[self._processes],
            unit=names.UNIT_PROCESS,
            description="Processes in each launched server's tree, by role.",
        )
        updown(
            names.METRIC_TREE_MEMORY_USAGE,
            callbacks=[self._memory],
            unit=names.UNIT_BYTES,
            description="Physical memory of each launched server's process tree (rss, pss), by role.",
        )
        meter.create_observable_gauge(
            names.METRIC_TREE_CPU_UTILIZATION,
            callbacks=[self._cpu],
            unit=names.UNIT_RATIO,
            description="CPU of each launched server's process tree over wall time and the host's CPUs.",
        )
        updown(
            names.METRIC_TREE_FILE_DESCRIPTORS,
            callbacks=[self._fds],
            unit=names.UNIT_FILE_DESCRIPTOR,
            description="Open file descriptors of each launched server's process tree, by role.",
        )
        updown(
            names.METRIC_TREE_THREADS,
            callbacks=[self._threads],
            unit=names.UNIT_THREAD,
            description="OS threads of each launched server's process tree, by role.",
        )
        if self.gpu is not None:
            self.gpu.samples()  # the first refresh starts now, so the first export has an answer
            updown(
                names.METRIC_TREE_GPU_MEMORY_USAGE,
                callbacks=[self._gpu_memory],
                unit=names.UNIT_BYTES,
                description="GPU memory used by each launched server's process tree (nvidia-smi, cached).",
            )

    # -- sources ---------------------------------------------------------------------------------------
    def add(self, source: Callable[[], Sequence[TreeRoot]]) -> Callable[[], None]:
        """Report the trees ``source`` names at every collection; returns the call that stops it."""
        with self._lock:
            self._sources.append(source)
            self._snapshot = _Snapshot()

        def remove() -> None:
            with self._lock:
                if source in self._sources:
                    self._sources.remove(source)
                self._snapshot = _Snapshot()

        return remove

    # -- sampling --------------------------------------------------------------------------------------
    def totals(self) -> dict[_Key, _Totals]:
        """The current sums (cached for ``_SNAPSHOT_S``: every instrument of one collection shares them)."""
        with self._lock:
            now = time.monotonic()
            if now - self._snapshot.taken >= _SNAPSHOT_S:
                self._snapshot = _Snapshot(now, self._sample(now))
            return self._snapshot.totals

    def _sample(self, now: float) -> dict[_Key, _Totals]:
        roots = [root for source in self._sources for root in _safe_roots(source)]
        if not roots:
            return {}
        parents = _procfs.parent_pids()
        children = _children(parents)
        gpu: dict[int, int] = defaultdict(int)  # a process on several GPUs has one line per GPU
        for pid, used in self.gpu.samples() if self.gpu is not None else ():
            gpu[pid] += used
        totals: dict[_Key, _Totals] = {}
        seen: set[int] = set()
        capacity = _procfs.cpu_count()
        for root in roots:
            for pid, role in _tree(root, parents, children):
                if pid in seen:
                    continue
                seen.add(pid)
                proc = f"/proc/{pid}"
                rss = _procfs.rss_bytes(proc)
                if rss is None:
                    continue  # exited between the listing and this read
                point = totals.setdefault((root.server_name, role), _Totals())
                point.processes += 1
                point.rss += rss
                pss = _procfs.pss_bytes(proc)
                if pss is not None:
                    point.pss += pss
                    point.has_pss = True
                point.fds += _procfs.fd_count(proc) or 0
                point.threads += _procfs.thread_count(proc) or 0
                point.gpu_memory += gpu.get(pid, 0)
                user, system = self._cpu_delta(pid, proc, now)
                point.cpu_user += user / capacity
                point.cpu_system += system / capacity
        for pid in [pid for pid in self._cpu_last if pid not in seen]:
            del self._cpu_last[pid]
        return totals

    def _cpu_delta(self, pid: int, proc: str, now: float) -> tuple[float, float]:
        """CPU share of one process since its previous sample; 0 the first time it is seen."""
        cpu = _procfs.cpu_seconds(proc)
        if cpu is None:
            return 0.0, 0.0
        last = self._cpu_last.get(pid)
        self._cpu_last[pid] = (now, *cpu)
        if last is None or now - last[0] <= 0:
            return 0.0, 0.0
        wall = now - last[0]
        return max(0.0, (cpu[0] - last[1]) / wall), max(0.0, (cpu[1] - last[2]) / wall)

    # -- callbacks -------------------------------------------------------------------------------------
    def _points(self, value: Callable[[_Totals], float | None], **extra: str) -> list[Observation]:
        points = []
        for (server, role), totals in self._safe_totals().items():
            number = value(totals)
            if number is not None:
                attributes = {names.ATTR_SERVER_NAME: server, names.ATTR_PROCESS_ROLE: role, **extra}
                points.append(Observation(number, attributes))
        return points

    def _safe_totals(self) -> dict[_Key, _Totals]:
        try:
            return self.totals()
        except Exception:  # telemetry never stops the program
            LOGGER.debug("process-tree sample dropped", exc_info=True)
            return {}

    def _processes(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._points(lambda t: t.processes)

    def _memory(self, _options: CallbackOptions) -> Iterable[Observation]:
        rss = self._points(lambda t: t.rss, **{names.ATTR_MEMORY_TYPE: names.MEMORY_TYPE_RSS})
        pss = self._points(
            lambda t: t.pss if t.has_pss else None, **{names.ATTR_MEMORY_TYPE: names.MEMORY_TYPE_PSS}
        )
        return rss + pss

    def _cpu(self, _options: CallbackOptions) -> Iterable[Observation]:
        user = self._points(lambda t: min(1.0, t.cpu_user), **{names.ATTR_CPU_MODE: names.CPU_MODE_USER})
        system = self._points(
            lambda t: min(1.0, t.cpu_system), **{names.ATTR_CPU_MODE: names.CPU_MODE_SYSTEM}
        )
        return user + system

    def _fds(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._points(lambda t: t.fds)

    def _threads(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._points(lambda t: t.threads)

    def _gpu_memory(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._points(lambda t: t.gpu_memory)


def _safe_roots(source: Callable[[], Sequence[TreeRoot]]) -> Sequence[TreeRoot]:
    try:
        return source()
    except Exception:
        LOGGER.debug("process-tree source failed", exc_info=True)
        return ()


_LOCK: Final = threading.Lock()
_GAUGES: dict[int, ProcessTreeGauges] = {}  # keyed by id(meter); ProcessTreeGauges.meter keeps it alive


def start_process_tree_gauges(
    source: Callable[[], Sequence[TreeRoot]], *, gpu: bool = True
) -> Callable[[], None] | None:
    """Report the process trees ``source`` names to the current telemetry meter; never raises.

    Returns the call that stops reporting them, or None when telemetry is off (nothing was created).
    Instruments are created once per meter; later sources share them.
    """
    shared = STATE.instruments
    if not STATE.enabled or shared is None:
        return None
    try:
        with _LOCK:
            gauges = _GAUGES.get(id(shared.meter))
            if gauges is None or gauges.meter is not shared.meter:
                gauges = _GAUGES[id(shared.meter)] = ProcessTreeGauges(shared.meter, gpu=gpu)
        return gauges.add(source)
    except Exception as exc:
        LOGGER.warning("process-tree gauges are off: %s: %s", type(exc).__name__, str(exc)[:200])
        return None
