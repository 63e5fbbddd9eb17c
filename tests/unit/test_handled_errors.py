"""Starlette's exception layer as the gym frame's innermost step (``server/_server_errors.HandledErrors``):
the app's exception handlers answer as the layer does, with whether the reply started read off the
request's exchange instead of a ``send`` wrapper of the layer's own."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_obs.config import parse_global_config
from gym_obs.server import SimpleServer
from gym_obs.server._server_errors import HandledErrors, steps_on_top
from gym_obs.server._steps import RequestSteps
from tests.unit.test_server_errors import Boom, _comparable, _run, _scope
from tests.unit.test_server_span import stack_types

HANDLERS_KEY = "starlette.exception_handlers"


async def _on_boom(request: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"boom": str(error)}, status_code=503, headers={"x-handled": "boom"})


def _on_teapot(request: Request, error: Exception) -> PlainTextResponse:
    return PlainTextResponse(f"sync {type(error).__name__}", status_code=418)


def _layer(app: ASGIApp) -> ExceptionMiddleware:
    """The layer as FastAPI builds it for an app with a handler for ``Boom`` and one for status 418."""
    return ExceptionMiddleware(app, handlers={Boom: _on_boom, 418: _on_teapot})


def _raising(error: Exception, *, after_start: bool = False) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if after_start:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        raise error

    return app


async def _answers(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(sorted(scope[HANDLERS_KEY][1])).encode()})


def _frames(app: ASGIApp) -> tuple[RequestSteps, RequestSteps]:
    """The gym frame around the layer around ``app``: with the layer as its step, and as a frame below it."""
    lifted, kept = RequestSteps(_layer(app)), RequestSteps(_layer(app))
    lifted.handled = HandledErrors(lifted.app)  # type: ignore[arg-type]
    return lifted, kept


@pytest.mark.parametrize(
    "make",
    [
        lambda: _raising(HTTPException(404, headers={"x-why": "gone"})),  # the layer's own HTTP error reply
        lambda: _raising(HTTPException(204)),  # ... without a body
        lambda: _raising(HTTPException(418)),  # the app's handler for a status, sync
        lambda: _raising(Boom("handled")),  # the app's handler for a class, async
        lambda: _raising(Boom("too late"), after_start=True),  # handled, after the reply started: an error
        lambda: _raising(ValueError("no handler")),  # raised again
        lambda: _raising(ValueError("no handler, late"), after_start=True),
        lambda: _answers,  # no error: the app sees the handlers the layer puts in the scope
    ],
    ids=[
        "http-404",
        "http-204",
        "status-handler",
        "class-handler",
        "handled-after-start",
        "unhandled",
        "unhandled-after-start",
        "no-error",
    ],
)
async def test_it_replies_and_raises_as_starlettes_layer(make: Any) -> None:
    lifted, kept = _frames(make())
    theirs, their_error = await _run(kept, _scope())
    ours, our_error = await _run(lifted, _scope())
    assert _comparable(ours) == _comparable(theirs) and (ours or our_error is not None)
    assert type(our_error) is type(their_error) and str(our_error) == str(their_error)
    assert type(getattr(our_error, "__cause__", None)) is type(getattr(their_error, "__cause__", None))


async def test_an_unhandled_exception_keeps_its_own_traceback() -> None:
    lifted, _ = _frames(_raising(ValueError("no handler")))
    _, error = await _run(lifted, _scope())
    assert isinstance(error, ValueError)
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert frames[-1] == "app" and "wrapped_app" not in frames and "_Raising" not in " ".join(frames)


async def test_a_handled_exception_is_left_without_a_traceback_as_starlette_leaves_it() -> None:
    """A handled exception instance an app raises again on every request does not grow a traceback."""
    reused = Boom("reused")
    lifted, _ = _frames(_raising(reused))
    for _ in range(2):
        sent, error = await _run(lifted, _scope())
        assert error is None and sent[0]["status"] == 503
        assert reused.__traceback__ is None


async def test_a_failing_handler_raises_its_own_error() -> None:
    async def broken(request: Request, error: Exception) -> PlainTextResponse:
        raise KeyError("the handler broke")

    frame = RequestSteps(ExceptionMiddleware(_raising(Boom("x")), handlers={Boom: broken}))
    frame.handled = HandledErrors(frame.app)  # type: ignore[arg-type]
    _, error = await _run(frame, _scope())
    assert isinstance(error, KeyError)


def _layer_frames_of_running_app(seen: list[list[str]]) -> ASGIApp:
    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append([frame.name for frame in traceback.extract_stack()])
        if scope["type"] == "http":
            await _answers(scope, receive, send)

    return probe


@pytest.mark.parametrize(("kind", "through_layer"), [("http", False), ("websocket", True)])
async def test_only_an_http_request_skips_the_layers_frame(kind: str, through_layer: bool) -> None:
    """A websocket passes the layer as its own frame, as before; an HTTP request runs the app the layer
    wrapped, with the layer's handlers in its scope."""
    seen: list[list[str]] = []
    lifted, _ = _frames(_layer_frames_of_running_app(seen))
    scope = _scope(kind=kind)
    await lifted(scope, _receive_nothing, _send_nothing)
    (stack,) = seen
    assert ("wrapped_app" in stack) is through_layer
    layer: Any = lifted.app
    assert scope[HANDLERS_KEY] == (layer._exception_handlers, layer._status_handlers)


