"""Client process state, all of it: the pool config, the per-loop sessions and the connector list.

This is the only client module with state; every other client module gets what it needs from here as an
argument or a return value.

The process-wide data and control ``ClientSession``s are one set per event loop, closed on that loop.

A session belongs to the loop it was created on (its connector's sockets and timers live there), so the
registry is keyed by loop: a second loop (another thread, a later ``asyncio.run``) gets its own sessions
instead of a session that would fail with "attached to a different loop".

Each pool is one ``TCPConnector`` shared by two sessions: a plain one (no trace config: what ``request()``
uses while telemetry is off, so "off" costs aiohttp nothing) and a traced one carrying the pool-wait
trace config. Both see the same connections and the same limits. Every live connector is in one list
that the connections gauge reads (:func:`sync_pool_connections`, and a background task per loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

import aiohttp

from gym_obs.client._fair_connector import FairTCPConnector, connections_in_use
from gym_obs.client._pool_metrics import (
    ConnectionsGauge,
    connects_counter,
    pool_trace_config,
    request_debug_trace_config,
    run_gauge_sync,
)
from gym_obs.client.pool import CapacityReport, PoolName, capacity_report, make_connector
from gym_obs.config import GlobalAIOHTTPAsyncClientConfig
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.logging import get_logger

__all__ = [
    "GAUGE_SYNC_INTERVAL_S",
    "MAX_RESPONSE_FIELD_BYTES",
    "Pool",
    "close_global_aiohttp_client",
    "configure",
    "configure_global_aiohttp_client",
    "current_config",
    "default_server_client",
    "get_global_aiohttp_client",
    "get_global_aiohttp_control_client",
    "is_global_aiohttp_client_request_debug_enabled",
    "is_global_aiohttp_client_setup",
    "pool_for",
    "set_global_aiohttp_client",
    "sync_pool_connections",
]

_T = TypeVar("_T")

_log = get_logger("gym_obs.client")

GAUGE_SYNC_INTERVAL_S = 1.0

MAX_RESPONSE_FIELD_BYTES = 64 * 1024
"""Longest reply header line the sessions read (aiohttp's default is 8190). A peer that sends a longer
failure header than gym_obs ever emits must not cost the caller the real status and body: the header is read
(bounded) and then refused as an invalid report. Longer still, the reply head is unreadable
(``ResponseHeadError``)."""


@dataclass(slots=True)
class Pool:
    """One pool of one loop: its connector and the plain and traced sessions over it."""

    name: PoolName
    connector: aiohttp.TCPConnector
    plain: aiohttp.ClientSession
    traced: aiohttp.ClientSession
    # Fewest connections in use at which a new request may have to queue (0: the pool never queues).
    wait_threshold: int = 0

    def __post_init__(self) -> None:
        limits = [n for n in (self.connector.limit, self.connector.limit_per_host) if n > 0]
        self.wait_threshold = min(limits) if limits else 0

    def for_attempt(self) -> aiohttp.ClientSession:
        """The session for one attempt while telemetry is on: the traced one only when the pool could
        make this request wait.

        aiohttp's trace signals cost every request, but only a request that finds at least
        ``min(limit, limit_per_host)`` connections in use can queue (the per-host count never exceeds
        the total). Below that the plain session is used, with nothing to measure lost: the acquisition
        happens without suspending after this check, so no other request can take the last slot between.
        """
        threshold = self.wait_threshold
        if threshold and connections_in_use(self.connector) >= threshold:
            return self.traced
        return self.plain

    async def close(self) -> None:
        _forget_connector(self.connector, self.name)
        await self.plain.close()
        await self.traced.close()
        await self.connector.close()


@dataclass(slots=True)
class _LoopSessions:
    loop: asyncio.AbstractEventLoop
    data: Pool | None = None
    control: Pool | None = None
    gauge_task: asyncio.Task[None] | None = None
    pools: list[Pool] = field(default_factory=list)
    sources: list[tuple[aiohttp.BaseConnector, str]] = field(default_factory=list)


_lock = threading.Lock()
_config: GlobalAIOHTTPAsyncClientConfig | None = None
_workers: int | None = None
_reported = False
_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopSessions] = weakref.WeakKeyDictionary()
# The last loop's sessions: one identity check on the hot path instead of a dictionary lookup.
_current: _LoopSessions | None = None
# The connections gauge, over the connector list: each loop's ``_LoopSessions.sources`` (its own task
# syncs them; sync_pool_connections() syncs every loop's).
_GAUGE: Final = ConnectionsGauge()
# The ServerClient get_server_url() loads once per process (typed by its caller: servers.py is above).
_server_client: object = None
_server_client_lock = threading.Lock()  # held while loading (blocking): not the sessions' lock


def _forget_connector(connector: aiohttp.BaseConnector, pool: str) -> None:
    """Report ``connector`` as gone: its series drop to zero."""
    _GAUGE.sync(connector, pool, closing=True)


def sync_pool_connections() -> None:
    """Bring ``gym.client.pool.connections`` up to date with every live pool's connector now."""
    with _lock:
        sources = [source for sessions in _by_loop.values() for source in sessions.sources]
    for connector, pool in sources:
        _GAUGE.sync(connector, pool)


def default_server_client(load: Callable[[], _T]) -> _T:
    """The process's default ServerClient, loaded once by ``load`` (blocking) on first use."""
    global _server_client
    with _server_client_lock:
        if _server_client is None:
            _server_client = load()
        return _server_client  # type: ignore[return-value]


def configure(cfg: GlobalAIOHTTPAsyncClientConfig, workers: int | None = None) -> CapacityReport:
    """Set the config used for sessions created from now on; log and return the capacity report."""
    global _config, _workers, _reported
    with _lock:
        _config, _workers, _reported = cfg, workers, False
    report = _log_capacity_once()
    return report if report is not None else capacity_report(cfg, workers)


def current_config() -> GlobalAIOHTTPAsyncClientConfig:
    return _config if _config is not None else GlobalAIOHTTPAsyncClientConfig()


def _log_capacity_once() -> CapacityReport | None:
    """The start-up capacity report: once per configuration (at configure time or first pool use)."""
    global _reported
    with _lock:
        if _reported:
            return None
        _reported = True
    report = capacity_report(current_config(), _workers)
    _log.info("client_capacity", report=report.line)
    for warning in report.warnings:
        _log.warning("client_capacity_warning", warning=warning)
    return report


def _loop_sessions(create: bool) -> _LoopSessions | None:
    global _current
    loop = asyncio.get_running_loop()
    current = _current
    if current is not None and current.loop is loop:
        return current
    with _lock:
        found = _by_loop.get(loop)
        if found is None and create:
            found = _by_loop[loop] = _LoopSessions(loop)
        if found is not None:
            _current = found
    return found


def _make_pool(name: PoolName) -> Pool:
    cfg = current_config()
    _log_capacity_once()
    connector = make_connector(cfg, name, workers=_workers)
    if isinstance(connector, FairTCPConnector):
        connector.on_connection_created = connects_counter(name)
    timeout = (
        aiohttp.ClientTimeout(total=cfg.global_aiohttp_control_timeout_seconds)
        if name == names.POOL_CONTROL
        else aiohttp.ClientTimeout()
    )

    def session(trace_configs: list[aiohttp.TraceConfig] | None) -> aiohttp.ClientSession:
        s = aiohttp.ClientSession(
            connector=connector,
            connector_owner=False,
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=trace_configs,
            max_line_size=MAX_RESPONSE_FIELD_BYTES,
            max_field_size=MAX_RESPONSE_FIELD_BYTES,
        )
        # aiohttp silently re-sends idempotent requests (PUT/DELETE too) once after a dropped persistent
        # connection. request() owns retries: it must count them, trace them and never replay a request
        # whose upload completed when the caller said so. aiohttp has no public switch for this: the
        # private attribute is set here, and only here.
        if hasattr(s, "_retry_connection"):
            s._retry_connection = False
        return s

    debug = [request_debug_trace_config()] if cfg.global_aiohttp_client_request_debug else []
    return Pool(name, connector, session(debug or None), session([*debug, pool_trace_config(name)]))


def pool_for(control: bool) -> Pool:
    """The current loop's data or control pool, created on first use."""
    sessions = _current
    if sessions is None or sessions.loop is not asyncio.get_running_loop():
        sessions = _loop_sessions(create=True)
        assert sessions is not None
    pool = sessions.control if control else sessions.data
    if pool is None:
        pool = _make_pool(names.POOL_CONTROL if control else names.POOL_DATA)
        if control:
            sessions.control = pool
        else:
            sessions.data = pool
        sessions.pools.append(pool)
        sessions.sources.append((pool.connector, pool.name))
        if sessions.gauge_task is None:
            sessions.gauge_task = sessions.loop.create_task(
                run_gauge_sync(_GAUGE, sessions.sources, GAUGE_SYNC_INTERVAL_S),
                name="gym_obs.pool_gauge_sync",
            )
    return pool


def _session_for(control: bool) -> aiohttp.ClientSession:
    """The session direct callers should use now: traced while telemetry is on, plain while it is off."""
    pool = pool_for(control)
    return pool.traced if STATE.enabled else pool.plain


def _is_setup() -> bool:
    """True when the running loop (or, outside a loop, any live loop) has an open data session."""
    try:
        sessions = _loop_sessions(create=False)
    except RuntimeError:
        with _lock:
            candidates = list(_by_loop.values())
        return any(s.data is not None and not s.loop.is_closed() for s in candidates)
    return sessions is not None and sessions.data is not None


async def _close_loop_sessions() -> None:
    """Close the running loop's sessions (on this loop, as aiohttp requires)."""
    global _current
    loop = asyncio.get_running_loop()
    with _lock:
        sessions = _by_loop.pop(loop, None)
        if _current is not None and _current.loop is loop:
            _current = None
    if sessions is None:
        return
    await _close(sessions)


async def _close(sessions: _LoopSessions) -> None:
    task = sessions.gauge_task
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for pool in sessions.pools:
        await pool.close()


def _forget_dead_loops() -> None:
    """Drop the sessions of loops that have been closed: they can never be used or closed again (aiohttp
    needs their loop), and keeping them would keep their connectors in the connections gauge."""
    global _current
    with _lock:
        dead = [(loop, s) for loop, s in _by_loop.items() if loop.is_closed()]
        for loop, _ in dead:
            _by_loop.pop(loop, None)
        if _current is not None and _current.loop.is_closed():
            _current = None
    for _, sessions in dead:
        for pool in sessions.pools:
            _forget_connector(pool.connector, pool.name)


# --- the public session API (re-exported by gym_obs.client and gym_obs.client.http_client) ---------------


def _validated(cfg: object, workers: object) -> GlobalAIOHTTPAsyncClientConfig:
    """``cfg`` checked before anything is stored: a bad config must fail here, at the call that set it,
    never later in every request. A mapping is validated into the model; a model is re-validated (one
    built with ``model_construct`` skipped its checks); the retry budget must be finite."""
    if isinstance(cfg, GlobalAIOHTTPAsyncClientConfig):
        cfg = GlobalAIOHTTPAsyncClientConfig.model_validate(cfg.model_dump())
    elif isinstance(cfg, Mapping):
        cfg = GlobalAIOHTTPAsyncClientConfig.model_validate(dict(cfg))
    else:
        raise TypeError(
            "cfg must be a GlobalAIOHTTPAsyncClientConfig (or a mapping of its fields), "
            f"not {type(cfg).__name__}"
        )
    assert isinstance(cfg, GlobalAIOHTTPAsyncClientConfig)
    if not math.isfinite(cfg.global_aiohttp_max_retry_seconds):
        raise ValueError("global_aiohttp_max_retry_seconds must be finite: every retry path must end")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int or None, not {workers!r}")
    return cfg


def configure_global_aiohttp_client(
    cfg: GlobalAIOHTTPAsyncClientConfig, *, workers: int | None = None
) -> CapacityReport:
    """Set the pool config for sessions created from now on (no event loop needed); logs the capacity
    report and returns it. ``workers`` defaults to ``WEB_CONCURRENCY``. Raises ``TypeError`` or
    ``ValueError`` (pydantic's ``ValidationError``) for a bad config, which is then not used."""
    return configure(_validated(cfg, workers), workers)


def set_global_aiohttp_client(
    cfg: GlobalAIOHTTPAsyncClientConfig, *, workers: int | None = None
) -> aiohttp.ClientSession:
    """Configure the pools and create this loop's data session now (call from the running loop).

    Raises RuntimeError when this loop already has sessions: ``await close_global_aiohttp_client()``
    first, so that two configurations never silently coexist; ``TypeError``/``ValueError`` for a bad
    config (nothing is changed then).
    """
    cfg = _validated(cfg, workers)
    asyncio.get_running_loop()
    if _is_setup():
        raise RuntimeError(
            "the global aiohttp client is already set up on this event loop; "
            "await close_global_aiohttp_client() before setting a new one"
        )
    configure(cfg, workers)
    return _session_for(control=False)


def get_global_aiohttp_client() -> aiohttp.ClientSession:
    """The running loop's data-pool session (created on first use with the configured or default config).

    It is the traced session while telemetry is on and the plain one while it is off; both share one
    connector. Prefer ``request()``, which adds retries, spans and propagation.
    """
    return _session_for(control=False)


def get_global_aiohttp_control_client() -> aiohttp.ClientSession:
    """The running loop's control-pool session (health checks, head server; finite default timeout)."""
    return _session_for(control=True)


def is_global_aiohttp_client_setup() -> bool:
    """Whether the running loop (outside a loop: any live loop) has an open global data session."""
    return _is_setup()


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """Whether ``global_aiohttp_client_request_debug`` is set: every HTTP exchange of the global sessions
    is then logged (``client_request_debug``: method, redacted URL, scrubbed headers, status or error)."""
    return current_config().global_aiohttp_client_request_debug


async def close_global_aiohttp_client() -> None:
    """Close the running loop's sessions, on this loop (other live loops keep theirs: each closes its
    own). Sessions left behind by loops that have ended are forgotten.

    The config is kept: the next ``get_global_aiohttp_client()`` creates fresh sessions with it.
    """
    _forget_dead_loops()
    await _close_loop_sessions()
