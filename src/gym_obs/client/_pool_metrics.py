"""Pool-wait telemetry from aiohttp's connection-queue trace signals, and the pooled-connections gauge.

State is per request: aiohttp builds one trace-config context per request through the context factory,
and that object (``_PoolTraceState``) holds the wait clock, so nothing is shared between concurrent
requests and nothing is kept per session. A request that queues more than once (a redirect, a re-connect)
records the sum of its waits once, attributed (``gym.pool.constraint``) to the limit that blocked its first
wait: ``total`` when the pool's total limit was reached, else ``per_host``. A wait that never got a
connection (timeout, cancellation) is recorded with outcome ``abandoned``, and the pending-requests
counter is decremented on every path: aiohttp sends ``on_request_exception`` to every trace that saw
``on_request_start``, cancellation included.

Opened connections (``gym.client.pool.connects``) are counted by the connector's own hook, not by a trace
signal: ``request()`` uses the traced session only when a request could queue, but every request may
open a connection. The attempt loop names the destination in :data:`CONNECT_LABEL`.

Telemetry off: the sessions ``request()`` uses then carry no trace config at all, and for sessions used
directly each callback is a single ``None`` check.

The connections gauge works over the connectors it is given: which connectors exist is ``_sessions``'
business (the one client module with state), not this module's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from types import SimpleNamespace
from typing import TYPE_CHECKING, ClassVar, Final

import aiohttp

from gym_obs.client._fair_connector import connection_counts, connections_in_use
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.logging import get_logger
from gym_obs.telemetry.metrics import AttributeCache
from gym_obs.telemetry.redaction import redact_url, scrub_headers, scrub_text

if TYPE_CHECKING:
    from gym_obs.telemetry.metrics import Instruments

__all__ = [
    "CONNECT_LABEL",
    "ConnectionsGauge",
    "connects_counter",
    "pool_trace_config",
    "request_debug_trace_config",
    "run_gauge_sync",
]

_perf_counter = time.perf_counter
_debug_log = get_logger("gym_obs.client.debug")
_MAX_CACHED_LABELS: Final = 1024

# Pending requests and opened connections: by destination and pool.
_PENDING_ATTRS: Final = AttributeCache(
    names.ATTR_SERVER_NAME, names.ATTR_POOL, max_entries=_MAX_CACHED_LABELS
)
_WAIT_ATTRS: Final = AttributeCache(
    names.ATTR_SERVER_NAME,
    names.ATTR_POOL,
    names.ATTR_POOL_OUTCOME,
    names.ATTR_POOL_CONSTRAINT,
    max_entries=_MAX_CACHED_LABELS,
)


class _PoolTraceState(SimpleNamespace):
    """One request's pool-wait state (aiohttp's per-request ``trace_config_ctx``).

    ``trace_request_ctx`` is the ``gym.server.name`` label when the request came through ``request()``.
    """

    pool: ClassVar[str] = names.POOL_DATA
    # Class-level defaults: a request that never queues writes none of them.
    queued_at: float | None = None
    constraint: str = names.POOL_CONSTRAINT_PER_HOST
    wait_s: float = 0.0
    waited: bool = False
    abandoned: bool = False
    finished: bool = False

    def __init__(self, trace_request_ctx: object = None) -> None:
        # No super().__init__(**kw): this runs once per request and only needs two attributes.
        self.trace_request_ctx = trace_request_ctx
        self.instruments: Instruments | None = STATE.instruments if STATE.enabled else None

    @property
    def server_name(self) -> str:
        ctx = self.trace_request_ctx
        return ctx if isinstance(ctx, str) else names.EXTERNAL_SERVER_NAME


class _DataPoolTraceState(_PoolTraceState):
    pool: ClassVar[str] = names.POOL_DATA


class _ControlPoolTraceState(_PoolTraceState):
    pool: ClassVar[str] = names.POOL_CONTROL


async def _on_queued_start(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceConnectionQueuedStartParams
) -> None:
    inst = getattr(ctx, "instruments", None)
    if inst is None:
        return
    assert isinstance(ctx, _PoolTraceState)
    if ctx.queued_at is None:
        ctx.queued_at = _perf_counter()
        if not ctx.waited:  # the first wait names the limit
            ctx.constraint = _blocking_limit(getattr(session, "connector", None))
        inst.pool_pending_requests.add(1, _PENDING_ATTRS.get(ctx.server_name, ctx.pool))


async def _on_queued_end(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceConnectionQueuedEndParams
) -> None:
    inst = getattr(ctx, "instruments", None)
    if inst is None:
        return
    assert isinstance(ctx, _PoolTraceState)
    _end_wait(ctx, inst)


def _blocking_limit(connector: aiohttp.BaseConnector | None) -> str:
    """Which limit a request that just queued is waiting behind: ``total`` if the connector's total
    ``limit`` is used up (slots promised to woken waiters included, as the fair gate counts them), else
    ``per_host`` (the only other reason aiohttp queues a request)."""
    if connector is not None:
        limit = connector.limit
        if limit and connections_in_use(connector) >= limit:
            return names.POOL_CONSTRAINT_TOTAL
    return names.POOL_CONSTRAINT_PER_HOST


def _end_wait(ctx: _PoolTraceState, inst: Instruments) -> bool:
    """Close an open wait (if any): add it to the request's total and release the pending count."""
    started = ctx.queued_at
    if started is None:
        return False
    ctx.queued_at = None
    ctx.wait_s += _perf_counter() - started
    ctx.waited = True
    inst.pool_pending_requests.add(-1, _PENDING_ATTRS.get(ctx.server_name, ctx.pool))
    return True


