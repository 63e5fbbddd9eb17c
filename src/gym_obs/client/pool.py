"""Connection pools: connector factory, TCP keepalive, per-worker limits and the start-up capacity report.

Pool exhaustion looks exactly like a slow backend unless it is measured: ``_pool_metrics`` builds the
pool-wait telemetry on aiohttp's connection-queue trace signals for the connectors made here.

Why these defaults:

* The client's keep-alive (``global_aiohttp_keepalive_timeout_seconds``, 4 s) is shorter than uvicorn's
  default ``timeout_keep_alive`` (5 s): the side that closes an idle connection first must be the client,
  otherwise a request can be written onto a connection the server is closing at that very moment.
* TCP keepalive probes (idle 60 s, interval 10 s, 3 probes) find peers that vanished without a FIN (a
  killed VM, a dropped NAT entry) during long model calls, instead of waiting forever.
* Limits are per process, so the configured (machine-wide) limits are divided among uvicorn workers
  (``WEB_CONCURRENCY`` or an explicit ``workers`` argument).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Final, Literal

import aiohttp

from gym_obs.client._fair_connector import FairTCPConnector
from gym_obs.config import GlobalAIOHTTPAsyncClientConfig
from gym_obs.telemetry import names

__all__ = [
    "UVICORN_DEFAULT_KEEPALIVE_SECONDS",
    "WORKERS_ENV",
    "CapacityReport",
    "EffectiveLimits",
    "PoolLimits",
    "PoolName",
    "capacity_report",
    "effective_limits",
    "ephemeral_port_range",
    "keepalive_socket_factory",
    "make_connector",
    "nofile_soft_limit",
    "worker_count",
]

PoolName = Literal["data", "control"]

WORKERS_ENV: Final = "WEB_CONCURRENCY"
"""uvicorn's own variable for its worker count; limits are divided by it."""

UVICORN_DEFAULT_KEEPALIVE_SECONDS: Final = 5.0
"""uvicorn's default ``timeout_keep_alive``; the client keep-alive must stay below the server's."""

_PORT_RANGE_PATH: Final = "/proc/sys/net/ipv4/ip_local_port_range"
# File descriptors a process needs besides its client sockets (listening socket, server-side connections,
# log files, pipes). Generous on purpose: the warning is about headroom, not exact accounting.
_FD_HEADROOM: Final = 64


