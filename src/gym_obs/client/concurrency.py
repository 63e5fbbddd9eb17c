"""TimedSemaphore: admission control that shows where work queues before it ever reaches HTTP.

A rollout that waits for an in-flight slot is invisible to HTTP metrics; this semaphore records how long
each admission waited (``gym.concurrency.wait.duration``), how many permits are in use and what the limit
is (observable gauges, read at export time, so toggling telemetry can never make them drift), and how many
waiters gave up (were cancelled) while queued, all by ``gym.concurrency.site``.

Why not ``asyncio.Semaphore``: it is not strictly FIFO (a task arriving while a permit is being handed to a
woken waiter can take it first). Here a released permit is handed directly to the oldest waiter, and a
waiter cancelled just as it was handed a permit passes that permit on to the next one, so permits are
never lost or duplicated. With telemetry off an acquire costs one flag check beyond the semaphore itself.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import Final

from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, Observation

from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE

__all__ = ["TimedSemaphore"]

_SITE_RE: Final = re.compile(names.CONCURRENCY_SITE_PATTERN)
_perf_counter = time.perf_counter

# Every live semaphore, read by the observable gauges' callbacks (at export time, off the request path).
_LIVE: weakref.WeakSet[TimedSemaphore] = weakref.WeakSet()
_LIVE_LOCK: Final = threading.Lock()


class _Instruments:
    """The semaphore instruments of one meter; built once per meter by :func:`_instruments_for`."""

    __slots__ = ("cancelled", "meter", "wait_duration")

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.wait_duration: Histogram = meter.create_histogram(
            names.METRIC_CONCURRENCY_WAIT_DURATION,
            unit=names.UNIT_SECONDS,
            description="Time an admission waited for a permit of a TimedSemaphore.",
            explicit_bucket_boundaries_advisory=list(
                names.HISTOGRAM_BUCKETS_S[names.METRIC_CONCURRENCY_WAIT_DURATION]
            ),
        )
        self.cancelled: Counter = meter.create_counter(
            names.METRIC_CONCURRENCY_CANCELLED_WAITS,
            unit=names.UNIT_WAIT,
            description="Waiters cancelled while queued for a permit (they were never admitted).",
        )
        meter.create_observable_up_down_counter(
            names.METRIC_CONCURRENCY_ACTIVE,
            callbacks=[_observe_active],
            unit=names.UNIT_PERMIT,
            description="Permits of TimedSemaphores currently held.",
        )
        meter.create_observable_up_down_counter(
            names.METRIC_CONCURRENCY_LIMIT,
            callbacks=[_observe_limit],
            unit=names.UNIT_PERMIT,
            description="Configured permits of TimedSemaphores.",
        )


_LOCK: Final = threading.Lock()
_CACHE: dict[int, _Instruments] = {}  # keyed by id(meter); _Instruments.meter keeps the meter alive


def _instruments_for(meter: Meter) -> _Instruments:
    cached = _CACHE.get(id(meter))
    if cached is not None and cached.meter is meter:
        return cached
    with _LOCK:
        cached = _CACHE.get(id(meter))
        if cached is None or cached.meter is not meter:
            cached = _CACHE[id(meter)] = _Instruments(meter)
        return cached


def _by_site(value_of: str) -> Iterable[Observation]:
    totals: dict[str, int] = {}
    with _LIVE_LOCK:  # the reader's thread iterates while the loop's thread may add a semaphore
        live = list(_LIVE)
    for sem in live:
        totals[sem.site] = totals.get(sem.site, 0) + getattr(sem, value_of)
    return [Observation(total, {names.ATTR_CONCURRENCY_SITE: site}) for site, total in totals.items()]


def _observe_active(_options: CallbackOptions) -> Iterable[Observation]:
    return _by_site("active")


def _observe_limit(_options: CallbackOptions) -> Iterable[Observation]:
    return _by_site("limit")


def _validated(limit: int, site: str) -> tuple[int, str]:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"TimedSemaphore limit must be a positive int, got {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"TimedSemaphore limit must be a positive int, got {limit}")
    if not isinstance(site, str):
        raise TypeError(f"TimedSemaphore site must be a str, got {type(site).__name__}")
    if _SITE_RE.fullmatch(site) is None:
        shown = site if len(site) <= 60 else site[:60] + "..."
        raise ValueError(
            f"TimedSemaphore site must be a short code-chosen identifier matching "
            f"{names.CONCURRENCY_SITE_PATTERN!r} (it is a metric label: never an id, URL or message), "
            f"got {shown!r}"
        )
    return limit, site


class TimedSemaphore:
    """An asyncio semaphore for admission control, with FIFO hand-off and wait metrics by ``site``.

    ``site`` names the place in code that limits concurrency (``"harness.rollouts"``); it becomes the
    ``gym.concurrency.site`` label, so it must be a short fixed identifier. Use ``async with sem:`` or
    ``await sem.acquire()`` / ``sem.release()``. Bound to the event loop that first waits on it.
    """

    __slots__ = ("__weakref__", "_attrs", "_free", "_inst", "_limit", "_site", "_waiters")

    def __init__(self, limit: int, *, site: str) -> None:
        self._limit, self._site = _validated(limit, site)
        self._free = self._limit
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._attrs = {names.ATTR_CONCURRENCY_SITE: self._site}
        self._inst: _Instruments | None = None
        with _LIVE_LOCK:
            _LIVE.add(self)
        if STATE.enabled:
            self._instruments()

    @property
    def site(self) -> str:
        return self._site

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def active(self) -> int:
        """Permits currently held (including ones handed to a waiter that has not resumed yet)."""
        return self._limit - self._free

    @property
    def waiting(self) -> int:
        """Tasks queued for a permit."""
        return len(self._waiters)

    def locked(self) -> bool:
        """True when an ``acquire()`` now would have to wait."""
        return self._free == 0 or bool(self._waiters)

    def __repr__(self) -> str:
        return (
            f"<TimedSemaphore site={self._site!r} limit={self._limit} active={self.active} "
            f"waiting={self.waiting}>"
        )

    def _instruments(self) -> _Instruments | None:
        shared = STATE.instruments
        if shared is None:
            return None
        inst = self._inst
        if inst is None or inst.meter is not shared.meter:
            inst = self._inst = _instruments_for(shared.meter)
        return inst

    async def acquire(self) -> None:
        """Wait for a permit, in arrival order. Cancelling the wait never loses or leaks a permit."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            if STATE.enabled:
                inst = self._instruments()
                if inst is not None:
                    inst.wait_duration.record(0.0, self._attrs)
            return
        started = _perf_counter()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # Handed a permit by release() just as we were cancelled: pass it on, never drop it.
                self._hand_off()
            elif fut in self._waiters:  # a release() may already have skipped (popped) it
                self._waiters.remove(fut)
            if STATE.enabled:
                inst = self._instruments()
                if inst is not None:
                    inst.cancelled.add(1, self._attrs)
            raise
        if STATE.enabled:
            inst = self._instruments()
            if inst is not None:
                inst.wait_duration.record(_perf_counter() - started, self._attrs)

    def release(self) -> None:
        """Return a permit: it goes straight to the oldest waiter, else back to the free count."""
        if self._free >= self._limit:
            raise ValueError(f"TimedSemaphore {self._site!r} released more times than acquired")
        self._hand_off()

    def _hand_off(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
