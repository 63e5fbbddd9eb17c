"""The in-flight table: which rollouts this process is working on right now, and where each one is.

Tracing answers "what happened" after the fact and only when it is on; this table answers "what is running
now" with telemetry off too. It is plain process memory: a rollout is added where its request is handled
(:func:`rollout`), each hop attempt of the client's attempt loop updates it (:func:`hop_attempt`,
:func:`hop_done`: a context-variable read and a dict update), and the ``/_gym/inflight`` control route and
``gym-obs top`` read :func:`snapshot`. Nothing is exported, nothing blocks.

Tracking is off until a process asks for it (:func:`enable`: agent servers do); off, every hook is a flag
check. The table is bounded: when it is full a new rollout is not tracked (the oldest stay, which are the
interesting ones) and counted in ``evicted``. A snapshot lists at most ``MAX_LIMIT`` rollouts per list.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlsplit

from gym_obs.telemetry.propagation import ROLLOUT_ID

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_LIMIT",
    "DEFAULT_STALL_AFTER_S",
    "MAX_LIMIT",
    "TRACKING",
    "InflightTable",
    "enable",
    "hop_attempt",
    "hop_done",
    "is_enabled",
    "rollout",
    "set_stage",
    "snapshot",
    "table",
]

DEFAULT_CAPACITY: Final = 16_384
DEFAULT_STALL_AFTER_S: Final = 30.0
DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 200
DEFAULT_STAGE: Final = "agent"
_MAX_HOPS_SHOWN: Final = 8
_EXTERNAL: Final = "external"

_monotonic = time.monotonic
_HOP: Final[contextvars.ContextVar[_Hop | None]] = contextvars.ContextVar(
    "gym_obs_inflight_hop", default=None
)
"""The hop the current task is sending (a fan-out's parallel hops each run in a task of their own)."""


class _Hop:
    """One request of a rollout in progress: where it goes, which attempt, since when."""

    __slots__ = ("attempt", "row", "since", "url")

    def __init__(self, row: _Rollout, url: object, attempt: int, since: float) -> None:
        self.row = row
        self.url = url
        self.attempt = attempt
        self.since = since


class _Rollout:
    __slots__ = ("depth", "hops", "progress", "retries", "rollout_id", "stage", "started", "started_wall")

    def __init__(self, rollout_id: str, now: float) -> None:
        self.rollout_id = rollout_id
        self.started = now
        self.started_wall = time.time()
        self.stage = DEFAULT_STAGE
        self.progress = now
        # The hops in progress (an insertion-ordered set): parallel hops of one rollout (a fan-out) run in
        # tasks of their own, each holding its hop in a context variable; sequential hops never overlap.
        self.hops: dict[_Hop, None] = {}
        self.retries = 0
        self.depth = 1  # requests of this rollout being handled (a caller's re-sent request overlaps)


class InflightTable:
    """A bounded, insertion-ordered (oldest first) table of in-flight rollouts."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        self.capacity = capacity
        self.rows: dict[str, _Rollout] = {}
        self.evicted = 0
        self.started = 0
        self.server_names: dict[tuple[str, int | None], str] = {}

    def start(self, rollout_id: str) -> None:
        row = self.rows.get(rollout_id)
        if row is not None:
            row.depth += 1
            row.progress = _monotonic()
            return
        if len(self.rows) >= self.capacity:
            self.evicted += 1
            return
        self.started += 1
        self.rows[rollout_id] = _Rollout(rollout_id, _monotonic())

    def end(self, rollout_id: str) -> None:
        row = self.rows.get(rollout_id)
        if row is not None:
            row.depth -= 1
            if row.depth <= 0:
                del self.rows[rollout_id]

    def clear(self) -> None:
        self.rows.clear()
        self.evicted = 0
        self.started = 0

    # -- reading ---------------------------------------------------------------------------------------------

    def _server(self, url: object) -> str:
        try:
            parts = urlsplit(str(url))
            key = ((parts.hostname or "").lower(), parts.port)
        except ValueError:
            return _EXTERNAL
        name = self.server_names.get(key)
        if name is None and key[1] is None:
            default = 443 if parts.scheme == "https" else 80
            name = self.server_names.get((key[0], default))
        return name if name is not None else _EXTERNAL

    def _row(self, row: _Rollout, now: float, stall_after_s: float) -> dict[str, Any]:
        hops = [
            {"server": self._server(hop.url), "attempt": hop.attempt, "elapsed_s": round(now - hop.since, 3)}
            for hop in list(row.hops)[:_MAX_HOPS_SHOWN]
        ]
        since_progress = now - row.progress
        return {
            "rollout_id": row.rollout_id,
            "stage": row.stage,
            "elapsed_s": round(now - row.started, 3),
            "started_at": row.started_wall,
            "since_progress_s": round(since_progress, 3),
            "hops_in_flight": len(row.hops),
            "hops": hops,
            "retries": row.retries,
            "retrying": any(hop.attempt > 1 for hop in list(row.hops)),
            "stalled": since_progress >= stall_after_s,
        }

    def snapshot(
        self, *, limit: int = DEFAULT_LIMIT, stall_after_s: float = DEFAULT_STALL_AFTER_S
    ) -> dict[str, Any]:
        """Counts over every tracked rollout, and at most ``limit`` (capped at ``MAX_LIMIT``) of the oldest,
        the oldest stalled and the oldest retrying ones. O(table size), on the caller's request only."""
        limit = max(0, min(int(limit), MAX_LIMIT))
        now = _monotonic()
        by_stage: dict[str, int] = {}
        by_server: dict[str, int] = {}
        oldest: list[dict[str, Any]] = []
        stalled: list[dict[str, Any]] = []
        retrying: list[dict[str, Any]] = []
        n_stalled = n_retrying = 0
        for row in list(self.rows.values()):
            by_stage[row.stage] = by_stage.get(row.stage, 0) + 1
            hops = list(row.hops)
            for hop in hops:
                server = self._server(hop.url)
                by_server[server] = by_server.get(server, 0) + 1
            is_stalled = now - row.progress >= stall_after_s
            is_retrying = any(hop.attempt > 1 for hop in hops)
            n_stalled += is_stalled
            n_retrying += is_retrying
            if len(oldest) < limit:
                oldest.append(self._row(row, now, stall_after_s))
            if is_stalled and len(stalled) < limit:
                stalled.append(self._row(row, now, stall_after_s))
            if is_retrying and len(retrying) < limit:
                retrying.append(self._row(row, now, stall_after_s))
        return {
            "pid": os.getpid(),
            "tracking": TRACKING.enabled,
            "capacity": self.capacity,
            "in_flight": len(self.rows),
            "started": self.started,
            "evicted": self.evicted,
            "stall_after_s": stall_after_s,
            "limit": limit,
            "by_stage": by_stage,
            "hops_by_server": by_server,
            "stalled_count": n_stalled,
            "retrying_count": n_retrying,
            "oldest": oldest,
            "stalled": stalled,
            "retrying": retrying,
        }


class _Tracking:
    """The switch, an attribute of a module-level object, so that a hot caller checks it inline
    (``if inflight.TRACKING.enabled:``) instead of calling a hook that checks it."""

    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled = False


_TABLE = InflightTable()
TRACKING: Final = _Tracking()


def table() -> InflightTable:
    """This process's table."""
    return _TABLE


def is_enabled() -> bool:
    return TRACKING.enabled


def enable(
    on: bool = True,
    *,
    servers: Mapping[tuple[str, int | None], str] | None = None,
    capacity: int | None = None,
) -> None:
    """Track this process's rollouts (or stop: ``on=False`` also empties the table).

    ``servers`` maps ``(host, port)`` to gym server names, so a hop is shown by the name of the server it
    goes to (``external`` otherwise); names are resolved when the table is read, never per hop.
    """
    if capacity is not None and capacity != _TABLE.capacity:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        _TABLE.capacity = capacity
    if servers is not None:
        _TABLE.server_names = {(host.lower(), port): name for (host, port), name in servers.items()}
    if not on:
        _TABLE.clear()
    TRACKING.enabled = on


class _Tracked:
    """``with rollout(id):`` while tracking: the rollout is in the table for the block."""

    __slots__ = ("rollout_id",)

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id

    def __enter__(self) -> None:
        _TABLE.start(self.rollout_id)

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        _TABLE.end(self.rollout_id)


class _Untracked:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None


_UNTRACKED: Final = _Untracked()


def rollout(rollout_id: str | None) -> _Tracked | _Untracked:
    """A context manager holding ``rollout_id`` in the table while its request is handled (a no-op when
    tracking is off or there is no id)."""
    if not TRACKING.enabled or rollout_id is None:
        return _UNTRACKED
    return _Tracked(rollout_id)


def set_stage(stage: str) -> None:
    """The current rollout entered ``stage`` (``admission``, ``agent``, ``verification``, ...)."""
    if not TRACKING.enabled:
        return
    rollout_id = ROLLOUT_ID.get()
    row = _TABLE.rows.get(rollout_id) if rollout_id is not None else None
    if row is not None:
        row.stage = stage
        row.progress = _monotonic()


def hop_attempt(url: object, attempt: int) -> None:
    """Attempt ``attempt`` of the current task's request to ``url`` (str or yarl URL) starts now."""
    if not TRACKING.enabled:
        return
    hop = _HOP.get()
    if hop is not None:  # a retry of the request in progress
        now = hop.row.progress = _monotonic()
        hop.url = url
        hop.attempt = attempt
        hop.since = now
        if attempt > 1:
            hop.row.retries += 1
        return
    rollout_id = ROLLOUT_ID.get()
    if rollout_id is None:
        return
    row = _TABLE.rows.get(rollout_id)
    if row is None:
        return
    now = row.progress = _monotonic()
    hop = _Hop(row, url, attempt, now)
    row.hops[hop] = None
    _HOP.set(hop)


def hop_done() -> None:
    """The current task's request ended (reply, error or cancellation)."""
    if not TRACKING.enabled:
        return
    hop = _HOP.get()
    if hop is not None:
        _HOP.set(None)
        row = hop.row
        row.hops.pop(hop, None)
        row.progress = _monotonic()


def snapshot(*, limit: int = DEFAULT_LIMIT, stall_after_s: float = DEFAULT_STALL_AFTER_S) -> dict[str, Any]:
    """:meth:`InflightTable.snapshot` of this process's table."""
    return _TABLE.snapshot(limit=limit, stall_after_s=stall_after_s)