def worker_count(workers: int | None = None) -> int:
    """Number of uvicorn workers sharing this machine's limits: the argument, else ``WEB_CONCURRENCY``,
    else 1."""
    if workers is not None:
        return max(1, int(workers))
    raw = os.environ.get(WORKERS_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        return 1


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """aiohttp connector limits of one pool in one process (0 = unlimited, as in aiohttp)."""

    limit: int
    limit_per_host: int

    @property
    def host_cap(self) -> int:
        """Connections one host can really get: aiohttp checks the total limit too, so a host is capped at
        ``min(limit, limit_per_host)`` (0 = unlimited, as in aiohttp)."""
        caps = [n for n in (self.limit, self.limit_per_host) if n > 0]
        return min(caps) if caps else 0


@dataclass(frozen=True, slots=True)
class EffectiveLimits:
    """Per-process limits after dividing the configured ones among ``workers``."""

    workers: int
    data: PoolLimits
    control: PoolLimits

    def for_pool(self, pool: PoolName) -> PoolLimits:
        return self.control if pool == names.POOL_CONTROL else self.data


def _divide(limit: int, workers: int) -> int:
    # 0 means "unlimited" to aiohttp and must stay so; a real limit never rounds down to 0 (= unlimited).
    return 0 if limit <= 0 else max(1, limit // workers)


def effective_limits(cfg: GlobalAIOHTTPAsyncClientConfig, workers: int | None = None) -> EffectiveLimits:
    """Divide the configured limits among the uvicorn workers of this machine."""
    n = worker_count(workers)
    return EffectiveLimits(
        workers=n,
        data=PoolLimits(
            _divide(cfg.global_aiohttp_connector_limit, n),
            _divide(cfg.global_aiohttp_connector_limit_per_host, n),
        ),
        control=PoolLimits(
            _divide(cfg.global_aiohttp_control_connector_limit, n),
            _divide(cfg.global_aiohttp_control_connector_limit_per_host, n),
        ),
    )


def keepalive_socket_factory(
    idle_seconds: int, interval_seconds: int, probes: int
) -> aiohttp.SocketFactoryType:
    """A socket factory for ``TCPConnector`` that turns on TCP keepalive with the given timings.

    Options the platform lacks (``TCP_KEEPIDLE`` is Linux-only) are skipped rather than failing.
    """

    def factory(addr_info: aiohttp.AddrInfoType) -> socket.socket:
        family, type_, proto, _canonname, _sockaddr = addr_info
        sock = socket.socket(family=family, type=type_, proto=proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for opt_name, value in (
                ("TCP_KEEPIDLE", idle_seconds),
                ("TCP_KEEPINTVL", interval_seconds),
                ("TCP_KEEPCNT", probes),
            ):
                opt = getattr(socket, opt_name, None)
                if opt is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, opt, value)
        except OSError:
            sock.close()
            raise
        return sock

    return factory


def make_connector(
    cfg: GlobalAIOHTTPAsyncClientConfig, pool: PoolName = "data", *, workers: int | None = None
) -> aiohttp.TCPConnector:
    """A ``TCPConnector`` for ``pool`` with per-worker limits, TCP keepalive, a client keep-alive shorter
    than the server's, and queued requests served in arrival order (``FairTCPConnector``). Must be called
    with the event loop the connector will live on running."""
    limits = effective_limits(cfg, workers).for_pool(pool)
    return FairTCPConnector(
        limit=limits.limit,
        limit_per_host=limits.limit_per_host,
        keepalive_timeout=cfg.global_aiohttp_keepalive_timeout_seconds,
        socket_factory=keepalive_socket_factory(
            cfg.global_aiohttp_tcp_keepalive_idle_seconds,
            cfg.global_aiohttp_tcp_keepalive_interval_seconds,
            cfg.global_aiohttp_tcp_keepalive_probes,
        ),
    )


def nofile_soft_limit() -> int | None:
    """The RLIMIT_NOFILE soft limit of this process, or None where it cannot be read (or is unlimited)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def ephemeral_port_range(path: str = _PORT_RANGE_PATH) -> tuple[int, int] | None:
    """The kernel's ephemeral (local) port range, or None off Linux."""
    try:
        with open(path, encoding="ascii") as fh:
            low, high = (int(part) for part in fh.read().split()[:2])
    except (OSError, ValueError):
        return None
    return (low, high) if high >= low else None


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """What the pools can carry, as one log line, plus a warning per limit the intended load exceeds."""

    line: str
    warnings: tuple[str, ...]
    limits: EffectiveLimits


def _fmt_limit(limit: int) -> str:
    return "unlimited" if limit <= 0 else str(limit)


def capacity_report(
    cfg: GlobalAIOHTTPAsyncClientConfig,
    workers: int | None = None,
    *,
    nofile_soft: int | None = -1,
    port_range: tuple[int, int] | Literal[-1] | None = -1,
) -> CapacityReport:
    """Build the start-up capacity report.

    Intended concurrency is machine-wide (all workers together), like the configured limits. Warnings:
    intended concurrency above the connector limit (requests would queue: pool wait, not a slow backend);
    per-process connections above the file-descriptor soft limit (``EMFILE``, surfacing as ``ClientOSError``);
    concurrent connections to one host above the ephemeral port range (``EADDRNOTAVAIL``).
    ``nofile_soft``/``port_range`` default to this machine's values (tests pass their own).
    """
    limits = effective_limits(cfg, workers)
    n = limits.workers
    soft = nofile_soft_limit() if nofile_soft == -1 else nofile_soft
    ports = ephemeral_port_range() if port_range == -1 else port_range
    intended = cfg.global_aiohttp_intended_concurrency
    intended_host = cfg.global_aiohttp_intended_concurrency_per_host
    warnings: list[str] = []

    total_limit = cfg.global_aiohttp_connector_limit
    if intended is not None and total_limit > 0 and intended > limits.data.limit * n:
        warnings.append(
            f"intended concurrency {intended} exceeds the data pool limit {limits.data.limit * n} "
            f"({limits.data.limit} per worker x {n}): requests will wait for a connection "
            f"(see {names.METRIC_POOL_WAIT_DURATION}); raise global_aiohttp_connector_limit"
        )
    host_cap = limits.data.host_cap
    if intended_host is not None and host_cap > 0 and intended_host > host_cap * n:
        capped_by_total = host_cap < limits.data.limit_per_host or limits.data.limit_per_host <= 0
        raise_what = (
            "global_aiohttp_connector_limit (aiohttp caps one host at min(limit, limit_per_host))"
            if capped_by_total
            else "global_aiohttp_connector_limit_per_host"
        )
        warnings.append(
            f"intended per-host concurrency {intended_host} exceeds the per-host limit "
            f"{host_cap * n} ({host_cap} per worker x {n}): requests to one server will queue; "
            f"raise {raise_what}"
        )

    # Sockets one worker may hold: its share of the intended load, capped by its pool limits.
    per_worker = -(-intended // n) if intended is not None else None
    if per_worker is not None and limits.data.limit > 0:
        per_worker = min(per_worker, limits.data.limit)
    control_fds = limits.control.limit if limits.control.limit > 0 else 0
    if soft is not None and per_worker is not None and per_worker + control_fds + _FD_HEADROOM > soft:
        warnings.append(
            f"up to {per_worker + control_fds} client sockets per worker (+{_FD_HEADROOM} headroom) exceed "
            f"the file-descriptor soft limit {soft} (RLIMIT_NOFILE): connects will fail with EMFILE; raise "
            "`ulimit -n` or lower the limits"
        )

    port_count = ports[1] - ports[0] + 1 if ports is not None else None
    host_load = intended_host if intended_host is not None else intended
    if ports is not None and port_count is not None and host_load is not None and host_load > port_count:
        warnings.append(
            f"{host_load} concurrent connections to one host exceed the ephemeral port range "
            f"{ports[0]}-{ports[1]} ({port_count} ports, {_PORT_RANGE_PATH}): connects will fail with "
            "EADDRNOTAVAIL; widen the range or spread load over more hosts/ports"
        )
    keepalive = cfg.global_aiohttp_keepalive_timeout_seconds
    if keepalive >= UVICORN_DEFAULT_KEEPALIVE_SECONDS:
        warnings.append(
            f"client keep-alive {keepalive:g}s is not shorter than uvicorn's default timeout_keep_alive "
            f"{UVICORN_DEFAULT_KEEPALIVE_SECONDS:g}s: requests may be written onto connections the server is "
            "closing; make sure the servers keep connections open longer"
        )

    line = (
        f"gym_obs client pools: workers={n} "
        f"data limit={_fmt_limit(limits.data.limit)} per_host={_fmt_limit(limits.data.host_cap)} "
        f"control limit={_fmt_limit(limits.control.limit)} "
        f"per_host={_fmt_limit(limits.control.host_cap)} "
        f"keepalive={keepalive:g}s "
        f"tcp_keepalive={cfg.global_aiohttp_tcp_keepalive_idle_seconds}/"
        f"{cfg.global_aiohttp_tcp_keepalive_interval_seconds}/{cfg.global_aiohttp_tcp_keepalive_probes} "
        f"intended={intended if intended is not None else 'unset'} "
        f"intended_per_host={intended_host if intended_host is not None else 'unset'} "
        f"nofile_soft={soft if soft is not None else 'unknown'} "
        f"ephemeral_ports={port_count if port_count is not None else 'unknown'} "
        f"retry_budget={cfg.global_aiohttp_max_retry_seconds:g}s warnings={len(warnings)}"
    )
    return CapacityReport(line=line, warnings=tuple(warnings), limits=limits)
