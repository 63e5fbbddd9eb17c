"""Client-disconnect cancellation: a caller that went away before the reply cancels its handler.

uvicorn only marks a request as disconnected; the handler keeps running (a rollout step, a model call)
for a caller that will never read the answer. This pure ASGI middleware cancels the handler's task when
the client disconnects before the response starts, and drops anything the handler sends afterwards. It is
a step (``DisconnectWatch``) of the gym layers' one frame (``_steps``), innermost;
``DisconnectCancelMiddleware`` runs it on its own.

One sweeper task per event loop (alive only while requests are in flight) looks at the running requests
every ``watch_delay_s``. Under uvicorn (``receive`` is its request cycle's, which keeps ``disconnected``
and ``response_started`` flags, set by the transport whether or not anybody reads) a request costs a dict
insert and removal and the sweeper reads the flags: no task, no timer, no wrapper, a disconnect noticed
within one sweep. (uvicorn stops reading a socket whose unread body passed its high-water mark, so a
handler that never reads a large body sees its caller leave only when it reads.) Under any other server,
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

from gym_obs.server._exchange import Exchange
from gym_obs.server._steps import RequestSteps
from gym_obs.server._tasks import running_loop as _running_loop
from gym_obs.server._tasks import running_task as _running_task
from gym_obs.server._tasks import thread_id as _thread_id

__all__ = ["DEFAULT_WATCH_DELAY_S", "DisconnectCancelMiddleware", "DisconnectWatch"]

DEFAULT_WATCH_DELAY_S: Final = 0.02
_DISCONNECT: Final[Message] = {"type": "http.disconnect"}

_log = logging.getLogger("gym_obs.server")


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

    __slots__ = ("cancelled", "interval", "loop", "polled", "running", "task", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        #: the thread ``loop`` runs in (the sweeper is made on it, by a request running on the loop)
        self.thread = _thread_id()
        self.interval = interval
        self.running: set[_Watch] = set()
        #: uvicorn requests: exchange -> (its request cycle, its task); keyed by the exchange, which the
        #: request's frame holds, so the request leaves with a ``pop`` and no task look-up
        self.polled: dict[Exchange, tuple[Any, asyncio.Task[Any]]] = {}
        #: polled tasks this layer cancelled for a disconnect (the layer absorbs their CancelledError)
        self.cancelled: set[asyncio.Task[Any]] = set()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.task is None:
            self.task = self.loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        try:
            while self.running or self.polled:
                await asyncio.sleep(self.interval)
                for exchange, (cycle, task) in tuple(self.polled.items()):
                    if cycle.disconnected and not cycle.response_started and task not in self.cancelled:
                        self.cancelled.add(task)
                        exchange.caller_gone = True
                        task.cancel()
                for watch in tuple(self.running):
                    if not watch.aged:
                        watch.aged = True
                    elif watch.start():
                        self.running.discard(watch)
        finally:
            self.task = None

    def absorbs(self, scope: Scope) -> bool:
        """For a ``CancelledError`` out of the running polled request's app: True when it is this layer's
        own disconnect cancellation alone (swallow it)."""
        task = _running_task(self.loop)  # (the request's: it runs on this loop, on this thread)
        return task is not None and task in self.cancelled and _absorbed(task, self.cancelled, scope)

    def leave(self) -> None:
        """The running polled request is over and was removed from :attr:`polled` (by the frame, with a
        ``pop``: a re-entered layer may have removed it already); called only while :attr:`cancelled`
        is not empty (after a disconnect)."""
        task = _running_task(self.loop)  # (the request's, as in ``absorbs``)
        if task is not None and task in self.cancelled:
            self.cancelled.discard(task)
            task.uncancel()  # the handler swallowed our cancellation: undo it


class DisconnectWatch:
    """The disconnect step of one server: cancel the handler when the client disconnects before the
    response starts."""

    __slots__ = ("_sweeper", "watch_delay_s")

    def __init__(self, *, watch_delay_s: float = DEFAULT_WATCH_DELAY_S) -> None:
        self.watch_delay_s = watch_delay_s
        self._sweeper: _Sweeper | None = None

    def poll(self, receive: Receive, exchange: Exchange) -> _Sweeper | None:
        """Under uvicorn, register the running request with its loop's sweeper and return the sweeper
        (then its ``absorbs`` around the app, and ``polled.pop(exchange)`` and, after a disconnect,
        ``leave`` when it ends); ``None``: run the app under :meth:`watched` (another server, or no
        task).

        Every request of a server passes here, so it is one call doing only the registration, and it
        does not ask for the running loop (``asyncio.get_running_loop`` makes a ``getpid`` system call
        on every call before Python 3.12): the sweeper keeps its loop and the thread that loop runs
        in; on that thread, the task that loop is running now (read from the running-task table) is
        the one running this request, as a thread runs one loop at a time. The first request on a
        loop, or on another thread, asks for the loop.
        """
        cycle = getattr(receive, "__self__", None)
        if type(getattr(cycle, "disconnected", None)) is not bool:
            return None
        sweeper = self._sweeper
        task = _running_task(sweeper.loop) if sweeper is not None and sweeper.thread == _thread_id() else None
        if sweeper is None or task is None:  # a new loop or thread (no task: the other path runs the app)
            loop = _running_loop()
            task = _running_task(loop)
            if task is None:
                return None
            sweeper = self._sweeper_for(loop)
        sweeper.polled[exchange] = (cycle, task)
        if sweeper.task is None:
            sweeper.start()
        return sweeper

    def _sweeper_for(self, loop: asyncio.AbstractEventLoop) -> _Sweeper:
        """The sweeper of ``loop`` (a new one when the server runs on a new loop, as tests do)."""
        sweeper = self._sweeper
        if sweeper is None or sweeper.loop is not loop:
            sweeper = self._sweeper = _Sweeper(loop, self.watch_delay_s)
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
