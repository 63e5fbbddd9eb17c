"""Pool-wait bookkeeping driven through aiohttp's real TraceConfig signals (no network)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp
import pytest
from yarl import URL

from gym_obs.client import pool_trace_config
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture, MetricPoint

_URL = URL("http://127.0.0.1:22001/x")


def _points(capture: Capture, metric: str) -> list[MetricPoint]:
    return capture.metric_points(metric)


async def _queue(config: aiohttp.TraceConfig, ctx: SimpleNamespace, wait_s: float) -> None:
    await config.on_connection_queued_start.send(None, ctx, aiohttp.TraceConnectionQueuedStartParams())
    await asyncio.sleep(wait_s)
    await config.on_connection_queued_end.send(None, ctx, aiohttp.TraceConnectionQueuedEndParams())


async def test_repeated_waits_of_one_request_are_summed_into_one_point(telemetry: Capture) -> None:
    config = pool_trace_config("control")
    config.freeze()
    ctx = config.trace_config_ctx(trace_request_ctx="model")
    await _queue(config, ctx, 0.02)
    await _queue(config, ctx, 0.03)
    await config.on_request_end.send(
        None, ctx, aiohttp.TraceRequestEndParams("GET", _URL, None, None)  # type: ignore[arg-type]
    )
    # A second terminal signal (never sent by aiohttp, but harmless) does not record again.
    await config.on_request_exception.send(
        None, ctx, aiohttp.TraceRequestExceptionParams("GET", _URL, None, RuntimeError())  # type: ignore[arg-type]
    )
    (point,) = _points(telemetry, names.METRIC_POOL_WAIT_DURATION)
    assert point.count == 1
    assert point.sum == pytest.approx(0.05, abs=0.03)
    assert point.attributes == {
        names.ATTR_SERVER_NAME: "model",
        names.ATTR_POOL: "control",
        names.ATTR_POOL_OUTCOME: "ok",
        names.ATTR_POOL_CONSTRAINT: "per_host",  # no session to read limits from: the default
    }
    assert sum(p.value or 0 for p in _points(telemetry, names.METRIC_POOL_PENDING_REQUESTS)) == 0


async def test_a_request_that_ends_while_queued_is_abandoned(telemetry: Capture) -> None:
    config = pool_trace_config("data")
    config.freeze()
    ctx = config.trace_config_ctx()  # a direct session user: no server name
    await config.on_connection_queued_start.send(None, ctx, aiohttp.TraceConnectionQueuedStartParams())
    pending = _points(telemetry, names.METRIC_POOL_PENDING_REQUESTS)
    assert sum(p.value or 0 for p in pending) == 1
    await config.on_request_exception.send(
        None, ctx, aiohttp.TraceRequestExceptionParams("GET", _URL, None, asyncio.CancelledError())  # type: ignore[arg-type]
    )
    (point,) = _points(telemetry, names.METRIC_POOL_WAIT_DURATION)
    assert point.attributes[names.ATTR_POOL_OUTCOME] == "abandoned"
    assert point.attributes[names.ATTR_SERVER_NAME] == "external"
    assert sum(p.value or 0 for p in _points(telemetry, names.METRIC_POOL_PENDING_REQUESTS)) == 0


async def test_a_request_that_never_queued_records_no_wait(telemetry: Capture) -> None:
    config = pool_trace_config()
    config.freeze()
    ctx = config.trace_config_ctx(trace_request_ctx="model")
    await config.on_request_end.send(
        None, ctx, aiohttp.TraceRequestEndParams("GET", _URL, None, None)  # type: ignore[arg-type]
    )
    assert _points(telemetry, names.METRIC_POOL_WAIT_DURATION) == []


async def test_callbacks_do_nothing_when_telemetry_is_off() -> None:
    config = pool_trace_config()
    config.freeze()
    ctx = config.trace_config_ctx(trace_request_ctx="model")
    assert ctx.instruments is None  # the per-request flag check
    await _queue(config, ctx, 0)
    assert ctx.queued_at is None and not ctx.waited
