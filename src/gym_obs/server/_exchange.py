"""The one object a request's gym layers share: created once per request, kept in the ASGI scope.

Each gym layer has one concern (see ``_stack``), but several need the same facts about the reply: whether it
has started (a failure reply is possible only before), whether the caller is gone (then nothing more is
sent), and a say in the reply's first message (the failure report header, a new session's token). Instead of
every layer wrapping ``send`` to find out, the first layer that needs it binds the request's ``send`` once
(:meth:`Exchange.bind`); the others register hooks on the ``http.response.start`` message. Hooks run
innermost layer first, as if each layer had wrapped ``send`` itself.

The outermost gym layer (``_context``, or, with telemetry off, the gym layers' one frame starting with the
context step: ``_steps``) creates the exchange and binds ``send``, so the layers inside get the shared
wrapper and only look the exchange up (Starlette's server-error layer too, run by that frame:
``_server_errors``). Cost per request: one small object and one ``send`` wrapper for all the layers
together. The wrapper is a plain function returning the wrapped ``send``'s awaitable, not a coroutine of
its own: every message of every request passes it.

The exchange is also the request's failure-log holder (``failures.transport``): the failure layer makes it
current, and the log is made only when a failure is recorded; the report header is added on the reply
start only when there is one to report. It carries the request's session too, so that one context
variable (set once per request) makes the session and the failure log current.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from starlette.types import Message, Send

if TYPE_CHECKING:
    from gym_obs.failures.report import FailureReport
    from gym_obs.failures.transport import RequestFailureLog

__all__ = ["EXCHANGE_SCOPE_KEY", "Exchange", "StartHook"]

EXCHANGE_SCOPE_KEY: Final = "gym_obs.exchange"

StartHook = Callable[["Exchange", Message], Message]
"""Called with the request's exchange and its ``http.response.start`` message; returns the message to send."""


class Exchange:
    """One request and its reply, as the gym layers see it (each field is written by one layer).

    The fields are class-level defaults, not set in an ``__init__``: an exchange is made on every request
    and most fields keep their default (an exchange made in C, with no Python frame, and only the
    fields a request changes stored on it).
    """

    #: whether the request's ``send`` is already behind this exchange's wrapper (:meth:`bind`)
    bound: bool = False
    _hooks: list[StartHook] | None = None
    response_started: bool = False
    #: the reply's status (0 until the reply starts), for the SERVER span and its duration point
    status: int = 0
    #: set by the disconnect layer when it cancelled the handler for a caller that went away
    caller_gone: bool = False
    #: the failure layer's log of this request, and the report of the failure it replies with
    failure_log: RequestFailureLog | None = None
    final_report: FailureReport | None = None
    #: the failure layer's start hook adding the report header: run after the other hooks (the
    #: failure layer is the outermost that hooks), and only when there is a log or a final report
    report_hook: StartHook | None = None
    #: the request's session (the sessions step's ``RequestSession``): the exchange is the request's
    #: failure-log holder, so the one context variable that holds it makes the session current too
    #: (``sessions.current_session_id``); cleared when the request ends (the session refers back here)
    session: Any = None
    #: the request's headers by name (the last value of each), built once (in C) by the context layer
    #: for the layers inside that look a header up; ``None`` when no context layer built it
    headers_by_name: dict[bytes, bytes] | None = None

    @staticmethod
    def join(scope: MutableMapping[str, Any], send: Send) -> tuple[Exchange, Send]:
        """The request's exchange (created here when no outer gym layer did: a layer used on its own) and
        the ``send`` to use (see :meth:`bind`): what a layer does first."""
        exchange: Exchange | None = scope.get(EXCHANGE_SCOPE_KEY)
        if exchange is None:
            exchange = scope[EXCHANGE_SCOPE_KEY] = Exchange()
        elif exchange.bound:
            return exchange, send  # (the common case, without the call to bind)
        return exchange, exchange.bind(send)

    def bind(self, send: Send) -> Send:
        """The ``send`` for a layer to use: the first call wraps ``send`` (marks the reply started, drops
        messages once the caller is gone, runs the hooks); later calls, from layers further in, get theirs
        back unchanged (already behind it).

        The wrapper keeps ``send`` in its closure, not on the exchange: ``send`` leads back to the scope
        (ASGI servers and middlewares close over it), and the scope holds the exchange, so a reference
        from here would make every request a reference cycle, left to the garbage collector.
        """
        if self.bound:
            return send
        self.bound = True
        # The fields the wrapper reads on every request, stored on the exchange: read through an instance,
        # a class-level default is a slow look-up on Python 3.11 (no specialization), a stored one is not.
        self.caller_gone = False
        self._hooks = None
        self.failure_log = None
        self.final_report = None
        self.session = None

        def exchange_send(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                if self.caller_gone:
                    return _nothing()  # the handler was cancelled for a caller that went away
                self.response_started = True
                hooks = self._hooks
                if hooks is not None:
                    for hook in reversed(hooks):
                        message = hook(self, message)
                report_hook = self.report_hook
                if report_hook is not None and (
                    self.failure_log is not None or self.final_report is not None
                ):
                    message = report_hook(self, message)
            elif self.caller_gone:
                return _nothing()
            return send(message)

        return exchange_send

    def on_start(self, hook: StartHook) -> None:
        """Run ``hook`` on the reply's ``http.response.start`` message (register before the app runs)."""
        if self._hooks is None:
            self._hooks = [hook]
        else:
            self._hooks.append(hook)


async def _nothing() -> None:
    """What ``send`` awaits for a message dropped because the caller is gone."""
