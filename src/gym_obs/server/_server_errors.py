"""The top of a gym app's FastAPI stack: the gym layers' one frame (``_steps``), running Starlette's
server-error layer as its outermost step and its exception layer as its innermost.

FastAPI builds every app's stack as Starlette's ``ServerErrorMiddleware`` (an unhandled exception becomes a
500 reply, or the app's handler for 500/``Exception``, when no reply has started; then it is raised again
for the server to log), FastAPI's exception observer, FastAPI's body-limit frame, then the app's own
middlewares, the gym frame the outermost of them. Each is a frame every request passes, and the error
layer wraps ``send`` in a coroutine of its own to learn whether the reply started. For a gym request:

- the observer observes nothing (its requests carry no FastAPI telemetry: ``_native_telemetry``);
- the body-limit frame, in an app without a body limit, only passes the request on;
- whether the reply started is known to the request's exchange (``_exchange``), whose one ``send`` wrapper
  the gym frame makes.

So :func:`steps_on_top` puts the gym frame at the top of the stack in their place, with the error layer
as its step (:class:`ServerErrors`). The reply is Starlette's own: on an exception before the reply
started, its error layer runs, with the app's handler and debug flag, around that exception.

Inside the gym frame FastAPI puts Starlette's exception layer (``ExceptionMiddleware``: the app's exception
handlers, e.g. an ``HTTPException`` as its reply). On every request it puts the handlers in the scope (the
routes handle their own exceptions with them), makes a ``Request`` for the handlers, and wraps ``send``
in a coroutine of its own, again to learn whether the reply started; it only answers an exception. So
the frame runs it as its innermost step too (:class:`HandledErrors`): the frame puts the handlers in the
scope, and only an exception gets the layer, Starlette's own, around it.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.types import ASGIApp, ExceptionHandler, Receive, Scope, Send

from gym_obs.server._native_telemetry import EXCEPTION_OBSERVER, frame_kind
from gym_obs.server._steps import RequestSteps

__all__ = ["HandledErrors", "ServerErrors", "steps_on_top"]

#: FastAPI's body-limit frame, by module and name: with the exception observer, a frame that passes a gym
#: request on unchanged (in an app without a body limit)
_BODY_LIMIT: Final = ("fastapi._body_limit", "AppBodyLimitMiddleware")


class ServerErrors:
    """Starlette's server-error layer as the gym frame's outermost step (``_steps.ErrorStep``)."""

    __slots__ = ("debug", "handler")

    def __init__(self, handler: ExceptionHandler | None = None, debug: bool = False) -> None:
        self.handler = handler
        self.debug = debug

    async def reply(self, error: Exception, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer ``error`` (no reply has started) as Starlette's layer does; the frame then raises it again,
        as that layer does. A reply that fails raises its own error, as there."""
        traceback = error.__traceback__
        try:
            await ServerErrorMiddleware(_Raising(error), handler=self.handler, debug=self.debug)(
                scope, receive, send
            )
        except Exception as again:
            if again is not error:
                raise
        finally:
            error.__traceback__ = traceback  # (as the app raised it: without the reply's frames)


class HandledErrors:
    """Starlette's exception layer as the gym frame's innermost step (``_steps.HandledStep``)."""

    __slots__ = ("_layer", "app", "handlers")

    def __init__(self, layer: ExceptionMiddleware) -> None:
        self._layer = layer
        self.app = layer.app
        # (the layer's own dicts, as it puts them in the scope: handlers the app adds later are not in them)
        self.handlers = (layer._exception_handlers, layer._status_handlers)

    async def reply(
        self, error: Exception, scope: Scope, receive: Receive, send: Send, started: bool
    ) -> bool:
        """Answer ``error`` (raised by ``app``; ``started``: whether its reply started) as the layer does:
        with the app's handler for it, or, after the reply started, a ``RuntimeError`` raised from it when
        there is one. ``False``: no handler; the frame raises ``error`` again, as the layer does."""
        layer = copy.copy(self._layer)
        layer.app = _Raising(error, started)
        traceback = error.__traceback__
        try:
            await layer(scope, receive, _dropped if started else send)
        except Exception as again:
            if again is not error:
                raise
            error.__traceback__ = traceback  # (as the app raised it: without the layer's frames)
            return False
        return True


async def _dropped(message: Any) -> None:
    """The ``send`` of a reply that started: the layer is shown its start again, and nothing is sent."""


class _Raising:
    """An ASGI app that raises ``error``: what Starlette's layer answers (``started``: after showing it the
    start of a reply, for an error raised after its reply started)."""

    __slots__ = ("error", "started")

    def __init__(self, error: Exception, started: bool = False) -> None:
        self.error = error
        self.started = started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.started:
            await send({"type": "http.response.start", "status": 500, "headers": []})
        raise self.error


def steps_on_top(app: Any) -> None:
    """Build ``app``'s (a FastAPI app's) middleware stack with its gym frame (the outermost of its own
    middlewares) at the top, running the error layer as :class:`ServerErrors` (the app's handler and debug
    flag) and, when the frame wraps it directly (no other middleware between), the exception layer as
    :class:`HandledErrors`. The stack is left as FastAPI builds it when it is not as expected: another
    top, a frame before the gym frame that does something for a gym request (a body limit), or no gym
    frame."""
    build = getattr(app, "build_middleware_stack", None)
    if build is None:
        return

    def build_with_steps_on_top() -> ASGIApp:
        stack: ASGIApp = build()
        if type(stack) is not ServerErrorMiddleware:
            return stack
        passing = {EXCEPTION_OBSERVER}
        if getattr(app, "max_body_size", None) is None:
            passing.add(_BODY_LIMIT)
        node: Any = stack.app
        while frame_kind(node) in passing:
            node = node.app
        if not isinstance(node, RequestSteps):
            return stack
        node.errors = ServerErrors(stack.handler, stack.debug)
        layer = node.app
        if type(layer) is ExceptionMiddleware and all(
            hasattr(layer, name) for name in ("_exception_handlers", "_status_handlers")
        ):
            node.handled = HandledErrors(layer)
        return node

    app.build_middleware_stack = build_with_steps_on_top
