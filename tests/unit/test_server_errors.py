"""The top of a gym app's stack (``server/_server_errors.py``): the gym frame, running Starlette's
server-error layer as a step; Starlette's replies and re-raises, with whether the reply started read off the
request's exchange instead of a second ``send`` wrapper."""

from __future__ import annotations

import traceback
from typing import Any, ClassVar

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from opentelemetry.trace import SpanKind
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_obs.config import parse_global_config
from gym_obs.server import SimpleServer
from gym_obs.server._exchange import EXCHANGE_SCOPE_KEY, Exchange
from gym_obs.server._server_errors import ServerErrors, steps_on_top
from gym_obs.server._steps import RequestSteps
from gym_obs.telemetry.testing import Capture, telemetry_state
from tests.unit.test_server_span import stack_types

STATE = telemetry_state()


class Boom(RuntimeError):
    pass


def _frame(app: ASGIApp, handler: Any = None, debug: bool = False) -> RequestSteps:
    """The gym frame around ``app`` with the error step alone, as the top of a gym app's stack."""
    frame = RequestSteps(app)
    frame.errors = ServerErrors(handler, debug)
    return frame


def _scope(path: str = "/", kind: str = "http", accept: bytes = b"*/*") -> dict[str, Any]:
    return {
        "type": kind, "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"t"), (b"accept", accept)], "client": ("127.0.0.1", 5), "server": ("t", 80),
    }  # fmt: skip


