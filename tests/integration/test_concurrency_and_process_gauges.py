"""Issue 16 sections 3-4 on real processes: a uvicorn server process reports its resource gauges through
the file exporter, and a TimedSemaphore in front of real HTTP calls keeps the server's in-flight count at
the limit while its wait metrics show the queueing that happened before HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_obs import TimedSemaphore
from gym_obs.client.http_client import close_global_aiohttp_client, request
from gym_obs.telemetry import names
from gym_obs.telemetry.file_export import METRICS_SUFFIX
from gym_obs.telemetry.testing import Capture

pytestmark = pytest.mark.integration

PORT = 29811
_HAS_NVIDIA_SMI = shutil.which("nvidia-smi") is not None

_SERVER = textwrap.dedent(
    """
    import asyncio, contextlib, sys, time
    import uvicorn
    from fastapi import FastAPI
    from gym_obs.telemetry.resources import start_process_gauges
    from gym_obs.telemetry.setup import setup_telemetry

    handle = setup_telemetry("gauges-proc", "resources_server")
    assert handle.enabled, handle.problems
    state = {"inflight": 0, "peak": 0, "total": 0, "gauges": None}

    @contextlib.asynccontextmanager
    async def lifespan(_app):  # where a server process turns its gauges on: at startup, in its loop
        state["gauges"] = start_process_gauges(lag_interval_s=0.02)
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/slow")
    async def slow() -> dict:
        state["inflight"] += 1
        state["total"] += 1
        state["peak"] = max(state["peak"], state["inflight"])
        await asyncio.sleep(0.02)
        state["inflight"] -= 1
        return {}

    @app.get("/block")
    async def block() -> dict:
        time.sleep(0.5)  # a synchronous call on the loop: exactly what event-loop lag must expose
        return {}

    @app.get("/state")
    async def get_state() -> dict:
        return state

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", log_config=None)
    """
)


def _metrics(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """The data points of the last (final, cumulative) export of each metric in the process's file."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in directory.glob(f"*{METRICS_SUFFIX}"):
        for line in path.read_text().splitlines():
            for rm in json.loads(line).get("resourceMetrics", ()):
                for sm in rm.get("scopeMetrics", ()):
                    for metric in sm.get("metrics", ()):
                        data = metric.get("gauge") or metric.get("sum") or metric.get("histogram") or {}
                        found[metric["name"]] = data.get("dataPoints", [])
    return found


def _value(point: dict[str, Any]) -> float:
    return float(point["asDouble"]) if "asDouble" in point else float(point.get("asInt", 0))


def _attrs(point: dict[str, Any]) -> dict[str, str]:
    return {a["key"]: a["value"].get("stringValue", "") for a in point.get("attributes", ())}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            names.ENV_TELEMETRY: "1",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "file",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            names.ENV_TELEMETRY_DIR: str(tmp_path / "tele"),
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(PORT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield proc, tmp_path / "tele"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


async def _wait_ready(proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "server exited"
        try:
            resp = await request("GET", f"http://127.0.0.1:{PORT}/state", _max_connection_retries=0)
            resp.release()
            return
        except Exception:
            assert time.monotonic() < deadline, "server did not start"
            await asyncio.sleep(0.1)


async def _json(path: str) -> Any:
    resp = await request("GET", f"http://127.0.0.1:{PORT}{path}")
    try:
        resp.raise_for_status()
        return await resp.json()
    finally:
        resp.release()


async def _gated(sem: TimedSemaphore) -> None:
    async with sem:
        await _json("/slow")


async def test_semaphore_admits_at_most_limit_real_requests_and_the_server_reports_its_gauges(
    server: tuple[subprocess.Popen[bytes], Path], telemetry: Capture
) -> None:
    proc, tele = server
    try:
        await _wait_ready(proc)
        assert (await _json("/state"))["gauges"] is True

        # section 3: 60 rollouts behind a limit of 3 in front of real HTTP calls
        sem = TimedSemaphore(3, site="test.rollouts")

        async def rollout() -> None:
            async with sem:
                await _json("/slow")

        await asyncio.gather(*(rollout() for _ in range(60)))
        assert (await _json("/state"))["peak"] == 3
        (wait,) = [
            p
            for p in telemetry.metric_points(names.METRIC_CONCURRENCY_WAIT_DURATION)
            if p.attributes == {names.ATTR_CONCURRENCY_SITE: "test.rollouts"}
        ]
        assert wait.count == 60
        assert wait.max is not None and wait.max >= 0.02 * (60 // 3 - 2)  # the last ones queued behind ~19

        # waiters cancelled while queued never reach HTTP, and are counted
        gate = TimedSemaphore(2, site="test.cancel")
        queued = [asyncio.create_task(_gated(gate)) for _ in range(10)]
        await asyncio.sleep(0)  # every task runs to its first wait: 2 admitted, 8 queued
        assert gate.waiting == 8
        for task in queued[-5:]:
            task.cancel()
        results = await asyncio.gather(*queued, return_exceptions=True)
        assert sum(isinstance(r, asyncio.CancelledError) for r in results) == 5
        assert (await _json("/state"))["total"] == 60 + 5
        (cancelled,) = [
            p
            for p in telemetry.metric_points(names.METRIC_CONCURRENCY_CANCELLED_WAITS)
            if p.attributes == {names.ATTR_CONCURRENCY_SITE: "test.cancel"}
        ]
        assert cancelled.value == 5
        assert gate.active == 0

        # section 4: block the server's loop once, so its lag histogram must see it
        await _json("/block")
        await asyncio.sleep(0.6)  # a few export intervals
    finally:
        await close_global_aiohttp_client()
        proc.terminate()  # uvicorn shuts down cleanly; telemetry flushes at exit
        proc.wait(20)

    metrics = _metrics(tele)
    memory = {
        _attrs(p)[names.ATTR_MEMORY_TYPE]: _value(p) for p in metrics[names.METRIC_PROCESS_MEMORY_USAGE]
    }
    assert memory["rss"] > 20 * 1024 * 1024
    assert 0 < memory["pss"] <= memory["rss"] * 1.05
    (fds,) = metrics[names.METRIC_PROCESS_FILE_DESCRIPTORS]
    assert _value(fds) >= 4  # stdio + the listening socket at least
    (threads,) = metrics[names.METRIC_PROCESS_THREADS]
    assert _value(threads) >= 2  # the loop thread and the metric reader's thread
    cpu = {_attrs(p)[names.ATTR_CPU_MODE]: _value(p) for p in metrics[names.METRIC_PROCESS_CPU_UTILIZATION]}
    assert set(cpu) == {"user", "system"} and all(0 <= v <= 1 for v in cpu.values())
    (lag,) = metrics[names.METRIC_EVENT_LOOP_LAG]
    assert int(lag["count"]) >= 10
    assert float(lag["min"]) >= 0
    assert float(lag["max"]) >= 0.4  # the 0.5 s block
    if not _HAS_NVIDIA_SMI:
        assert names.METRIC_GPU_UTILIZATION not in metrics  # cleanly absent
        assert names.METRIC_GPU_MEMORY_USAGE not in metrics
