"""Client-disconnect cancellation: a caller that went away before the reply cancels its handler.

uvicorn only marks a request as disconnected; the handler keeps running (a rollout step, a model call)
for a caller that will never read the answer. This pure ASGI middleware cancels the handler's task when
the client disconnects before the response starts, and drops anything the handler sends afterwards. It is
a step (``DisconnectWatch``) of the gym layers' one frame (``_steps``), innermost;
``DisconnectCancelMiddleware`` runs it on its own.

One sweeper task per event loop (alive only while requests are in flight) looks at the running requests
every ``watch_delay_s``. Under uvicorn (``receive`` is its request cycle's, which keeps ``disconnected``
and ``response_started`` flags, set by the transport whether or not anybody reads) a request registers
nothing: uvicorn already keeps the set of its request tasks (its server state's ``tasks``, reached from the
cycle's ``on_response`` callback, a method of the connection's protocol), and the sweeper walks that set.
A task's cycle is found once, from its coroutine (uvicorn runs each request as ``cycle.run_asgi(app)``),
and only for a task still running on its second sweep, so quick requests never pay for it; the sweeper
then reads the flags. No task, no timer, no wrapper, no per-request registration; a disconnect noticed
within two sweeps. A request is cancelled only once it has entered the gym layers (its scope holds an
exchange). (uvicorn stops reading a socket whose unread body passed its high-water mark, so a handler
that never reads a large body sees its caller leave only when it reads.) Under any other server,
the sweeper starts a watcher task for the requests it has already seen on its previous pass (so quick
requests never pay for one) that reads ``receive`` for the app and waits for the disconnect; a disconnect
is noticed within two sweeps.

This layer never wraps ``send``. Whether the reply has started is the request's
:class:`~gym_obs.server._exchange.Exchange`'s (or uvicorn's) to know, and once this layer says the caller
is gone (``Exchange.caller_gone``) the exchange's ``send`` (the one wrapper every layer shares) drops what
the handler still sends, and the failure-reply layer outside sends no failure reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_obs.server._exchange import EXCHANGE_SCOPE_KEY, Exchange
from gym_obs.server._steps import RequestSteps
from gym_obs.server._tasks import running_loop as _running_loop
from gym_obs.server._tasks import running_task as _running_task

__all__ = ["DEFAULT_WATCH_DELAY_S", "DisconnectCancelMiddleware", "DisconnectWatch"]

DEFAULT_WATCH_DELAY_S: Final = 0.02
_DISCONNECT: Final[Message] = {"type": "http.disconnect"}

_log = logging.getLogger("gym_obs.server")
_NEW: Final = object()
_SEEN: Final = object()


class _Watch:
    """Per-request state: owns the real ``receive`` while the watcher runs, buffers what it reads."""

    __slots__ = (
        "_changed",
        "_receive",
        "_watcher",
        "aged",
        "body_done",
        "buffer",
        "cancelled_by_us",
        "disconnected",
        "exchange",
        "in_receive",
        "task",
    )

    def __init__(self, receive: Receive, task: asyncio.Task[Any], exchange: Exchange) -> None:
        self._receive = receive
        self.task = task
        self.exchange = exchange
        self.aged = False
        self._watcher: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        self.buffer: deque[Message] | None = None  # only once the watcher reads for the app
        self.body_done = False
        self.disconnected = False
        self.in_receive = False
        self.cancelled_by_us = False

    # -- the app's view ------------------------------------------------------------------------------------

    async def receive(self) -> Message:
        while True:
            if self.buffer:
                return self.buffer.popleft()
            if self.disconnected:
                return _DISCONNECT
            if self._watcher is None or self._changed is None:
                self.in_receive = True
                try:
                    message = await self._receive()
                finally:
                    self.in_receive = False
                self._note(message)
                return message
            await self._changed.wait()
            self._changed.clear()

    # -- watching ------------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Start watching for the disconnect; False means: not now, ask again on the next sweep."""
        if self.exchange.response_started or self.disconnected or self._watcher is not None:
            return True
        if self.in_receive:
            # Reading the body itself: look again later. Past the body: it waits for the disconnect itself.
            return self.body_done
        self._changed = asyncio.Event()
        self.buffer = deque()
        self._watcher = self.task.get_loop().create_task(self._watch())
        return True

    async def _watch(self) -> None:
        changed = self._changed
        assert changed is not None
        try:
            while not self.body_done and not self.disconnected:
                message = await self._receive()
                self._note(message)
                if message["type"] == "http.request":
                    self.buffer.append(message)  # type: ignore[union-attr]
                changed.set()
            if not self.disconnected:
                # uvicorn answers this only on disconnect or once the response is complete.
                message = await self._receive()
                if message["type"] == "http.disconnect" and not self.exchange.response_started:
                    self.disconnected = True
            if self.disconnected and not self.exchange.response_started:
                self.cancelled_by_us = True
                self.exchange.caller_gone = True
                self.task.cancel()
        finally:
            changed.set()

    def _note(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.request":
            if not message.get("more_body", False):
                self.body_done = True
        elif kind == "http.disconnect":
            self.disconnected = True

    def close(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()


class _Sweeper:
    """One per event loop: polls uvicorn's flags, starts watchers for requests seen on two passes."""

    __slots__ = ("cancelled", "cycles", "interval", "loop", "running", "served", "servers", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self.running: set[_Watch] = set()
        #: the request-task sets of the uvicorn servers on this loop (one, unless an app is served twice)
        self.servers: list[set[asyncio.Task[Any]]] = []
        #: the one a request last came from (the request path checks it by identity)
        self.served: set[asyncio.Task[Any]] | None = None
        #: uvicorn request tasks seen on a sweep -> their request cycle (``None``: not a request cycle), or
        #: ``_SEEN`` for a task seen on one sweep only (its cycle is looked for on the next)
        self.cycles: dict[asyncio.Task[Any], Any] = {}
        #: polled tasks this layer cancelled for a disconnect (the layer absorbs their CancelledError)
        self.cancelled: set[asyncio.Task[Any]] = set()
        self.task: asyncio.Task[None] | None = None

    def serve(self, tasks: set[asyncio.Task[Any]]) -> None:
        """Sweep ``tasks`` (a uvicorn server's request tasks) from now on."""
        if not any(tasks is known for known in self.servers):
            self.servers.append(tasks)
        self.served = tasks

    def start(self) -> None:
        if self.task is None:
            self.task = self.loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        try:
            while self.running or any(self.servers):
                await asyncio.sleep(self.interval)
                self._sweep_servers()
                for watch in tuple(self.running):
                    if not watch.aged:
                        watch.aged = True
                    elif watch.start():
                        self.running.discard(watch)
        finally:
            self.task = None

    def _sweep_servers(self) -> None:
        """Cancel the uvicorn requests whose caller left before the reply started."""
        known, cycles = self.cycles, {}
        for tasks in self.servers:
            for task in tasks:
                cycle = known.get(task, _NEW)
                if cycle is _NEW:  # seen first: most requests end before the next sweep
                    cycles[task] = _SEEN
                    continue
                if cycle is _SEEN:
                    cycle = _request_cycle(task)
                cycles[task] = cycle
                if (
                    cycle is not None
                    and cycle.disconnected
                    and not cycle.response_started
                    and task not in self.cancelled
                ):
                    exchange = cycle.scope.get(EXCHANGE_SCOPE_KEY)
                    if exchange is not None:  # (in the gym layers: the frame absorbs the cancellation)
                        self.cancelled.add(task)
                        exchange.caller_gone = True
                        task.cancel()
        self.cycles = cycles  # (the tasks that ended are forgotten)
        self.servers = [tasks for tasks in self.servers if tasks or tasks is self.served]

    def absorbs(self, scope: Scope) -> bool:
        """For a ``CancelledError`` out of the running polled request's app: True when it is this layer's
        own disconnect cancellation alone (swallow it)."""
        task = _running_task(self.loop)  # (the request's: it runs on this loop, on this thread)
        return task is not None and task in self.cancelled and _absorbed(task, self.cancelled, scope)

    def leave(self) -> None:
        """The running polled request is over; called only while :attr:`cancelled` is not empty (after a
        disconnect)."""
        task = _running_task(self.loop)  # (the request's, as in ``absorbs``)
        if task is not None and task in self.cancelled:
            self.cancelled.discard(task)
            task.uncancel()  # the handler swallowed our cancellation: undo it


def _request_cycle(task: asyncio.Task[Any]) -> Any:
    """The uvicorn request cycle ``task`` runs (``cycle.run_asgi(app)``), or ``None``."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    cycle = frame.f_locals.get("self") if frame is not None else None
    return cycle if type(getattr(cycle, "disconnected", None)) is bool else None


def _server_tasks(cycle: Any) -> set[asyncio.Task[Any]] | None:
    """The request-task set of the uvicorn server ``cycle`` belongs to (its protocol's), or ``None``."""
    tasks = getattr(getattr(getattr(cycle, "on_response", None), "__self__", None), "tasks", None)
    return tasks if isinstance(tasks, set) else None


class DisconnectWatch:
    """The disconnect step of one server: cancel the handler when the client disconnects before the
    response starts."""

    __slots__ = ("_cycle_type", "_sweeper", "_sweepers", "watch_delay_s")

    def __init__(self, *, watch_delay_s: float = DEFAULT_WATCH_DELAY_S) -> None:
        self.watch_delay_s = watch_delay_s
        self._sweeper: _Sweeper | None = None
        self._sweepers: dict[asyncio.AbstractEventLoop, _Sweeper] = {}
        #: the type of the last request cycle found to be uvicorn's (flags, and its server's task set)
        self._cycle_type: type | None = None

    def poll(self, receive: Receive) -> _Sweeper | None:
        """Under uvicorn, make sure the sweeper of the request's loop walks its server's request tasks
        and return that sweeper (then its ``absorbs`` around the app, and, after a disconnect, ``leave``
        when the request ends); ``None``: run the app under :meth:`watched` (another server).

        Every request of a server passes here, so it is one call that registers nothing: the request's
        server is known by its task set (the sweeper's, on the common path, whose loop is running), and
        the running loop is asked for (``asyncio.get_running_loop`` makes a ``getpid`` system call on
        every call before Python 3.12) only when a request comes from another server than the last one.
        """
        try:
            cycle: Any = receive.__self__  # type: ignore[attr-defined]
        except AttributeError:  # (not a method: not uvicorn's)
            return None
        if type(cycle) is not self._cycle_type:
            if type(getattr(cycle, "disconnected", None)) is not bool or _server_tasks(cycle) is None:
                return None
            self._cycle_type = type(cycle)  # uvicorn's request cycle: the next ones need no checks
        tasks = cycle.on_response.__self__.tasks
        sweeper = self._sweeper
        # (a server's task set outlives its loop when a uvicorn server object serves again, on a new loop)
        if sweeper is None or tasks is not sweeper.served or _running_task(sweeper.loop) is None:
            sweeper = self._sweeper_for(_running_loop())
            sweeper.serve(tasks)
        if sweeper.task is None:
            sweeper.start()
        return sweeper

    def _sweeper_for(self, loop: asyncio.AbstractEventLoop) -> _Sweeper:
        """The sweeper of ``loop`` (a new one when the server runs on a new loop, as tests do), kept as the
        last one used. One per loop, so that two loops serving at once never sweep the same server."""
        sweeper = self._sweeper
        if sweeper is None or sweeper.loop is not loop:
            sweeper = self._sweepers.get(loop)
            if sweeper is None:
                live = {known: kept for known, kept in self._sweepers.items() if not known.is_closed()}
                self._sweepers = live
                sweeper = self._sweepers[loop] = _Sweeper(loop, self.watch_delay_s)
            self._sweeper = sweeper
        return sweeper

    async def watched(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, exchange: Exchange
    ) -> None:
        """A server other than uvicorn (:meth:`poll` said ``None``): a watcher task reads ``receive`` once
        the request has aged."""
        task = asyncio.current_task()
        if task is None:
            await app(scope, receive, send)
            return
        sweeper = self._sweeper_for(task.get_loop())
        watch = _Watch(receive, task, exchange)
        sweeper.running.add(watch)
        sweeper.start()
        try:
            await app(scope, watch.receive, send)
        except asyncio.CancelledError:
            if not watch.cancelled_by_us:
                raise
            watch.cancelled_by_us = False  # handled: the end below must not uncancel again
            watch.close()
            if not _absorbed(task, None, scope):
                raise
        finally:
            sweeper.running.discard(watch)
            watch.close()
            if watch.cancelled_by_us:  # the handler swallowed our cancellation: undo it
                watch.cancelled_by_us = False
                watch.task.uncancel()


class DisconnectCancelMiddleware(RequestSteps):
    """:class:`DisconnectWatch` as a pure ASGI middleware of its own (``SimpleServer`` runs it as a step)."""

    __slots__ = ()

    def __init__(self, app: ASGIApp, *, watch_delay_s: float = DEFAULT_WATCH_DELAY_S) -> None:
        super().__init__(app, disconnect=DisconnectWatch(watch_delay_s=watch_delay_s))


def _absorbed(task: asyncio.Task[Any], cancelled: set[asyncio.Task[Any]] | None, scope: Scope) -> bool:
    """For our disconnect cancellation out of the app: True when it is ours alone (swallow it)."""
    if cancelled is not None:
        cancelled.discard(task)
    if task.uncancel() > 0:
        return False  # somebody else (server shutdown) cancelled the task as well
    _log.info("client disconnected before the reply; handler cancelled", extra={"path": scope["path"]})
    return True
