"""The per-request gym layers inside the app (sessions, failure reply, disconnect) run as steps of one frame.

Each concern keeps its own module and its own step object (``sessions.SessionLayer``,
``_failure_reply.FailureReplies``, ``_disconnect.DisconnectWatch``); ``_stack`` composes them in
``LAYER_ORDER``. A request passes them in one ``async def`` instead of one nested coroutine frame (and its
``await``) per layer: the layers passed every request through whether or not it needed them, and those
frames were a large share of what the gym layers cost with telemetry off. Nesting is kept by the
``try`` blocks of this frame, in the layers' order: the session is current around everything, the failure
log around the handler and the failure reply, the disconnect watch around the handler alone. With the
failure step, one context variable makes both the session and the failure log current (the exchange
holds them); a session step without it sets the sessions' own variable. With telemetry off the context
layer (``_context.PathContext``) is the first step (nothing sits between them): path segments, rollout
context and the exchange are then made in this frame too. In a gym server the frame is the top of the
FastAPI app's stack, with Starlette's server-error layer as its outermost step and its exception layer
as its innermost (``_server_errors``). No step wraps ``receive`` or ``send`` unless the request needs it
(a JSON-named session replays the body it read; a server other than uvicorn gets the disconnect watcher's
``receive``); ``send`` is the request's one :class:`~gym_obs.server._exchange.Exchange` wrapper.
"""

from __future__ import annotations

import asyncio
from contextvars import Token
from typing import Any, Final, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_obs.server._context import PathContext
from gym_obs.server._exchange import EXCHANGE_SCOPE_KEY, Exchange
from gym_obs.server._instrumentation import restore_after_instrumentation
from gym_obs.telemetry import inflight
from gym_obs.telemetry.propagation import ROLLOUT_ID

__all__ = ["DisconnectStep", "ErrorStep", "FailureStep", "HandledStep", "RequestSteps", "SessionStep"]

#: where Starlette's exception layer puts the app's exception handlers for the routes (``HandledStep``)
_HANDLERS_SCOPE_KEY: Final = "starlette.exception_handlers"

# What this frame needs of each step (the steps' modules import this one, so it names none of them).


class _Session(Protocol):
    ends: bool

    def end(self) -> None: ...


class SessionStep(Protocol):
    """``sessions.SessionLayer``."""

    excluded_paths: frozenset[str]

    def open(self, scope: Scope, exchange: Exchange | None = None) -> _Session | None: ...

    async def open_reading_body(
        self, scope: Scope, receive: Receive, exchange: Exchange | None = None
    ) -> tuple[_Session, Receive]: ...

    def enter(self, session: Any, /) -> Token[Any]: ...

    def leave(self, token: Token[Any], /) -> None: ...


class FailureStep(Protocol):
    """``_failure_reply.FailureReplies``."""

    restore_query: bool

    @staticmethod
    def report_hook(exchange: Exchange, message: Message, /) -> Message: ...

    def enter(self, exchange: Exchange) -> Token[Any]: ...

    def leave(self, token: Token[Any]) -> None: ...

    def settles(self, error: Exception, exchange: Exchange) -> bool: ...

    async def reply(self, error: Exception, exchange: Exchange, send: Send) -> None: ...


class _Polled(Protocol):
    #: the polled requests' tasks cancelled for a disconnect (``leave`` when not empty)
    cancelled: set[Any]

    def absorbs(self, scope: Scope) -> bool: ...

    def leave(self) -> None: ...


class ErrorStep(Protocol):
    """``_server_errors.ServerErrors``."""

    async def reply(self, error: Exception, scope: Scope, receive: Receive, send: Send) -> None: ...


class HandledStep(Protocol):
    """``_server_errors.HandledErrors``."""

    #: the app inside the exception layer this step runs in place of, and the handlers that layer puts in
    #: the scope (for the routes' own exception handling)
    app: ASGIApp
    handlers: tuple[Any, Any]

    async def reply(
        self, error: Exception, scope: Scope, receive: Receive, send: Send, started: bool
    ) -> bool: ...


class DisconnectStep(Protocol):
    """``_disconnect.DisconnectWatch``."""

    def poll(self, receive: Receive) -> _Polled | None: ...

    async def watched(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, exchange: Exchange
    ) -> None: ...


