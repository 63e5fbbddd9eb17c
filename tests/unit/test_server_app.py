"""SimpleServer.build_app() in process (httpx ASGI transport): exactly one SERVER span per request, the
path segments, failure replies and liveness. The OpenTelemetry SDK's in-memory exporter is the receiver.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
from fastapi import FastAPI, HTTPException, Request
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.trace import SpanKind
from yarl import URL

from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.failures import (
    FAILURE_REPORT_BODY_KEY,
    FailureReport,
    NgFailureEvent,
    decode_failure_report,
    encode_failure_report,
    failure_report_for,
    observe_failure,
    request_failure_log,
)
from gym_obs.server import SimpleServer, current_session_id
from gym_obs.server.base_server import import_server_class, load_server
from gym_obs.server.uvicorn import ServerStartupError
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import current_rollout_id
from gym_obs.telemetry.testing import Capture, telemetry_state
from tests.unit.test_server_span import stack_types

STATE = telemetry_state()

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SECRET = "sk-live-1234567890abcdef1234"


def _inner_event() -> NgFailureEvent:
    event = NgFailureEvent(
        "verifier_error", "inner verify failed", boundary="resources_server", http_status=502
    )
    event.__cause__ = KeyError("episode-9")
    return event


class DemoServer(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.get("/items/{item_id}")
        async def item(item_id: str) -> dict[str, Any]:
            return {"item": item_id, "rollout_id": current_rollout_id()}

        @app.get("/recovered")
        async def recovered() -> dict[str, Any]:
            observe_failure(NgFailureEvent("provider_unavailable", "first try failed", boundary="model"))
            return {"ok": True}

        @app.get("/ng")
        async def ng() -> None:
            raise NgFailureEvent(
                "judge_failed", "judge said no", boundary="resources_server", http_status=422
            )

        @app.get("/grouped")
        async def grouped() -> None:
            failure = NgFailureEvent(
                "judge_failed", "in a task group", boundary="resources_server", http_status=409
            )
            raise ExceptionGroup("task group", [failure])

        @app.get("/boom")
        async def boom() -> None:
            raise RuntimeError(f"connect failed with api_key={SECRET}")

        @app.get("/inner_http_error")
        async def inner_http_error() -> None:
            headers = CIMultiDictProxy(
                CIMultiDict({names.FAILURE_REPORT_HEADER: encode_failure_report(_report)})
            )
            info = aiohttp.RequestInfo(
                URL("http://127.0.0.1:1/verify"), "POST", headers, URL("http://127.0.0.1:1")
            )
            raise aiohttp.ClientResponseError(info, (), status=502, message="Bad Gateway", headers=headers)

        @app.get("/missing")
        async def missing() -> None:
            raise HTTPException(status_code=404, detail="no such thing")

        return app


_report = failure_report_for(_inner_event())


def _config(server_type: str = "resources_servers", instrumentation: str | None = None) -> GlobalConfig:
    return parse_global_config(
        {
            "telemetry": {"server_instrumentation": instrumentation},
            "servers": {
                "demo": {"entrypoint": f"{__name__}:DemoServer", "server_type": server_type, "port": 24600}
            }
        }
    )


@pytest.fixture
async def client(telemetry: Capture) -> AsyncIterator[httpx.AsyncClient]:
    app = DemoServer("demo", _config()).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://testserver") as http:
        telemetry.clear()
        yield http


def _server_spans(telemetry: Capture) -> list[Any]:
    return [span for span in telemetry.spans() if span.kind == SpanKind.SERVER]


# --- one SERVER span ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instrumentation", "scope_name"),
    [
        (None, names.INSTRUMENTATION_SCOPE),  # the default: the native SERVER span
        ("native", names.INSTRUMENTATION_SCOPE),
        ("contrib", "opentelemetry.instrumentation.fastapi"),
    ],
)
async def test_exactly_one_server_span_per_request(
    telemetry: Capture, instrumentation: str | None, scope_name: str
) -> None:
    app = DemoServer("demo", _config(instrumentation=instrumentation)).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://testserver") as client:
        paths = ["/items/1", "/recovered", "/ng", "/boom", "/missing", f"/ng-trace/{TRACEPARENT}/items/2"]
        for path in paths:
            telemetry.clear()
            await client.get(path)
            spans = telemetry.spans()
            assert [span.kind for span in spans] == [SpanKind.SERVER], (path, [s.name for s in spans])
            assert spans[0].instrumentation_scope is not None
            assert spans[0].instrumentation_scope.name == scope_name
        telemetry.clear()
        for path in ("/livez", "/readyz"):
            await client.get(path)
        assert telemetry.spans() == []  # health routes are not traced


async def test_the_inflight_route_makes_no_span(client: httpx.AsyncClient, telemetry: Capture) -> None:
    response = await client.get(names.INFLIGHT_ROUTE, params={"limit": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["server"] == "demo" and body["limit"] == 3 and body["in_flight"] == 0
    assert telemetry.spans() == []  # control plane: no SERVER span, parentless or not
    app = DemoServer("demo", _config()).build_app()
    remote = httpx.ASGITransport(app, client=("10.9.9.9", 4000))
    async with httpx.AsyncClient(transport=remote, base_url="http://testserver") as http:
        assert (await http.get(names.INFLIGHT_ROUTE)).status_code == 403  # loopback callers only


async def test_fastapi_builtin_telemetry_would_add_spans_and_is_off(telemetry: Capture) -> None:
    bare = FastAPI()

    @bare.get("/x")
    async def x() -> dict[str, bool]:
        return {"ok": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(bare), base_url="http://t") as http:
        await http.get("/x")
    native = telemetry.spans()
    assert native and all(span.instrumentation_scope.name == "fastapi" for span in native)  # type: ignore[union-attr]


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_built_stack_has_no_fastapi_exception_observer(
    enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frame FastAPI keeps for its own telemetry's exceptions is dropped (its requests carry none);
    an unhandled exception is still the server's failure reply."""
    monkeypatch.setattr(STATE, "enabled", enabled)
    app: Any = DemoServer("demo", _config()).build_app()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app, raise_app_exceptions=False), base_url="http://t"
    ) as http:
        assert (await http.get("/boom")).status_code == 500
    layers = stack_types(app)
    assert "ExceptionTelemetryMiddleware" not in layers and "RequestSteps" in layers