def _finish(ctx: SimpleNamespace) -> None:
    inst = getattr(ctx, "instruments", None)
    if inst is None:
        return
    assert isinstance(ctx, _PoolTraceState)
    if ctx.finished:
        return
    ctx.finished = True
    if _end_wait(ctx, inst):  # still queued when the request ended: timed out or cancelled in the queue
        ctx.abandoned = True
    if ctx.waited:
        outcome = names.POOL_OUTCOME_ABANDONED if ctx.abandoned else names.POOL_OUTCOME_OK
        inst.pool_wait_duration.record(
            ctx.wait_s, _WAIT_ATTRS.get(ctx.server_name, ctx.pool, outcome, ctx.constraint)
        )


async def _on_request_end(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestEndParams
) -> None:
    _finish(ctx)


async def _on_request_exception(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestExceptionParams
) -> None:
    _finish(ctx)


def pool_trace_config(pool: str = names.POOL_DATA) -> aiohttp.TraceConfig:
    """A TraceConfig recording pool waits for ``pool`` (``data`` or ``control``); one per session.

    Pass the ``gym.server.name`` label as ``trace_request_ctx`` (``request()`` does); anything else is
    labelled ``external``.
    """
    factory = _ControlPoolTraceState if pool == names.POOL_CONTROL else _DataPoolTraceState
    config = aiohttp.TraceConfig(trace_config_ctx_factory=factory)
    config.on_connection_queued_start.append(_on_queued_start)
    config.on_connection_queued_end.append(_on_queued_end)
    config.on_request_end.append(_on_request_end)
    config.on_request_exception.append(_on_request_exception)
    return config


# --- connections opened ---------------------------------------------------------------------------------

CONNECT_LABEL: Final[ContextVar[str | None]] = ContextVar("gym_obs_connect_label", default=None)
"""The ``gym.server.name`` label of the request being sent (set by the attempt loop while telemetry is on);
a connection opened outside ``request()`` is labelled ``external``."""


def connects_counter(pool: str) -> Callable[[], None]:
    """The connector hook for ``pool``: count one opened connection, labelled with the current request's
    destination (a flag check while telemetry is off)."""

    def count() -> None:
        inst = STATE.instruments if STATE.enabled else None
        if inst is not None:
            label = CONNECT_LABEL.get() or names.EXTERNAL_SERVER_NAME
            inst.pool_connects.add(1, _PENDING_ATTRS.get(label, pool))

    return count


# --- global_aiohttp_client_request_debug --------------------------------------------------------------


class _DebugState(SimpleNamespace):
    started: float = 0.0

    def __init__(self, trace_request_ctx: object = None) -> None:
        self.trace_request_ctx = trace_request_ctx