async def _receive_nothing() -> Any:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send_nothing(message: Any) -> None:
    pass


def _app_with_steps(*between: type) -> FastAPI:
    app = FastAPI()
    for middleware in between:
        app.add_middleware(middleware)
    app.add_middleware(RequestSteps)  # (added last: the outermost of the app's own middlewares)
    return app


def test_the_frame_at_the_top_takes_the_layer_it_wraps() -> None:
    app = _app_with_steps()
    app.add_exception_handler(Boom, _on_boom)
    steps_on_top(app)
    top: Any = app.build_middleware_stack()
    assert type(top) is RequestSteps and isinstance(top.handled, HandledErrors)
    assert type(top.app) is ExceptionMiddleware and top.handled.app is top.app.app
    assert top.handled.handlers[0][Boom] is _on_boom


def test_a_middleware_between_keeps_the_layer_a_frame_of_its_own() -> None:
    class Between:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await self.app(scope, receive, send)

    app = _app_with_steps(Between)
    steps_on_top(app)
    top: Any = app.build_middleware_stack()
    assert type(top) is RequestSteps and top.handled is None
    layers = stack_types(app)
    assert layers[0] == "RequestSteps" and layers[1].endswith(".Between")
    assert layers[2] == "ExceptionMiddleware"


def _routes(app: FastAPI) -> FastAPI:
    @app.get("/conflict")
    async def conflict() -> None:
        raise HTTPException(409, detail="taken", headers={"x-why": "taken"})

    @app.get("/boom")
    async def boom() -> None:
        raise Boom("route")

    @app.get("/items/{item}")
    async def item(item: int) -> dict[str, int]:
        return {"item": item}

    @app.post("/only-post")
    async def only_post() -> dict[str, bool]:
        return {"ok": True}

    app.add_exception_handler(Boom, _on_boom)
    return app


class _ErrorsServer(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        return _routes(FastAPI())


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/conflict"),  # an HTTP error raised in a route
        ("GET", "/boom"),  # the app's handler
        ("GET", "/items/x"),  # a validation error (FastAPI's handler)
        ("GET", "/nowhere"),  # not found: raised by the router, outside any route
        ("GET", "/only-post"),  # method not allowed: raised by the route, outside its handler
    ],
)
async def test_a_gym_server_answers_errors_its_app_handles_as_fastapi_does(method: str, path: str) -> None:
    config = parse_global_config(
        {
            "servers": {
                "errors": {
                    "entrypoint": f"{__name__}:_ErrorsServer",
                    "server_type": "resources_servers",
                    "port": 24602,
                }
            }
        }
    )
    gym: Any = _ErrorsServer("errors", config).build_app()
    assert stack_types(gym)[0] == "RequestSteps"
    scope = _scope(path) | {"method": method}
    ours, our_error = await _run(gym, dict(scope))
    theirs, their_error = await _run(_routes(FastAPI()), dict(scope))
    assert our_error is None and their_error is None
    ours_start, theirs_start = ours[0], theirs[0]
    assert ours_start["status"] == theirs_start["status"] >= 400
    assert ours[1]["body"] == theirs[1]["body"]
    their_headers = dict(theirs_start["headers"])
    assert {k: v for k, v in dict(ours_start["headers"]).items() if k in their_headers} == their_headers