async def test_server_keeps_serving_without_spans_when_instrumentation_fails(
    telemetry: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("instrumentation exploded")

    monkeypatch.setattr(FastAPIInstrumentor, "instrument_app", broken)
    app = DemoServer("demo", _config(instrumentation="contrib")).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as http:
        response = await http.get("/items/3")
    assert response.status_code == 200
    assert _server_spans(telemetry) == []  # and FastAPI's own telemetry did not step in


async def test_off_means_off_even_with_a_global_sdk_provider(
    telemetry: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(STATE, "enabled", False)
    monkeypatch.setattr(STATE, "traces_enabled", False)
    app = DemoServer("demo", _config()).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as http:
        response = await http.get(f"/ng-trace/{TRACEPARENT}/ng-rollout/r-off/items/4")
    assert response.json() == {"item": "4", "rollout_id": "r-off"}  # segments stripped all the same
    assert telemetry.spans() == []


# --- path segments --------------------------------------------------------------------------------------


async def test_trace_segment_joins_the_callers_trace(client: httpx.AsyncClient, telemetry: Capture) -> None:
    response = await client.get(f"/ng-trace/{TRACEPARENT}/ng-rollout/r-1/items/7")
    assert response.json() == {"item": "7", "rollout_id": "r-1"}
    (span,) = _server_spans(telemetry)
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
    assert span.name == "GET /items/{item_id}"
    assert span.attributes[names.ATTR_ROLLOUT_ID] == "r-1"
    assert "ng-trace" not in str(span.attributes.get("url.path"))


async def test_a_real_traceparent_header_wins(client: httpx.AsyncClient, telemetry: Capture) -> None:
    header_trace = "11111111111111111111111111111111"
    header = f"00-{header_trace}-2222222222222222-01"
    await client.get(f"/ng-trace/{TRACEPARENT}/items/8", headers={"traceparent": header})
    (span,) = _server_spans(telemetry)
    assert format(span.context.trace_id, "032x") == header_trace


async def test_rollout_id_from_the_header(client: httpx.AsyncClient) -> None:
    response = await client.get("/items/9", headers={names.ROLLOUT_ID_HEADER: "r-header"})
    assert response.json()["rollout_id"] == "r-header"
    prefixed = await client.get("/ng-rollout/r-path/items/9", headers={names.ROLLOUT_ID_HEADER: "r-header"})
    assert prefixed.json()["rollout_id"] == "r-path"  # the URL prefix is the more specific one


# --- failure replies ------------------------------------------------------------------------------------


async def test_success_without_failures_has_no_report(client: httpx.AsyncClient) -> None:
    response = await client.get("/items/1")
    assert names.FAILURE_REPORT_HEADER not in response.headers


async def test_recovered_failure_is_reported_on_the_success_reply(
    client: httpx.AsyncClient, telemetry: Capture
) -> None:
    response = await client.get("/recovered")
    assert response.status_code == 200
    report = decode_failure_report(response.headers[names.FAILURE_REPORT_HEADER])
    assert report.failure_id is None
    (record,) = report.events.values()
    assert (record["failure_kind"], record["boundary"]) == ("provider_unavailable", "model")
    (span,) = _server_spans(telemetry)
    assert record["span_id"] == format(span.context.span_id, "016x")


async def test_unhandled_failure_event_answers_with_its_status_and_report(
    client: httpx.AsyncClient, telemetry: Capture
) -> None:
    response = await client.get("/ng")
    assert response.status_code == 422
    body = response.json()
    report = FailureReport.from_payload(body[FAILURE_REPORT_BODY_KEY])
    assert report == decode_failure_report(response.headers[names.FAILURE_REPORT_HEADER])
    assert report.final_record is not None
    assert (report.final_record["failure_kind"], report.final_record["http_status"]) == ("judge_failed", 422)
    points = telemetry.metric_points(names.METRIC_FAILURE_EVENTS)
    assert sum(point.value or 0 for point in points) == 1  # counted once, where it was first observed


async def test_a_failure_inside_a_task_group_answers_as_itself(client: httpx.AsyncClient) -> None:
    response = await client.get("/grouped")
    assert response.status_code == 409
    final = FailureReport.from_payload(response.json()[FAILURE_REPORT_BODY_KEY]).final_record
    assert final is not None and final["failure_kind"] == "judge_failed"


async def test_other_exceptions_become_internal_errors_at_the_server_boundary(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/boom")
    assert response.status_code == 500
    assert SECRET not in response.text and "Traceback" not in response.text
    report = FailureReport.from_payload(response.json()[FAILURE_REPORT_BODY_KEY])
    final = report.final_record
    assert final is not None
    assert (final["failure_kind"], final["boundary"], final["http_status"]) == (
        "internal_error",
        "resources_server",
        500,
    )
    cause = report.events[final["cause_id"]]
    assert cause["failure_kind"] is None and cause["exception_type"] == "RuntimeError"
    assert "connect failed" in cause["failure_reason"]


async def test_inner_http_error_keeps_the_inner_event_as_cause(client: httpx.AsyncClient) -> None:
    response = await client.get("/inner_http_error")
    assert response.status_code == 500
    report = FailureReport.from_payload(response.json()[FAILURE_REPORT_BODY_KEY])
    final = report.final_record
    assert final is not None and final["failure_kind"] == "internal_error"
    inner = report.events[final["cause_id"]]
    assert inner["event_id"] == _report.failure_id  # the original id, not a copy
    assert inner["failure_kind"] == "verifier_error"
    assert report.events[inner["cause_id"]]["exception_type"] == "KeyError"


async def test_http_exceptions_stay_ordinary_replies(client: httpx.AsyncClient) -> None:
    response = await client.get("/missing")
    assert response.status_code == 404 and response.json() == {"detail": "no such thing"}
    assert names.FAILURE_REPORT_HEADER not in response.headers


@pytest.mark.parametrize(
    ("server_type", "boundary"),
    [
        ("responses_api_models", "model"),
        ("resources_servers", "resources_server"),
        ("responses_api_agents", "agent"),
    ],
)
async def test_boundary_follows_the_server_type(server_type: str, boundary: str) -> None:
    app = DemoServer("demo", _config(server_type)).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as http:
        response = await http.get("/boom")
    final = FailureReport.from_payload(response.json()[FAILURE_REPORT_BODY_KEY]).final_record
    assert final is not None and final["boundary"] == boundary


# --- liveness and loading -------------------------------------------------------------------------------


async def _lifespan(app: Any, step: str) -> None:
    messages = asyncio.Queue[dict[str, Any]]()
    await messages.put({"type": f"lifespan.{step}"})
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        return await messages.get()

    async def send(message: dict[str, Any]) -> None:
        assert not message["type"].endswith("failed"), message
        done.set()

    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    )
    await done.wait()
    if step == "startup":
        await messages.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, 5)


async def test_readyz_follows_the_lifespan() -> None:
    server = DemoServer("demo", _config())
    app = server.build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as http:
        assert (await http.get("/livez")).json()["status"] == "ok"
        assert (await http.get("/readyz")).status_code == 503
        server._started = True
        assert (await http.get("/readyz")).status_code == 200
        server._started = False
    await _lifespan(app, "startup")  # startup then shutdown: ready flips on and off again
    assert server.is_ready() is False


def test_loading_servers_names_the_problem() -> None:
    assert import_server_class(f"{__name__}:DemoServer") is DemoServer
    with pytest.raises(ServerStartupError, match=r"servers\.m\.entrypoint: module '.*' has no 'Nope'"):
        import_server_class(f"{__name__}:Nope", where="servers.m")
    with pytest.raises(ServerStartupError, match="is not a SimpleServer subclass"):
        import_server_class(f"{__name__}:FailureReport")
    with pytest.raises(ServerStartupError, match="no server named 'ghost'"):
        load_server("ghost", _config())
    assert isinstance(load_server("demo", _config()), DemoServer)


def test_setup_webserver_must_return_fastapi() -> None:
    class NotFastAPI(SimpleServer):
        def setup_webserver(self) -> FastAPI:
            return orjson  # type: ignore[return-value]

    with pytest.raises(TypeError, match="must return a FastAPI app"):
        NotFastAPI("demo", _config()).build_app()


def test_an_unknown_server_type_is_a_config_error_naming_the_valid_ones() -> None:
    from gym_obs.config import SERVER_TYPES, ConfigError
    from gym_obs.server._failure_reply import boundary_for_server_type

    with pytest.raises(ConfigError) as caught:
        _config("something_else")
    message = str(caught.value)
    assert "servers.demo.server_type" in message and "'something_else'" in message
    assert all(valid in message for valid in SERVER_TYPES)
    assert "harness" not in {boundary_for_server_type(t) for t in SERVER_TYPES}  # each valid type has its own
    assert boundary_for_server_type(None) == boundary_for_server_type("something_else") == "harness"


def _layer_names(app: Any) -> list[str]:
    """The built stack, outermost first: the wrappers around the FastAPI app, then its own middlewares
    (the steps of the gym layers' one frame listed after it, in the order they run)."""
    found: list[str] = []
    while not isinstance(app, FastAPI):
        control = getattr(getattr(app, "context", None), "control", None)
        if control is not None:  # the control routes, answered first in the context layer's frame
            found.append(type(control).__name__)
        found.append(type(app).__name__)
        app = app.app
    found.append("FastAPI")
    for middleware in app.user_middleware:  # type: ignore[attr-defined]
        found.append(middleware.cls.__name__)
        if middleware.cls.__name__ == "RequestSteps":
            kinds = ("context", "sessions", "failures", "disconnect")
            for step in (middleware.kwargs.get(kind) for kind in kinds):
                control = getattr(step, "control", None)
                if control is not None:  # answered first in the frame, as in the context layer's
                    found.append(f"- {type(control).__name__}")
                if step is not None:
                    found.append(f"- {type(step).__name__}")
    return found


def test_the_stack_is_built_in_the_declared_order(telemetry: Capture) -> None:
    # the order server/_stack.py declares (owner routing only runs under several workers)
    layers = _layer_names(DemoServer("demo", _config("responses_api_models")).build_app())
    assert layers == [
        "InflightRoute",
        "PathContextMiddleware",
        "ServerSpanMiddleware",  # the native SERVER span wraps the FastAPI app's middlewares
        "FastAPI",
        "RequestSteps",  # sessions, failure reply and disconnect: steps of one frame, in this order
        "- SessionLayer",
        "- FailureReplies",
        "- DisconnectWatch",
        "ModelCallMiddleware",
    ]


def test_servers_without_sessions_or_disconnect_cancellation_leave_those_layers_out() -> None:
    class Stateless(DemoServer):
        sessions_enabled = False
        disconnect_watch_delay_s = None

    assert _layer_names(Stateless("demo", _config()).build_app()) == [
        "FastAPI",
        "RequestSteps",  # telemetry off: the context layer is the frame's first step (no span between)
        "- InflightRoute",
        "- PathContext",
        "- FailureReplies",
    ]


async def test_a_failure_reply_hands_back_a_new_session_with_one_report_header() -> None:
    class Sessioned(DemoServer):
        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()

            @app.get("/session-then-fail")
            async def session_then_fail(request: Request) -> None:
                _ = request.session["session_id"]
                raise NgFailureEvent("judge_failed", "no", boundary="resources_server", http_status=409)

            return app

    app = Sessioned("demo", _config()).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        reply = await http.get("/session-then-fail")
    assert reply.status_code == 409
    assert reply.headers[names.SESSION_HEADER] and reply.cookies.get(names.SESSION_COOKIE)
    (header,) = reply.headers.get_list(names.FAILURE_REPORT_HEADER)
    body = FailureReport.from_payload(reply.json()[FAILURE_REPORT_BODY_KEY])
    assert decode_failure_report(header).to_payload() == body.to_payload()


async def test_a_request_leaves_no_reference_cycle_behind(telemetry: Capture) -> None:
    # The layers keep their shared per-request object in the scope; nothing it holds may lead back to the
    # scope, or every request (with the SERVER span's send wrapper closing over the scope) becomes garbage
    # only the cycle collector can free.
    import gc

    app = DemoServer("demo", _config()).build_app()

    async def one(path: str) -> int:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 5), "server": ("testserver", 80),
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        status: int = sent[0]["status"]
        return status

    assert await one("/items/1") == 200  # warm: first-request caches
    gc.collect()
    gc.disable()
    try:
        statuses = [await one(path) for path in ("/items/1", "/recovered") * 10]
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert statuses == [200] * 20
    assert unreachable == 0