def _debug_fields(
    params: aiohttp.TraceRequestEndParams | aiohttp.TraceRequestExceptionParams,
) -> dict[str, object]:
    return {
        "method": params.method,
        "url": redact_url(str(params.url)),
        "request_headers": scrub_headers(dict(params.headers)),
    }


async def _debug_start(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestStartParams
) -> None:
    ctx.started = _perf_counter()


async def _debug_end(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestEndParams
) -> None:
    _debug_log.info(
        "client_request_debug",
        status=params.response.status,
        elapsed_s=round(_perf_counter() - getattr(ctx, "started", 0.0), 6),
        **_debug_fields(params),
    )


async def _debug_exception(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestExceptionParams
) -> None:
    _debug_log.info(
        "client_request_debug",
        error=f"{type(params.exception).__qualname__}: {scrub_text(str(params.exception))[:300]}",
        elapsed_s=round(_perf_counter() - getattr(ctx, "started", 0.0), 6),
        **_debug_fields(params),
    )


def request_debug_trace_config() -> aiohttp.TraceConfig:
    """``global_aiohttp_client_request_debug=True``: one log line per HTTP exchange (every attempt:
    method, redacted URL, scrubbed request headers, status or error, elapsed). Added to the sessions only
    when the flag is set, so it costs nothing otherwise."""
    config = aiohttp.TraceConfig(trace_config_ctx_factory=_DebugState)
    config.on_request_start.append(_debug_start)
    config.on_request_end.append(_debug_end)
    config.on_request_exception.append(_debug_exception)
    return config


# --- pooled connections (active / idle) ---------------------------------------------------------------


class ConnectionsGauge:
    """Keeps ``gym.client.pool.connections`` (an up-down counter) equal to the connectors' real counts.

    aiohttp signals no release or close of a pooled connection, so the counts are read from the connector
    and the difference to what was last reported is added: on every :meth:`sync` (a background task calls
    it every ``interval_s`` while telemetry is on) and on close, which brings the series back to zero.
    """

    def __init__(self) -> None:
        self._reported: dict[tuple[int, str], tuple[Instruments, int, int]] = {}
        self._lock = threading.Lock()  # loops in several threads may sync (and close) at once

    def sync(self, connector: aiohttp.BaseConnector, pool: str, *, closing: bool = False) -> None:
        with self._lock:
            self._sync(connector, pool, closing)

    def _sync(self, connector: aiohttp.BaseConnector, pool: str, closing: bool) -> None:
        key = (id(connector), pool)
        previous = self._reported.get(key)
        inst = STATE.instruments if STATE.enabled else None
        if previous is not None and previous[0] is not inst:
            # Telemetry was re-initialised: the old series belongs to the old instruments; start afresh.
            previous = None
            del self._reported[key]
        if inst is None:
            return
        active, idle = (0, 0) if closing or connector.closed else connection_counts(connector)
        last_active, last_idle = (previous[1], previous[2]) if previous is not None else (0, 0)
        counter = inst.pool_connections
        if active != last_active:
            counter.add(active - last_active, _connection_attrs(pool, names.CONNECTION_STATE_ACTIVE))
        if idle != last_idle:
            counter.add(idle - last_idle, _connection_attrs(pool, names.CONNECTION_STATE_IDLE))
        if closing:
            self._reported.pop(key, None)
        else:
            self._reported[key] = (inst, active, idle)


_CONNECTION_ATTRS: Final = AttributeCache(names.ATTR_POOL, names.ATTR_HTTP_CONNECTION_STATE)
_connection_attrs = _CONNECTION_ATTRS.get


async def run_gauge_sync(
    gauge: ConnectionsGauge, sources: list[tuple[aiohttp.BaseConnector, str]], interval_s: float = 1.0
) -> None:
    """Background task body (one per event loop): sync ``gauge`` for that loop's connectors every
    ``interval_s`` while telemetry is on. ``sources`` is read live (pools created later join it)."""
    while True:
        await asyncio.sleep(interval_s)
        if STATE.enabled:
            for connector, pool in list(sources):
                gauge.sync(connector, pool)
