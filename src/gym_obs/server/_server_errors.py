"""The top of a gym app's FastAPI stack: the gym layers' one frame (``_steps``), running Starlette's
server-error layer as its outermost step.

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
"""

from __future__ import annotations

from typing import Any, Final

from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, ExceptionHandler, Receive, Scope, Send

from gym_obs.server._native_telemetry import EXCEPTION_OBSERVER, frame_kind
from gym_obs.server._steps import RequestSteps

__all__ = ["ServerErrors", "steps_on_top"]

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


class _Raising:
    """An ASGI app that raises ``error``: what Starlette's layer answers."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise self.error


def steps_on_top(app: Any) -> None:
    """Build ``app``'s (a FastAPI app's) middleware stack with its gym frame (the outermost of its own
    middlewares) at the top, running the error layer as :class:`ServerErrors` (the app's handler and debug
    flag). The stack is left as FastAPI builds it when it is not as expected: another top, a frame before
    the gym frame that does something for a gym request (a body limit), or no gym frame."""
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
        return node

    app.build_middleware_stack = build_with_steps_on_top
