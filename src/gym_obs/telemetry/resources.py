"""Opt-in gauges of the current process: memory, CPU, file descriptors, threads, event-loop lag, GPU.

Which server is eating memory, or is CPU-saturated, is a per-process question the HTTP metrics cannot
answer. Everything here is sampled off the request path: the gauges are observable instruments read by
the metric reader when it exports (in its own thread), and event-loop lag is measured by one periodic
callback of its own. ``nvidia-smi`` is never run by a reader or on the loop: a background thread runs it
with a timeout and the gauges report its cached answer; without ``nvidia-smi`` there are no GPU gauges.

Event-loop lag is a histogram, not a gauge: a gauge exports only the last sample, so a two-second stall
between two exports would vanish; the histogram keeps every sample's bucket and the maximum, which is the
signal (how late a callback that should run every ``lag_interval_s`` actually ran) that an asyncio server
is CPU-saturated or blocked by synchronous code.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import resource
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation

from gym_obs.telemetry import _procfs, names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.metrics import AttributeCache
from gym_obs.telemetry.settings import ENV_FALSE, ENV_TRUE

__all__ = ["process_gauges_requested", "start_process_gauges", "stop_process_gauges"]

LOGGER: Final = logging.getLogger("gym_obs.telemetry")
_PROC: Final = "/proc/self"
_GPU_QUERY: Final = ("--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits")
_GPU_TIMEOUT_S: Final = 5.0
_GPU_REFRESH_S: Final = 10.0
_MAX_GPUS: Final = 64
_GPU_LINE: Final = re.compile(r"\s*(\d{1,3})\s*,\s*([^,]*?)\s*,\s*([^,]*?)\s*")
# Attribute dicts built once, not on every collection.
_MEMORY_ATTRS: Final = AttributeCache(names.ATTR_MEMORY_TYPE)
_CPU_USER: Final = {names.ATTR_CPU_MODE: names.CPU_MODE_USER}
_CPU_SYSTEM: Final = {names.ATTR_CPU_MODE: names.CPU_MODE_SYSTEM}
_GPU_ATTRS: Final = AttributeCache(names.ATTR_HW_ID, max_entries=_MAX_GPUS)
_GpuSample = tuple[str, float | None, int | None]  # (hw.id, utilization ratio, memory bytes)


# --- samplers of this process (pure reads of /proc/self; None where the platform does not provide it) ---
def _rss_bytes() -> int | None:
    return _procfs.rss_bytes(_PROC)


def _pss_bytes() -> int | None:
    return _procfs.pss_bytes(_PROC)


def _fd_count() -> int | None:
    return _procfs.fd_count(_PROC, own=True)


def _thread_count() -> int:
    count = _procfs.thread_count(_PROC)
    return threading.active_count() if count is None else count


class _CpuSampler:
    """CPU time used since the previous read, divided by wall time and the CPUs this process may use.

    ``getrusage`` has microsecond resolution (``os.times`` ticks at 10 ms). A read sooner than
    ``_MIN_WINDOW_S`` after the last one (a second reader) repeats the last answer instead of dividing a
    clock tick by a tiny interval.
    """

    _MIN_WINDOW_S: Final = 0.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = self._now()
        self._answer: tuple[float, float] | None = None

    @staticmethod
    def _now() -> tuple[float, float, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return time.monotonic(), usage.ru_utime, usage.ru_stime

    def utilization(self) -> tuple[float, float] | None:
        with self._lock:
            now = self._now()
            wall0, user0, sys0 = self._last
            if now[0] - wall0 < self._MIN_WINDOW_S:
                return self._answer
            self._last = now
            capacity = (now[0] - wall0) * _procfs.cpu_count()
            self._answer = (
                min(1.0, max(0.0, (now[1] - user0) / capacity)),
                min(1.0, max(0.0, (now[2] - sys0) / capacity)),
            )
            return self._answer


# --- GPU via nvidia-smi: run in a thread with a timeout, cached ------------------------------------------
def _parse_nvidia_smi(text: str) -> list[_GpuSample]:
    """``(hw.id, utilization ratio, memory bytes)`` per GPU line of ``nvidia-smi --query-gpu`` CSV."""
    gpus: list[_GpuSample] = []
    for line in text.splitlines()[:_MAX_GPUS]:
        match = _GPU_LINE.fullmatch(line)
        if match is None:
            continue
        index, util, used_mib = match.groups()
        percent = _number(util)
        gpus.append((f"gpu{int(index)}", None if percent is None else percent / 100, _mib_bytes(used_mib)))
    return gpus


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _mib_bytes(text: str) -> int | None:
    value = _number(text)
    return None if value is None else int(value * 1024 * 1024)


def _gpu_probe(executable: str) -> _procfs.CachedCommand[_GpuSample]:
    """Caches the last ``nvidia-smi`` answer; refreshes it in a daemon thread when stale (never waits)."""
    return _procfs.CachedCommand(
        [executable, *_GPU_QUERY],
        _parse_nvidia_smi,
        refresh_s=_GPU_REFRESH_S,
        timeout_s=_GPU_TIMEOUT_S,
        thread_name="gym-obs-nvidia-smi",
    )


# --- the gauges ---------------------------------------------------------------------------------------
class _ProcessGauges:
    """The observable instruments of one meter and the lag histogram they share; built once per meter."""

    def __init__(self, meter: Meter, gpu: bool) -> None:
        self.meter = meter
        self._cpu = _CpuSampler()
        meter.create_observable_up_down_counter(
            names.METRIC_PROCESS_MEMORY_USAGE,
            callbacks=[self._memory],
            unit=names.UNIT_BYTES,
            description="Physical memory of this process: resident (rss) and proportional (pss).",
        )
        meter.create_observable_gauge(
            names.METRIC_PROCESS_CPU_UTILIZATION,
            callbacks=[self._cpu_utilization],
            unit=names.UNIT_RATIO,
            description="CPU time since the last export over wall time and the CPUs available, by mode.",
        )
        meter.create_observable_up_down_counter(
            names.METRIC_PROCESS_FILE_DESCRIPTORS,
            callbacks=[self._fds],
            unit=names.UNIT_FILE_DESCRIPTOR,
            description="Open file descriptors of this process.",
        )
        meter.create_observable_up_down_counter(
            names.METRIC_PROCESS_THREADS,
            callbacks=[self._threads],
            unit=names.UNIT_THREAD,
            description="OS threads of this process.",
        )
        self.lag: Histogram = meter.create_histogram(
            names.METRIC_EVENT_LOOP_LAG,
            unit=names.UNIT_SECONDS,
            description="How late a periodic event-loop callback ran (CPU saturation, blocking code).",
            explicit_bucket_boundaries_advisory=list(names.HISTOGRAM_BUCKETS_S[names.METRIC_EVENT_LOOP_LAG]),
        )
        executable = shutil.which("nvidia-smi") if gpu else None
        self.gpu = _gpu_probe(executable) if executable else None
        if self.gpu is not None:
            self.gpu.samples()  # start the first refresh now, so the first export has an answer
            meter.create_observable_gauge(
                names.METRIC_GPU_UTILIZATION,
                callbacks=[self._gpu_utilization],
                unit=names.UNIT_RATIO,
                description="GPU utilisation per device (nvidia-smi, cached).",
            )
            meter.create_observable_up_down_counter(
                names.METRIC_GPU_MEMORY_USAGE,
                callbacks=[self._gpu_memory],
                unit=names.UNIT_BYTES,
                description="GPU memory in use per device (nvidia-smi, cached).",
            )

    def _memory(self, _options: CallbackOptions) -> Iterable[Observation]:
        points = []
        for kind, value in ((names.MEMORY_TYPE_RSS, _rss_bytes()), (names.MEMORY_TYPE_PSS, _pss_bytes())):
            if value is not None:
                points.append(Observation(value, _MEMORY_ATTRS.get(kind)))
        return points

    def _cpu_utilization(self, _options: CallbackOptions) -> Iterable[Observation]:
        sample = self._cpu.utilization()
        if sample is None:
            return []
        user, system = sample
        return [
            Observation(user, _CPU_USER),
            Observation(system, _CPU_SYSTEM),
        ]

    def _fds(self, _options: CallbackOptions) -> Iterable[Observation]:
        count = _fd_count()
        return [] if count is None else [Observation(count)]

    def _threads(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(_thread_count())]

    def _gpu_utilization(self, _options: CallbackOptions) -> Iterable[Observation]:
        samples = self.gpu.samples() if self.gpu else []
        return [Observation(util, _GPU_ATTRS.get(hw)) for hw, util, _ in samples if util is not None]

    def _gpu_memory(self, _options: CallbackOptions) -> Iterable[Observation]:
        samples = self.gpu.samples() if self.gpu else []
        return [Observation(used, _GPU_ATTRS.get(hw)) for hw, _, used in samples if used is not None]


class _LagSampler:
    """One ``call_later`` chain on a loop: each tick records how late it ran, then schedules the next.

    It stops by itself when telemetry is switched off or the loop closes, and never touches requests.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, histogram: Histogram, interval_s: float) -> None:
        self.loop, self._histogram, self._interval = loop, histogram, interval_s
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self.stopped = False
        self._schedule()

    def _schedule(self) -> None:
        self._due = self.loop.time() + self._interval
        self._handle = self.loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        if self.stopped or not STATE.enabled:
            self.stop()
            return
        try:
            self._histogram.record(max(0.0, self.loop.time() - self._due))
        except Exception:  # telemetry never stops the program
            LOGGER.debug("event-loop lag sample dropped", exc_info=True)
        self._schedule()

    def stop(self) -> None:
        self.stopped = True
        if self._handle is not None:
            self._handle.cancel()