async def test_a_failure_observed_first_in_a_spawned_task_or_a_thread_is_reported_on_the_reply() -> None:
    # The request's failure log is made on the first record (most requests record none); a task the
    # handler spawned, or the thread of a sync handler, may be where that happens, and the reply must still
    # carry it (the log lives on the request's holder, which those share, not in their own context).
    class Observing(DemoServer):
        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()

            @app.get("/in-task")
            async def in_task() -> dict[str, bool]:
                await asyncio.create_task(_observe("from a task"))
                return {"ok": True}

            @app.get("/in-thread")
            def in_thread() -> dict[str, bool]:
                observe_failure(NgFailureEvent("transport_timeout", "from a thread", boundary="model"))
                return {"ok": True}

            @app.get("/none")
            async def none() -> dict[str, bool]:
                return {"ok": True}

            return app

    async def _observe(reason: str) -> None:
        observe_failure(NgFailureEvent("transport_timeout", reason, boundary="model"))

    app = Observing("demo", _config()).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        for path, reason in (("/in-task", "from a task"), ("/in-thread", "from a thread")):
            reply = await http.get(path)
            assert reply.status_code == 200
            report = decode_failure_report(reply.headers[names.FAILURE_REPORT_HEADER])
            assert report.failure_id is None  # recovered: reported on a success
            assert [record["failure_reason"] for record in report.events.values()] == [reason]
        quiet = await http.get("/none")
    assert quiet.status_code == 200 and names.FAILURE_REPORT_HEADER not in quiet.headers


class _SessionUnderLocalLog(DemoServer):
    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()

        @app.get("/session-under-local-log")
        async def session_under_local_log(request: Request) -> dict[str, Any]:
            # The request's session and failure log share one context variable: a log made current inside
            # the handler keeps the request's session current.
            with request_failure_log():
                inner = current_session_id()
            return {"inner": inner, "session": request.session["session_id"], "after": current_session_id()}

        return app


async def _session_under_local_log() -> None:
    app = _SessionUnderLocalLog("demo", _config()).build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        first = await http.get("/session-under-local-log")
        token = first.headers[names.SESSION_HEADER]
        again = await http.get("/session-under-local-log", headers={names.SESSION_HEADER: token})
    issued = first.json()
    assert issued["inner"] and issued["inner"] == issued["session"] == issued["after"]
    assert again.json() == issued  # the token names the same session on the next request
    assert names.SESSION_HEADER not in again.headers  # (nothing new to hand back)


async def test_a_local_failure_log_keeps_the_request_session_current_with_telemetry_off() -> None:
    await _session_under_local_log()


async def test_a_local_failure_log_keeps_the_request_session_current_with_telemetry_on(
    telemetry: Capture,
) -> None:
    await _session_under_local_log()
