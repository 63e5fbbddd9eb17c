"""TimedSemaphore telemetry, read back from the in-memory capture: waits, active, limit and cancellations."""

from __future__ import annotations

import asyncio

from gym_obs.client.concurrency import TimedSemaphore
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture, MetricPoint, capture_telemetry


def _for_site(capture: Capture, metric: str, site: str) -> MetricPoint | None:
    points = [p for p in capture.metric_points(metric) if p.attributes == {names.ATTR_CONCURRENCY_SITE: site}]
    assert len(points) <= 1
    return points[0] if points else None


async def test_under_load_every_admission_and_cancellation_is_counted(telemetry: Capture) -> None:
    limit, tasks_n, cancelled_n = 4, 400, 25
    sem = TimedSemaphore(limit, site="load.test")
    gate = asyncio.Event()
    inside = 0
    peak = 0

    async def work() -> None:
        nonlocal inside, peak
        async with sem:
            inside += 1
            peak = max(peak, inside)
            await gate.wait()
            await asyncio.sleep(0)
            inside -= 1

    tasks = [asyncio.create_task(work()) for _ in range(tasks_n)]
    await asyncio.sleep(0)
    assert sem.waiting == tasks_n - limit
    # while the first holders hold, the gauges show the limit fully in use
    active = _for_site(telemetry, names.METRIC_CONCURRENCY_ACTIVE, "load.test")
    assert active is not None and active.value == limit
    limit_point = _for_site(telemetry, names.METRIC_CONCURRENCY_LIMIT, "load.test")
    assert limit_point is not None and limit_point.value == limit
    for task in tasks[-cancelled_n:]:  # the last arrivals give up while queued
        task.cancel()
    await asyncio.sleep(0.05)  # the queued waits accumulate real time before the gate opens
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) == cancelled_n
    assert peak == limit

    wait = _for_site(telemetry, names.METRIC_CONCURRENCY_WAIT_DURATION, "load.test")
    assert wait is not None
    assert wait.count == tasks_n - cancelled_n
    assert wait.explicit_bounds == names.HISTOGRAM_BUCKETS_S[names.METRIC_CONCURRENCY_WAIT_DURATION]
    assert wait.min == 0.0  # the first `limit` were admitted at once
    assert wait.max is not None and wait.max >= 0.05
    assert telemetry.metric_unit(names.METRIC_CONCURRENCY_WAIT_DURATION) == names.UNIT_SECONDS
    cancelled = _for_site(telemetry, names.METRIC_CONCURRENCY_CANCELLED_WAITS, "load.test")
    assert cancelled is not None and cancelled.value == cancelled_n
    active = _for_site(telemetry, names.METRIC_CONCURRENCY_ACTIVE, "load.test")
    assert active is not None and active.value == 0


async def test_sites_are_reported_separately_and_shared_sites_add_up(telemetry: Capture) -> None:
    a1, a2, b = (
        TimedSemaphore(2, site="site.a"),
        TimedSemaphore(3, site="site.a"),
        TimedSemaphore(5, site="site.b"),
    )
    await a1.acquire()
    await b.acquire()
    await b.acquire()
    limits = {
        site: _for_site(telemetry, names.METRIC_CONCURRENCY_LIMIT, site) for site in ("site.a", "site.b")
    }
    assert {site: p.value for site, p in limits.items() if p is not None} == {"site.a": 5, "site.b": 5}
    actives = {
        site: _for_site(telemetry, names.METRIC_CONCURRENCY_ACTIVE, site) for site in ("site.a", "site.b")
    }
    assert {site: p.value for site, p in actives.items() if p is not None} == {"site.a": 1, "site.b": 2}
    for sem in (a1, b, b):
        sem.release()
    assert a2.active == 0


async def test_a_waiter_handed_a_permit_then_cancelled_counts_as_cancelled(telemetry: Capture) -> None:
    sem = TimedSemaphore(1, site="handoff.metric")
    await sem.acquire()
    doomed = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    sem.release()
    doomed.cancel()
    await asyncio.gather(doomed, return_exceptions=True)
    cancelled = _for_site(telemetry, names.METRIC_CONCURRENCY_CANCELLED_WAITS, "handoff.metric")
    assert cancelled is not None and cancelled.value == 1
    wait = _for_site(telemetry, names.METRIC_CONCURRENCY_WAIT_DURATION, "handoff.metric")
    assert wait is not None and wait.count == 1  # only the first, immediate admission


async def test_off_means_off_no_instruments_and_no_points() -> None:
    sem = TimedSemaphore(1, site="off.site")
    await sem.acquire()
    waiter = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    sem.release()
    async with sem:
        pass
    assert sem._inst is None  # no instrument was even looked up while telemetry was off
    with capture_telemetry() as capture:
        assert _for_site(capture, names.METRIC_CONCURRENCY_WAIT_DURATION, "off.site") is None
        assert _for_site(capture, names.METRIC_CONCURRENCY_CANCELLED_WAITS, "off.site") is None


async def test_telemetry_switched_on_after_creation_is_picked_up() -> None:
    sem = TimedSemaphore(2, site="late.on")
    await sem.acquire()  # off: not recorded
    with capture_telemetry() as capture:
        await sem.acquire()
        wait = _for_site(capture, names.METRIC_CONCURRENCY_WAIT_DURATION, "late.on")
        assert wait is not None and wait.count == 1
        active = _for_site(capture, names.METRIC_CONCURRENCY_ACTIVE, "late.on")
        assert active is not None and active.value == 2  # observed, so it cannot drift across the switch
    sem.release()
    sem.release()
