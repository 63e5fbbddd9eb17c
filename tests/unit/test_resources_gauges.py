"""Process gauges in this process, read back from the in-memory capture: sane values that move."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from typing import Any

import pytest

from gym_obs.telemetry import names, resources
from gym_obs.telemetry.testing import Capture, MetricPoint, capture_telemetry


def _values(capture: Capture, metric: str) -> dict[frozenset[tuple[str, Any]], MetricPoint]:
    return {frozenset(p.attributes.items()): p for p in capture.metric_points(metric)}


def _single(capture: Capture, metric: str, **attributes: str) -> float:
    point = _values(capture, metric).get(frozenset(attributes.items()))
    assert point is not None and point.value is not None, (metric, attributes)
    return point.value


def test_off_telemetry_starts_nothing() -> None:
    assert resources.start_process_gauges() is False


def test_bad_interval_is_reported_not_raised(telemetry: Capture) -> None:
    assert resources.start_process_gauges(lag_interval_s=0) is False
    assert resources.start_process_gauges(lag_interval_s=float("nan")) is False


def test_memory_fds_and_threads_are_sane_and_move(telemetry: Capture) -> None:
    assert resources.start_process_gauges() is True
    assert resources.start_process_gauges() is True  # idempotent
    rss = _single(telemetry, names.METRIC_PROCESS_MEMORY_USAGE, **{names.ATTR_MEMORY_TYPE: "rss"})
    pss = _single(telemetry, names.METRIC_PROCESS_MEMORY_USAGE, **{names.ATTR_MEMORY_TYPE: "pss"})
    assert rss > 10 * 1024 * 1024  # a Python process with the OTel SDK loaded
    assert 0 < pss <= rss * 1.05
    assert set(_values(telemetry, names.METRIC_PROCESS_MEMORY_USAGE)) == {
        frozenset({(names.ATTR_MEMORY_TYPE, "rss")}),
        frozenset({(names.ATTR_MEMORY_TYPE, "pss")}),
    }
    assert telemetry.metric_unit(names.METRIC_PROCESS_MEMORY_USAGE) == names.UNIT_BYTES

    fds = _single(telemetry, names.METRIC_PROCESS_FILE_DESCRIPTORS)
    assert fds >= 3
    files = [tempfile.TemporaryFile() for _ in range(20)]  # noqa: SIM115 - held open on purpose
    try:
        assert _single(telemetry, names.METRIC_PROCESS_FILE_DESCRIPTORS) >= fds + 20
    finally:
        for f in files:
            f.close()

    threads = _single(telemetry, names.METRIC_PROCESS_THREADS)
    assert threads >= 1
    stop = threading.Event()
    extra = [threading.Thread(target=stop.wait) for _ in range(5)]
    for t in extra:
        t.start()
    try:
        assert _single(telemetry, names.METRIC_PROCESS_THREADS) >= threads + 5
    finally:
        stop.set()
        for t in extra:
            t.join()


def test_cpu_utilization_by_mode(telemetry: Capture) -> None:
    resources.start_process_gauges()
    telemetry.collect()  # the next reading covers only the burn below
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    user = _single(telemetry, names.METRIC_PROCESS_CPU_UTILIZATION, **{names.ATTR_CPU_MODE: "user"})
    system = _single(telemetry, names.METRIC_PROCESS_CPU_UTILIZATION, **{names.ATTR_CPU_MODE: "system"})
    assert 0 < user <= 1.5
    assert 0 <= system <= 1.5
    assert telemetry.metric_unit(names.METRIC_PROCESS_CPU_UTILIZATION) == names.UNIT_RATIO


async def test_event_loop_lag_grows_when_the_loop_is_blocked() -> None:
    with capture_telemetry() as capture:
        assert resources.start_process_gauges(lag_interval_s=0.02) is True
        await asyncio.sleep(0.2)
        calm = capture.metric_points(names.METRIC_EVENT_LOOP_LAG)
        assert len(calm) == 1 and calm[0].count >= 2
        assert calm[0].min is not None and calm[0].min >= 0
        assert calm[0].explicit_bounds == names.HISTOGRAM_BUCKETS_S[names.METRIC_EVENT_LOOP_LAG]
        capture.clear()
        time.sleep(0.4)  # noqa: ASYNC251 - blocking the loop is the point
        await asyncio.sleep(0.1)
        (blocked,) = capture.metric_points(names.METRIC_EVENT_LOOP_LAG)
        assert blocked.max is not None and blocked.max >= 0.3
        assert blocked.attributes == {}
    # telemetry is off now: the sampler stops at its next tick instead of running forever
    await asyncio.sleep(0.1)
    assert all(sampler.stopped for sampler in resources._LAG.values())
    resources.stop_process_gauges()


async def test_lag_sampler_is_started_once_per_loop(telemetry: Capture) -> None:
    for _ in range(3):
        assert resources.start_process_gauges(lag_interval_s=0.05) is True
    live = [s for s in resources._LAG.values() if s.loop is asyncio.get_running_loop() and not s.stopped]
    assert len(live) == 1
    resources.stop_process_gauges()
    assert not resources._LAG


def test_no_loop_still_registers_the_gauges(telemetry: Capture) -> None:
    assert resources.start_process_gauges() is True
    assert names.METRIC_PROCESS_THREADS in telemetry.metric_names()


def test_gpu_gauges_absent_without_nvidia_smi(telemetry: Capture) -> None:
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in os.get_exec_path()):
        return  # a GPU host: covered by test_resources_gpu.py with a stand-in instead
    resources.start_process_gauges()
    metrics = telemetry.metric_names()
    assert names.METRIC_GPU_UTILIZATION not in metrics
    assert names.METRIC_GPU_MEMORY_USAGE not in metrics


@pytest.mark.parametrize(
    ("explicit", "env", "expected"),
    [
        (None, {}, False),
        (None, {names.ENV_PROCESS_GAUGES: "1"}, True),
        (None, {names.ENV_PROCESS_GAUGES: " On "}, True),
        (None, {names.ENV_PROCESS_GAUGES: "0"}, False),
        (False, {names.ENV_PROCESS_GAUGES: "1"}, False),  # explicit config beats the environment
        (True, {}, True),
    ],
)
def test_opt_in_switch(explicit: bool | None, env: dict[str, str], expected: bool) -> None:
    assert resources.process_gauges_requested(explicit, env) is expected


def test_opt_in_switch_rejects_junk(caplog: pytest.LogCaptureFixture) -> None:
    assert resources.process_gauges_requested(None, {names.ENV_PROCESS_GAUGES: "maybe"}) is False
    assert names.ENV_PROCESS_GAUGES in caplog.text