class RequestSteps:
    """Pure ASGI: the steps a server has (``None``: not in this server), in one frame per request.

    ``context`` (``_context.PathContext``): the context layer as the first step, for a stack where nothing
    sits between it and the app (telemetry off: no SERVER-span layer); it then runs inside FastAPI's
    error middleware, before routing, as it ran before it. A websocket gets it as a frame of its own.

    ``errors`` (``_server_errors.ServerErrors``, set when the stack is built): Starlette's server-error
    layer, for a frame that took its place at the top of the app's stack (``_server_errors.steps_on_top``);
    an exception no step settled is answered by it, unless the reply has started, and raised again.

    ``handled`` (``_server_errors.HandledErrors``, set with ``errors``): Starlette's exception layer (the
    app's exception handlers), for a frame that took its place too, as the innermost step: an HTTP request
    then runs ``handled.app``, the app the layer wrapped (``app`` still includes the layer: a websocket, and
    a request the disconnect step's watcher runs, pass it as before).
    """

    __slots__ = (
        "_enter_failures",
        "_leave_failures",
        "_not_http_app",
        "_report_hook",
        "app",
        "context",
        "disconnect",
        "errors",
        "failures",
        "handled",
        "sessions",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        context: PathContext | None = None,
        sessions: SessionStep | None = None,
        failures: FailureStep | None = None,
        disconnect: DisconnectStep | None = None,
    ) -> None:
        self.app = app
        self.context = context
        self.sessions = sessions
        self.failures = failures
        self.disconnect = disconnect
        self.errors: ErrorStep | None = None
        self.handled: HandledStep | None = None
        self._not_http_app: ASGIApp = self._not_http if context is None else context.around(self._not_http)
        # The failure step's static methods, looked up once: through the step object each would be a slow
        # look-up per request on Python 3.11 (a static method is not specialized there).
        if failures is not None:
            self._report_hook = failures.report_hook
            self._enter_failures = failures.enter
            self._leave_failures = failures.leave

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._not_http_app(scope, receive, send)
            return
        exchange: Exchange | None = scope.get(EXCHANGE_SCOPE_KEY)
        # (``Exchange.join``, written out: one call less on every request)
        if exchange is None:  # (else made, and bound, by the context layer outside: telemetry on)
            exchange = scope[EXCHANGE_SCOPE_KEY] = Exchange()
            send = exchange.bind(send)  # the one send wrapper of the steps
        elif not exchange.bound:
            send = exchange.bind(send)
        rollout: Token[str | None] | None = None
        try:
            context = self.context
            if context is not None:
                if scope["path"] in context.control_paths and context.control is not None:
                    await context.control(scope, receive, send)
                    return
                rollout_id = context.open(scope, exchange)
                if rollout_id is not None:
                    # Every hop of a rollout carries its id (set directly, as ``PathContextMiddleware`` does),
                    # and is in the in-flight table while it runs (agents only).
                    rollout = ROLLOUT_ID.set(rollout_id)
                    tracked = inflight.rollout(rollout_id)
                    tracked.__enter__()
            failures = self.failures
            if failures is not None and failures.restore_query:
                restore_after_instrumentation(scope)  # the query the path middleware hid from the SERVER span
            session: _Session | None = None
            sessions = self.sessions
            if sessions is not None and scope["path"] not in sessions.excluded_paths:
                outer_session = exchange.session  # (a session step nested in another: restored at the end)
                session = sessions.open(scope, exchange)
                if session is None:
                    session, receive = await sessions.open_reading_body(scope, receive, exchange)
            token: Token[Any] | None = None
            if failures is not None:
                exchange.report_hook = self._report_hook  # the exchange adds the report header
                # One context variable for the request: the exchange holds its failure log (made on the first
                # record) and its session.
                token = self._enter_failures(exchange)
            elif session is not None:
                token = sessions.enter(session)  # type: ignore[union-attr]
            try:
                disconnect = self.disconnect
                sweeper = None if disconnect is None else disconnect.poll(receive)
                if sweeper is None and disconnect is not None:
                    # not uvicorn: a watcher task reads ``receive`` for the app (the whole app, its
                    # exception layer too)
                    await disconnect.watched(self.app, scope, receive, send, exchange)
                else:
                    try:
                        handled = self.handled
                        if handled is None:
                            await self.app(scope, receive, send)
                        else:
                            scope[_HANDLERS_SCOPE_KEY] = handled.handlers  # (what the layer sets)
                            try:
                                await handled.app(scope, receive, send)
                            except Exception as error:
                                started = exchange.response_started
                                if not await handled.reply(error, scope, receive, send, started):
                                    raise
                    except asyncio.CancelledError:
                        if sweeper is None or not sweeper.absorbs(scope):
                            raise
                    finally:
                        if sweeper is not None and sweeper.cancelled:  # (not empty: after a disconnect)
                            sweeper.leave()
            except Exception as error:
                if failures is None or not failures.settles(error, exchange):
                    raise
                if not exchange.caller_gone:
                    await failures.reply(error, exchange, send)
            finally:
                if token is not None:
                    if failures is not None:
                        self._leave_failures(token)
                    else:
                        sessions.leave(token)  # type: ignore[union-attr]
                if session is not None:
                    exchange.session = outer_session  # (the session refers to the exchange: no cycle)
                    if session.ends:
                        session.end()
        except Exception as unhandled:
            errors = self.errors
            if errors is None or exchange.response_started:
                raise
            await errors.reply(unhandled, scope, receive, send)
            raise  # (as Starlette's layer does: the server logs it)
        finally:
            if rollout is not None:
                tracked.__exit__(None, None, None)
                ROLLOUT_ID.reset(rollout)

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A websocket has a session (no failure log, no disconnect watch); lifespan passes through."""
        failures = self.failures
        if failures is not None and failures.restore_query:
            restore_after_instrumentation(scope)
        sessions = self.sessions
        if sessions is None or scope["type"] != "websocket" or scope["path"] in sessions.excluded_paths:
            await self.app(scope, receive, send)
            return
        session = sessions.open(scope)
        if session is None:
            session, receive = await sessions.open_reading_body(scope, receive)
        token = sessions.enter(session)
        try:
            await self.app(scope, receive, send)
        finally:
            sessions.leave(token)
            if session.ends:
                session.end()
