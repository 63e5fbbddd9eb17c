"""The native SERVER span in process (httpx ASGI transport, the SDK's in-memory exporter and reader): one
span and one duration point per request, its attributes and the choice between native and contrib.

What the span says against contrib's over real sockets is tests/integration/test_server_span_conformance.py.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from opentelemetry.trace import SpanKind, StatusCode, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gym_obs.config import TelemetryConfig
from gym_obs.server._native_telemetry import disable_native_telemetry, drop_exception_observer
from gym_obs.server._span import ServerSpanMiddleware, _split_host
from gym_obs.telemetry import names
from gym_obs.telemetry.settings import resolve_server_instrumentation
from gym_obs.telemetry.testing import Capture, telemetry_state

SECRET = "sk-SPANs3cr3t0123456789abcdef"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        return {"item": item_id}

    @app.get("/livez")
    async def livez() -> dict[str, bool]:
        return {"ok": True}

    router = APIRouter()

    @router.get("/deep/{key}")
    async def deep(key: str) -> dict[str, str]:
        return {"key": key}

    app.include_router(router, prefix="/v2")
    sub = FastAPI()

    @sub.get("/inner/{key}")
    async def inner(key: str) -> dict[str, str]:
        return {"key": key}

    app.mount("/sub", sub)
    for built in (app, sub):
        disable_native_telemetry(built)  # as SimpleServer does: the native span is the only one
    return app


async def _get(telemetry: Capture, path: str, **headers: str) -> Any:
    app = ServerSpanMiddleware(_app())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://testserver") as http:
        telemetry.clear()
        response = await http.get(path, headers=headers)
    spans = telemetry.spans()
    return response, spans


async def test_one_server_span_with_the_stable_attributes(telemetry: Capture) -> None:
    agent = f"bench/1.0 api_key={SECRET} " + "x" * 1000
    response, (span,) = await _get(
        telemetry, f"/items/3?token={SECRET}", **{"user-agent": agent, "host": "example.test:8443"}
    )
    assert response.status_code == 200
    assert span.kind == SpanKind.SERVER and span.name == "GET /items/{item_id}"
    assert span.instrumentation_scope.name == names.INSTRUMENTATION_SCOPE
    attributes = dict(span.attributes)
    assert attributes[names.ATTR_HTTP_ROUTE] == "/items/{item_id}"
    assert attributes[names.ATTR_URL_PATH] == "/items/3"
    assert attributes[names.ATTR_SERVER_ADDRESS] == "example.test"
    assert attributes[names.ATTR_SERVER_PORT] == 8443
    assert attributes[names.ATTR_HTTP_RESPONSE_STATUS_CODE] == 200
    assert names.ATTR_URL_QUERY not in attributes and names.ATTR_ERROR_TYPE not in attributes
    shown = attributes[names.ATTR_USER_AGENT_ORIGINAL]
    assert SECRET not in shown and len(shown) == names.MAX_USER_AGENT_CHARS
    assert SECRET not in repr(attributes)
    (point,) = telemetry.metric_points(names.METRIC_HTTP_SERVER_REQUEST_DURATION)
    assert point.count == 1
    assert point.attributes == {
        names.ATTR_HTTP_REQUEST_METHOD: "GET",
        names.ATTR_URL_SCHEME: "http",
        names.ATTR_HTTP_ROUTE: "/items/{item_id}",
        names.ATTR_HTTP_RESPONSE_STATUS_CODE: 200,
        names.ATTR_NETWORK_PROTOCOL_VERSION: "1.1",
    }


async def test_the_caller_is_the_parent(telemetry: Capture) -> None:
    _, (span,) = await _get(telemetry, "/items/1", traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01")
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"},  # not sampled
        {"traceparent": f"01-{TRACE_ID}-{PARENT_ID}-01-future"},  # a later version may add fields
        {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01-extra"},  # version 00 may not
        {"traceparent": f"ff-{TRACE_ID}-{PARENT_ID}-01"},
        {"traceparent": f"00-{'0' * 32}-{PARENT_ID}-01"},
        {"traceparent": f"00-{TRACE_ID}-{'0' * 16}-01"},
        {"traceparent": f"00-{TRACE_ID.upper()}-{PARENT_ID}-01"},
        {"traceparent": "not-a-traceparent"},
        {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "vendor=1,other=2"},
        {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "baggage": "k=v"},
    ],
)
async def test_the_parent_is_what_the_w3c_propagator_extracts(
    telemetry: Capture, headers: dict[str, str]
) -> None:
    """A lone ``traceparent`` is parsed by the layer itself: it must agree with the SDK's propagator."""
    expected = get_current_span(TraceContextTextMapPropagator().extract(headers)).get_span_context()
    _, spans = await _get(telemetry, "/items/1", **headers)
    if expected.is_valid and not expected.trace_flags.sampled:
        assert spans == []  # the parent-based sampler follows the caller's decision
        return
    (span,) = spans
    if not expected.is_valid:
        assert span.parent is None
        return
    assert span.parent is not None
    assert (span.parent.trace_id, span.parent.span_id) == (expected.trace_id, expected.span_id)
    assert (span.parent.trace_flags, span.parent.is_remote) == (expected.trace_flags, True)
    assert span.parent.trace_state == expected.trace_state
    assert span.context.trace_id == expected.trace_id


