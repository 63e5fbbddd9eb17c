"""Client-disconnect cancellation: a caller that went away before the reply cancels its handler.

uvicorn only marks a request as disconnected; the handler keeps running (a rollout step, a model call)
for a caller that will never read the answer. This pure ASGI middleware cancels the handler's task when
the client disconnects before the response starts, and drops anything the handler sends afterwards.

Cost on the fast path is a set insert and removal: one sweeper task per event loop (alive only while
requests are in flight) looks at the running requests every ``watch_delay_s`` and starts a watcher task
only for those it has already seen on its previous pass, so quick requests never pay for a task or a timer
and a disconnect is noticed within two sweeps.

This layer wraps only ``receive``. Whether the reply has started is the request's
:class:`~gym_obs.server._exchange.Exchange`'s to know, and once this layer says the caller is gone
(``Exchange.caller_gone``) the exchange's ``send`` (the one wrapper every layer shares) drops what the
handler still sends, and the failure-reply layer outside sends no failure reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_obs.server._exchange import Exchange

__all__ = ["DEFAULT_WATCH_DELAY_S", "DisconnectCancelMiddleware"]

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
    """One per event loop: starts watchers for requests seen on two consecutive passes."""

    __slots__ = ("interval", "loop", "running", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self.running: set[_Watch] = set()
        self.task: asyncio.Task[None] | None = None

    def add(self, watch: _Watch) -> None:
        self.running.add(watch)
        if self.task is None:
            self.task = self.loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        try:
            while self.running:
                await asyncio.sleep(self.interval)
                for watch in tuple(self.running):
                    if not watch.aged:
                        watch.aged = True
                    elif watch.start():
                        self.running.discard(watch)
        finally:
            self.task = None


class DisconnectCancelMiddleware:
    """Cancel the handler when the client disconnects before the response starts (pure ASGI)."""

    def __init__(self, app: ASGIApp, *, watch_delay_s: float = DEFAULT_WATCH_DELAY_S) -> None:
        self.app = app
        self.watch_delay_s = watch_delay_s
        self._sweeper: _Sweeper | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task() if scope["type"] == "http" else None
        if task is None:
            await self.app(scope, receive, send)
            return
        exchange, send = Exchange.join(scope, send)  # its send drops messages once the caller is gone
        watch = _Watch(receive, task, exchange)
        sweeper = self._sweeper
        if sweeper is None or sweeper.loop is not task.get_loop():
            sweeper = self._sweeper = _Sweeper(task.get_loop(), self.watch_delay_s)
        sweeper.add(watch)
        try:
            await self.app(scope, watch.receive, send)
        except asyncio.CancelledError:
            if not self._absorb(watch, scope):
                raise
        finally:
            self._end(watch)

    @staticmethod
    def _absorb(watch: _Watch, scope: Scope) -> bool:
        """For a CancelledError out of the app: True when it was our disconnect cancellation (swallow it)."""
        if not watch.cancelled_by_us:
            return False
        watch.cancelled_by_us = False  # handled: _end() must not uncancel again
        watch.close()
        if watch.task.uncancel() > 0:
            return False  # somebody else (server shutdown) cancelled the task as well
        _log.info("client disconnected before the reply; handler cancelled", extra={"path": scope["path"]})
        return True

    def _end(self, watch: _Watch) -> None:
        """Stop tracking; undo our cancellation if the handler swallowed it."""
        if self._sweeper is not None:
            self._sweeper.running.discard(watch)
        watch.close()
        if watch.cancelled_by_us:
            watch.cancelled_by_us = False
            watch.task.uncancel()
