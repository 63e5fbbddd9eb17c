"""Fair admission to a limited pool: queued requests get connections in arrival order, retries included.

aiohttp's ``TCPConnector`` is not fair. A request that finds an idle pooled connection takes it at once, even
while others are queued (the task that just released a connection usually re-takes it with its next
request), a woken waiter that lost that race re-queues, and which host's queue is served is chosen at random.
With ``limit_per_host=16`` and 32 rollouts, the rollouts that queued first waited for the whole run.

:class:`FairTCPConnector` puts one ordered gate in front of aiohttp's accounting: a request that cannot get
a slot under ``limit``/``limit_per_host`` (counting slots already promised to woken waiters) queues by its
*arrival number*, and every released connection is promised to the earliest queued request it can serve.
A logical request keeps its arrival number across retries (``request()`` sets :data:`ARRIVAL`), so a
retry is not sent to the back. Unlimited pools skip the gate entirely.

This is also the one module that reads aiohttp's connector bookkeeping (``_acquired``, ``_conns``,
``_limit``...): aiohttp has no public API for the counts a fair gate and a connections gauge need, so every
such read is here, behind :func:`connections_in_use` and :func:`connection_counts`.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

import aiohttp

if TYPE_CHECKING:
    from aiohttp.client_reqrep import ClientRequest, ConnectionKey
    from aiohttp.tracing import Trace

__all__ = ["ARRIVAL", "FairTCPConnector", "connection_counts", "connections_in_use", "next_arrival"]

ARRIVAL: Final[ContextVar[int | None]] = ContextVar("gym_obs_pool_arrival", default=None)
"""The arrival number of the logical request being sent (set once per ``request()``, kept by retries)."""

next_arrival: Final[Callable[[], int]] = itertools.count(1).__next__
"""A fresh arrival number (process-wide, increasing): the counter's own method, no Python frame per call."""


class FairTCPConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` whose waiters are served in arrival order (see the module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # (arrival, tie-break, future, key), sorted: the earliest arrival is served first.
        self._fair_queue: list[tuple[int, int, asyncio.Future[None], ConnectionKey]] = []
        self._fair_ties = itertools.count()
        self._promised: dict[ConnectionKey, int] = {}
        self.promised_total = 0
        self._gated = bool(self.limit or self.limit_per_host)
        self.on_connection_created: Callable[[], None] | None = None
        """Called once per connection this connector opens (the pool's connects counter)."""

    def _slot_free(self, key: ConnectionKey) -> bool:
        """A connection may be taken for ``key`` now (slots promised to woken waiters count as taken)."""
        limit = self.limit
        if limit and len(self._acquired) + self.promised_total >= limit:
            return False
        per_host = self.limit_per_host
        if per_host:
            held = len(self._acquired_per_host.get(key, ())) + self._promised.get(key, 0)
            if held >= per_host:
                return False
        return True

    def _promise(self, key: ConnectionKey) -> None:
        self._promised[key] = self._promised.get(key, 0) + 1
        self.promised_total += 1

    def _unpromise(self, key: ConnectionKey) -> None:
        left = self._promised.get(key, 0) - 1
        if left > 0:
            self._promised[key] = left
        else:
            self._promised.pop(key, None)
        self.promised_total -= 1

    def _serve_queue(self) -> None:
        """Promise free slots to the earliest queued requests they can serve."""
        queue = self._fair_queue
        if not queue:
            return
        kept: list[tuple[int, int, asyncio.Future[None], ConnectionKey]] = []
        limit = self.limit
        for index, entry in enumerate(queue):
            future, key = entry[2], entry[3]
            if future.done():
                continue
            if limit and len(self._acquired) + self.promised_total >= limit:
                kept.extend(e for e in queue[index:] if not e[2].done())
                break
            if self._slot_free(key):
                self._promise(key)
                future.set_result(None)
            else:
                kept.append(entry)
        self._fair_queue = kept

    async def _wait_turn(self, key: ConnectionKey, traces: list[Trace]) -> None:
        arrival = ARRIVAL.get()
        if arrival is None:
            arrival = next_arrival()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        bisect.insort(self._fair_queue, (arrival, next(self._fair_ties), future, key))
        for trace in traces:
            await trace.send_connection_queued_start()
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._unpromise(key)  # woken, then cancelled before taking the slot: pass it on
                self._serve_queue()
            else:
                self._fair_queue = [e for e in self._fair_queue if e[2] is not future]
            raise
        for trace in traces:
            await trace.send_connection_queued_end()

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109
    ) -> aiohttp.connector.Connection:
        if not self._gated:
            return await super().connect(req, traces, timeout)
        key = req.connection_key
        if self._slot_free(key):
            return await super().connect(req, traces, timeout)
        # aiohttp's connect timeout covers the wait for a pooled connection: so it does the wait here (a
        # TimeoutError becomes aiohttp's ConnectionTimeoutError, as it would from aiohttp's own queue).
        if timeout.connect is not None:
            async with asyncio.timeout(timeout.connect):
                await self._wait_turn(key, traces)
        else:
            await self._wait_turn(key, traces)
        # The promised slot becomes a real one synchronously inside connect() (pooled connection or
        # placeholder) before it first suspends, so no other request can take it in between.
        self._unpromise(key)
        try:
            return await super().connect(req, traces, timeout)
        finally:
            self._serve_queue()  # the promise is now an acquisition (or nothing): hand on what is left

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout  # noqa: ASYNC109
    ) -> Any:
        proto = await super()._create_connection(req, traces, timeout)
        hook = self.on_connection_created
        if hook is not None:
            hook()
        return proto

    def _release_acquired(self, key: ConnectionKey, proto: Any) -> None:
        super()._release_acquired(key, proto)
        if self._fair_queue:
            self._serve_queue()

    def _close(self, *args: Any, **kwargs: Any) -> Any:
        queue, self._fair_queue = self._fair_queue, []
        for entry in queue:
            if not entry[2].done():
                entry[2].set_exception(aiohttp.ClientConnectionError("Connector is closed."))
        return super()._close(*args, **kwargs)


def connections_in_use(connector: aiohttp.BaseConnector) -> int:
    """Connections handed out by ``connector`` (being opened included) plus slots promised to woken
    waiters: what a new request competes with. Reads aiohttp's private ``_acquired`` (no public count)."""
    return len(connector._acquired) + getattr(connector, "promised_total", 0)


def connection_counts(connector: aiohttp.BaseConnector) -> tuple[int, int]:
    """(active, idle) connections of ``connector``. aiohttp has no public accessor, so this reads its
    bookkeeping defensively: ``_acquired`` (handed out, including ones being opened) and ``_conns``
    (idle, per key). Any shape change yields (0, 0) rather than an error."""
    try:
        active = len(connector._acquired)
        idle = sum(len(conns) for conns in list(connector._conns.values()))
    except (AttributeError, TypeError, RuntimeError):
        return 0, 0
    return active, idle