async def _run(app: ASGIApp, scope: dict[str, Any]) -> tuple[list[Message], BaseException | None]:
    """What ``app`` sent for ``scope``, and what it raised."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    try:
        await app(scope, receive, send)
    except BaseException as error:  # (the test compares what each layer raises)
        return sent, error
    return sent, None


async def _fails_before_reply(scope: Scope, receive: Receive, send: Send) -> None:
    raise Boom("before the reply")


async def _fails_after_reply_started(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    raise Boom("after the reply started")


async def _answers(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _async_handler(request: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"handled": type(error).__name__}, status_code=503)


def _sync_handler(request: Request, error: Exception) -> PlainTextResponse:
    return PlainTextResponse(f"sync {type(error).__name__}", status_code=502)


def _comparable(messages: list[Message]) -> list[tuple[Any, ...]]:
    """The messages without what a debug traceback varies in: its frames (the reply's own frames are on a
    debug page made here) and so its length."""
    shown: list[tuple[Any, ...]] = []
    for message in messages:
        if message["type"] == "http.response.start":
            headers = dict(message["headers"])
            if b"content-length" in headers and message["status"] == 500:
                headers[b"content-length"] = b"<length>"
            shown.append(("start", message["status"], sorted(headers.items())))
        else:
            body = message.get("body", b"")
            traced = b"Traceback" in body or b"<html>" in body
            shown.append(("body", b"<traceback>" if traced else body, message.get("more_body")))
    return shown


@pytest.mark.parametrize(
    ("app", "handler", "debug", "accept"),
    [
        (_fails_before_reply, None, False, b"*/*"),  # Starlette's plain 500
        (_fails_before_reply, _async_handler, False, b"*/*"),  # the app's 500 handler, async
        (_fails_before_reply, _sync_handler, False, b"*/*"),  # and sync
        (_fails_before_reply, None, True, b"*/*"),  # debug: the traceback, as text
        (_fails_before_reply, None, True, b"text/html"),  # and as a page
        (_fails_after_reply_started, None, False, b"*/*"),  # too late to reply: raised only
        (_answers, None, False, b"*/*"),  # no error: the reply as sent
    ],
    ids=["default", "async-handler", "sync-handler", "debug-text", "debug-html", "after-start", "no-error"],
)
async def test_it_replies_and_raises_as_starlettes_layer(
    app: ASGIApp, handler: Any, debug: bool, accept: bytes
) -> None:
    scope = _scope(accept=accept)
    theirs, their_error = await _run(ServerErrorMiddleware(app, handler=handler, debug=debug), dict(scope))
    ours, our_error = await _run(_frame(app, handler, debug), dict(scope))
    assert _comparable(ours) == _comparable(theirs)
    assert type(our_error) is type(their_error) and str(our_error) == str(their_error)
    if debug:  # the page shows the app's exception and where the app raised it
        for shown in (b"Boom", b"before the reply", b"_fails_before_reply"):
            assert shown in ours[-1]["body"]


async def test_the_raised_exception_keeps_its_own_traceback() -> None:
    """The exception the server logs is the app's, raised from where the app raised it: the frames of the
    reply made for it are not in its traceback."""
    _, error = await _run(_frame(_fails_before_reply), _scope())
    assert isinstance(error, Boom)
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert frames[-1] == "_fails_before_reply"
    assert "_Raising" not in " ".join(frames) and frames.count("__call__") == 1


async def test_a_failing_reply_is_what_is_raised() -> None:
    async def broken_handler(request: Request, error: Exception) -> PlainTextResponse:
        raise ValueError("the handler broke")

    _, error = await _run(_frame(_fails_before_reply, broken_handler), _scope())
    assert isinstance(error, ValueError) and str(error) == "the handler broke"


async def test_the_app_gets_the_exchange_wrapper_and_no_other() -> None:
    """The app's ``send`` is the request's exchange wrapper around the server's own ``send``: one wrapper
    per request for the gym layers and this layer together; the exchange records the reply."""
    seen: dict[str, Any] = {}

    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        seen["send"] = send
        seen["exchange"] = scope[EXCHANGE_SCOPE_KEY]
        await _answers(scope, receive, send)

    sent, error = await _run(_frame(probe), _scope())
    assert error is None and [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    exchange: Exchange = seen["exchange"]
    assert exchange.bound and exchange.response_started and exchange.status == 204
    closed_over = [cell.cell_contents for cell in seen["send"].__closure__]
    assert seen["send"].__qualname__ == "Exchange.bind.<locals>.exchange_send"
    assert any(getattr(value, "__qualname__", "") == "_run.<locals>.send" for value in closed_over)


async def test_an_exchange_made_outside_is_joined() -> None:
    """Under the context layer (telemetry on), the exchange is made and bound outside the app: it is the one
    this layer reads, and ``send`` is not wrapped again."""
    outer = Exchange()

    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope[EXCHANGE_SCOPE_KEY] is outer and send is wrapped
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise Boom("after the reply started")

    sent: list[Message] = []

    async def server_send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    scope = _scope()
    scope[EXCHANGE_SCOPE_KEY] = outer
    wrapped = outer.bind(server_send)
    with pytest.raises(Boom):
        await _frame(probe)(scope, receive, wrapped)
    assert [m["type"] for m in sent] == ["http.response.start"]  # started: no error reply after it


@pytest.mark.parametrize("kind", ["lifespan", "websocket"])
async def test_other_scopes_pass_through(kind: str) -> None:
    seen: list[Any] = []

    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((EXCHANGE_SCOPE_KEY in scope, send))
        raise Boom(kind)

    scope = _scope(kind=kind)
    with pytest.raises(Boom):
        await _frame(probe)(scope, _never, _drop)
    assert seen == [(False, _drop)]


async def _never() -> Message:
    raise AssertionError("not read")


async def _drop(message: Message) -> None:
    raise AssertionError("nothing is sent")


def _with_steps(**options: Any) -> FastAPI:
    app = FastAPI(**options)
    app.add_middleware(RequestSteps)
    return app


def test_the_gym_frame_takes_the_top_with_the_apps_handler_and_debug() -> None:
    """The error layer, the exception observer and the body-limit frame (no body limit) make way for the
    gym frame; what sits below it is as FastAPI built it."""
    app = _with_steps(debug=True)
    app.add_exception_handler(500, _async_handler)
    plain = stack_types(app)
    steps_on_top(app)
    top: Any = app.build_middleware_stack()
    assert plain[0] == "ServerErrorMiddleware" and "RequestSteps" in plain
    assert type(top) is RequestSteps and isinstance(top.errors, ServerErrors)
    assert (top.errors.handler, top.errors.debug) == (_async_handler, True)
    assert stack_types(app) == plain[plain.index("RequestSteps") :]


@pytest.mark.parametrize(
    "app",
    [
        pytest.param(_with_steps(max_body_size=1024), id="body-limit"),  # the limit frame does something
        pytest.param(FastAPI(), id="no-gym-frame"),
    ],
)
def test_a_stack_the_frame_cannot_top_is_left_as_fastapi_builds_it(app: FastAPI) -> None:
    plain = stack_types(app)
    steps_on_top(app)
    assert stack_types(app) == plain and plain[0] == "ServerErrorMiddleware"


def test_a_stack_with_another_top_is_left_as_it_is() -> None:
    class OwnErrors(ServerErrorMiddleware):
        pass

    app = _with_steps()
    built = app.build_middleware_stack

    def own() -> Any:
        stack: Any = built()
        return OwnErrors(stack.app)

    app.build_middleware_stack = own  # type: ignore[method-assign]
    steps_on_top(app)
    assert stack_types(app)[0].endswith(".OwnErrors")
    steps_on_top(object())  # (not an app with a stack: nothing to do)


class _ProbedServer(SimpleServer):
    """A gym server whose innermost middleware records the ``send`` it is given."""

    seen: ClassVar[list[Any]] = []

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.get("/ok")
        async def ok() -> dict[str, bool]:
            return {"ok": True}

        seen = self.seen

        class Probe:
            def __init__(self, inner: ASGIApp) -> None:
                self.inner = inner

            async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
                if scope["type"] == "http":
                    seen.append(send)
                await self.inner(scope, receive, send)

        app.add_middleware(Probe)
        return app


@pytest.mark.parametrize("enabled", [False, True], ids=["telemetry-off", "telemetry-on"])
async def test_a_gym_server_wraps_send_once(enabled: bool, request: pytest.FixtureRequest) -> None:
    """In a gym server, the handlers' side of the stack gets the exchange's wrapper of the server's own
    ``send``: neither Starlette's error layer nor a gym layer adds one (telemetry on: the context layer
    outside the app made it; off: the error layer)."""
    if enabled:
        request.getfixturevalue("telemetry")  # telemetry on, recorded in memory
    config = parse_global_config(
        {
            "servers": {
                "probed": {
                    "entrypoint": f"{__name__}:_ProbedServer",
                    "server_type": "resources_servers",
                    "port": 24601,
                }
            }
        }
    )
    _ProbedServer.seen.clear()
    app = _ProbedServer("probed", config).build_app()
    assert STATE.enabled is enabled
    assert stack_types(app)[0] == "RequestSteps"  # the gym frame is the top of the app's stack
    sent, error = await _run(app, _scope("/ok"))
    assert error is None and sent[0]["status"] == 200
    (send,) = _ProbedServer.seen
    assert send.__qualname__ == "Exchange.bind.<locals>.exchange_send"
    closed_over = [cell.cell_contents for cell in send.__closure__]
    assert any(getattr(value, "__qualname__", "") == "_run.<locals>.send" for value in closed_over)


async def test_under_contribs_instrumentation_the_stack_is_left_to_it(telemetry: Capture) -> None:
    """Contrib's FastAPI instrumentation wraps the app's own top (Starlette's error layer) and skips an app
    whose stack starts otherwise: the gym frame stays where FastAPI put it, and the request has its span."""
    config = parse_global_config(
        {
            "telemetry": {"server_instrumentation": "contrib"},
            "servers": {
                "probed": {
                    "entrypoint": f"{__name__}:_ProbedServer",
                    "server_type": "resources_servers",
                    "port": 24601,
                }
            },
        }
    )
    app: Any = _ProbedServer("probed", config).build_app()
    sent, error = await _run(app, _scope("/ok"))
    assert error is None and sent[0]["status"] == 200
    layers = stack_types(app)
    assert layers[0] == "ServerErrorMiddleware"
    assert "OpenTelemetryMiddleware" in layers and "RequestSteps" in layers
    (span,) = [span for span in telemetry.spans() if span.kind == SpanKind.SERVER]
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "opentelemetry.instrumentation.fastapi"