_LOCK: Final = threading.Lock()
_GAUGES: dict[int, _ProcessGauges] = {}  # keyed by id(meter); _ProcessGauges.meter keeps it alive
_LAG: dict[int, _LagSampler] = {}  # keyed by id(loop)


def process_gauges_requested(explicit: bool | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether this process should report its gauges: ``explicit`` (config) beats ``GYM_OBS_PROCESS_GAUGES``,
    which beats the default (off). A value that is not a boolean is logged and counts as off."""
    if explicit is not None:
        return explicit
    raw = (os.environ if env is None else env).get(names.ENV_PROCESS_GAUGES, "")
    value = raw.strip().lower()
    if value in ENV_TRUE:
        return True
    if value not in ENV_FALSE:
        LOGGER.warning(
            "%s=%r is not a boolean (use 1 or 0); process gauges stay off", names.ENV_PROCESS_GAUGES, raw[:40]
        )
    return False


def start_process_gauges(*, lag_interval_s: float = 0.5, gpu: bool = True) -> bool:
    """Report this process's resource gauges to the current telemetry meter. Idempotent; never raises.

    Call it once at server startup, inside the running event loop (to also measure event-loop lag).
    Returns True when the gauges are registered (telemetry on), False otherwise.
    """
    try:
        return _start(lag_interval_s, gpu)
    except Exception as exc:  # telemetry must never stop the program
        LOGGER.warning("process gauges are off: %s: %s", type(exc).__name__, str(exc)[:200])
        return False


def _start(lag_interval_s: float, gpu: bool) -> bool:
    shared = STATE.instruments
    if not STATE.enabled or shared is None:
        return False
    if not lag_interval_s > 0:
        raise ValueError(f"lag_interval_s must be > 0, got {lag_interval_s!r}")
    meter = shared.meter
    with _LOCK:
        gauges = _GAUGES.get(id(meter))
        if gauges is None or gauges.meter is not meter:
            gauges = _GAUGES[id(meter)] = _ProcessGauges(meter, gpu)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return True  # no loop in this thread: every gauge but the lag
        for key in [key for key, old in _LAG.items() if old.stopped or old.loop.is_closed()]:
            del _LAG[key]
        sampler = _LAG.get(id(loop))
        if sampler is None or sampler.stopped or sampler.loop is not loop:
            _LAG[id(loop)] = _LagSampler(loop, gauges.lag, lag_interval_s)
    return True


def stop_process_gauges() -> None:
    """Stop the event-loop lag samplers (the observable gauges go with their meter provider)."""
    with _LOCK:
        for sampler in _LAG.values():
            sampler.stop()
        _LAG.clear()