@pytest.mark.parametrize(
    ("path", "name", "route"),
    [
        ("/v2/deep/k", "GET /v2/deep/{key}", "/v2/deep/{key}"),  # an included router's prefix
        ("/sub/inner/k", "GET /sub/inner/{key}", "/sub/inner/{key}"),  # a mounted app
        ("/nowhere", "GET", None),  # no route: the method alone, no http.route
    ],
)
async def test_route_templates(telemetry: Capture, path: str, name: str, route: str | None) -> None:
    _, (span,) = await _get(telemetry, path)
    assert span.name == name
    assert span.attributes.get(names.ATTR_HTTP_ROUTE) == route


@pytest.mark.parametrize(
    ("method", "name"), [("GET", "GET /v2/deep/{key}"), ("POST", "POST /v2/deep/{key}"), ("PUT", "PUT")]
)
async def test_a_reply_made_before_routing_still_names_the_route(
    telemetry: Capture, method: str, name: str
) -> None:
    """A middleware that answers before the router ran (an injected fault, an auth refusal): the route is
    the one that would have matched (fully, else partially: a 405), as contrib reports it."""
    inner = _app()

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"].startswith("/v2/deep/") and scope["method"] != "PUT":
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await inner(scope, receive, send)

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        scope["app"] = inner  # as FastAPI.__call__ does before its middleware stack runs
        await refuse(scope, receive, send)

    app = ServerSpanMiddleware(outer)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as http:
        telemetry.clear()
        await http.request(method, "/v2/deep/k" if method != "PUT" else "/nowhere")
    (span,) = telemetry.spans()
    assert span.name == name


async def test_health_routes_are_not_traced(telemetry: Capture) -> None:
    response, spans = await _get(telemetry, "/livez")
    assert response.status_code == 200 and spans == []
    assert telemetry.metric_points(names.METRIC_HTTP_SERVER_REQUEST_DURATION) == []


async def test_an_unhandled_exception_is_a_scrubbed_event_and_an_error(telemetry: Capture) -> None:
    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError(f"connect failed api_key={SECRET}")

    disable_native_telemetry(app)
    wrapped = ServerSpanMiddleware(app)
    transport = httpx.ASGITransport(wrapped, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        telemetry.clear()
        response = await http.get("/boom")
    assert response.status_code == 500
    (span,) = telemetry.spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[names.ATTR_ERROR_TYPE] == "500"
    (event,) = span.events
    assert event.name == names.SPAN_EVENT_EXCEPTION
    assert event.attributes[names.ATTR_EXCEPTION_TYPE] == "RuntimeError"
    assert SECRET not in repr(dict(event.attributes)) and SECRET not in str(span.status.description)


async def test_a_broken_tracer_costs_the_span_not_the_request(
    telemetry: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        def start_span(self, *_args: Any, **_kwargs: Any) -> None:
            raise RuntimeError("tracer exploded")

    monkeypatch.setattr(telemetry_state(), "tracer", Broken())
    response, spans = await _get(telemetry, "/items/5")
    assert response.status_code == 200 and response.json() == {"item": "5"}
    assert spans == []


def test_host_header_parts() -> None:
    assert _split_host("example.test:8080") == ("example.test", 8080)
    assert _split_host("example.test") == ("example.test", None)
    assert _split_host("[::1]:9000") == ("::1", 9000)
    assert _split_host("[::1]") == ("::1", None)
    assert _split_host("host:notaport") == ("host:notaport", None)


@pytest.mark.parametrize(
    ("configured", "env", "expected", "problem"),
    [
        (None, {}, "native", False),
        (None, {names.ENV_SERVER_INSTRUMENTATION: "Contrib"}, "contrib", False),
        ("native", {names.ENV_SERVER_INSTRUMENTATION: "contrib"}, "native", False),  # config wins
        (None, {names.ENV_SERVER_INSTRUMENTATION: "both"}, "native", True),
    ],
)
def test_the_choice_of_server_instrumentation(
    configured: str | None, env: dict[str, str], expected: str, problem: bool
) -> None:
    config = TelemetryConfig.model_validate({"server_instrumentation": configured})
    choice, message = resolve_server_instrumentation(config, env)
    assert choice == expected
    assert (message is not None) == problem
    if message is not None:
        assert names.ENV_SERVER_INSTRUMENTATION in message


def stack_types(app: Any) -> list[str]:
    """The types of a FastAPI app's built middleware stack, outermost first, down to the router (``app``, or
    a gym server's built app: the FastAPI app inside its wrappers)."""
    while not isinstance(app, FastAPI):
        app = app.app
    found: list[str] = []
    node: Any = app.build_middleware_stack()
    while node is not None and len(found) < 20:
        found.append(type(node).__qualname__)
        node = getattr(node, "app", None)
    return found


def test_a_gym_server_stack_has_no_fastapi_exception_observer() -> None:
    """FastAPI observes unhandled exceptions for its own telemetry in every app's stack; a gym server's
    requests never carry that telemetry, so its stack is built without the frame (the rest unchanged)."""
    plain = FastAPI()
    disable_native_telemetry(plain)
    if "ExceptionTelemetryMiddleware" not in stack_types(plain):
        pytest.skip("this FastAPI has no built-in exception observer")
    gym = FastAPI()
    disable_native_telemetry(gym)
    drop_exception_observer(gym)
    expected = [name for name in stack_types(plain) if name != "ExceptionTelemetryMiddleware"]
    assert stack_types(gym) == expected
