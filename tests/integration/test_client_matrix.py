"""The request() matrix: telemetry on and off x internal and external x GET and POST json=.

Every case runs against a real loopback server and asserts on what the server received (attempts,
headers, bodies) and, with telemetry on, on the spans and metric points the SDK's in-memory exporter and
reader got.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from opentelemetry.trace import StatusCode

from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    RetriesExhaustedError,
    TransportFailure,
    close_global_aiohttp_client,
    request,
    set_global_aiohttp_client,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture, telemetry_state
from tests.integration.client_support import (
    DROP,
    REPLY,
    Action,
    RawServer,
    ServerFactory,
    attempt_events,
    client_spans,
    metric_sum,
    unused_port,
)

STATE = telemetry_state()

pytestmark = pytest.mark.integration

TRACEPARENT = re.compile(names.TRACEPARENT_PATTERN)

FAST = GlobalAIOHTTPAsyncClientConfig(
    global_aiohttp_retry_backoff_base_seconds=0.01,
    global_aiohttp_retry_backoff_cap_seconds=0.02,
    global_aiohttp_max_retry_seconds=5.0,
)


@pytest.fixture
async def pools() -> AsyncIterator[None]:
    set_global_aiohttp_client(FAST)
    yield
    await close_global_aiohttp_client()
    from gym_obs.client import configure_global_aiohttp_client

    configure_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())




@pytest.fixture(params=[True, False], ids=["telemetry_on", "telemetry_off"])
def capture(request: pytest.FixtureRequest) -> Capture | None:
    """The in-memory telemetry capture when on; None (and telemetry really off) when off."""
    if request.param:
        return request.getfixturevalue("telemetry")  # type: ignore[no-any-return]
    assert not STATE.enabled
    return None


@pytest.fixture(params=[True, False], ids=["internal", "external"])
def internal(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(params=["GET", "POST"])
def method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _kwargs(method: str, headers: dict[str, str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"headers": headers}
    if method == "POST":
        kwargs["json"] = {"q": 1, "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)}
    return kwargs




def _everything_recorded(capture: Capture) -> str:
    parts: list[str] = []
    for span in capture.spans():
        parts.append(span.name)
        parts += [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            parts += [str(v) for v in (event.attributes or {}).values()]
    for metric in capture.metric_names():
        for point in capture.metric_points(metric):
            parts += [str(v) for v in point.attributes.values()]
    return " ".join(parts)


def _check_sent(server: RawServer, method: str, attempts: int) -> None:
    assert len(server.requests) == attempts
    for seen in server.requests:
        assert seen.method == method
        assert seen.headers["x-caller"] == "1"
        if method == "POST":
            assert seen.headers["content-type"] == "application/json"
            assert orjson.loads(seen.body) == {"q": 1, "when": "2026-01-02T03:04:05+00:00"}


def _check_traceparent(server: RawServer, capture: Capture | None, internal: bool) -> None:
    sent = [seen.headers.get("traceparent") for seen in server.requests]
    if capture is None or not internal:
        assert sent == [None] * len(sent)
        return
    (span,) = client_spans(capture)
    ctx = span.get_span_context()
    for value in sent:
        assert value is not None and TRACEPARENT.fullmatch(value)
        assert value.startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")


async def test_success(
    pools: None, raw_server: ServerFactory, capture: Capture | None, internal: bool, method: str
) -> None:
    server = await raw_server()
    headers = {"X-Caller": "1"}
    response = await request(method, f"{server.url}/v1/run?key=SECRET", _internal=internal,
                             _server_name="model", **_kwargs(method, headers))
    assert response.status == 200 and await response.json() == {"ok": True}
    assert headers == {"X-Caller": "1"}  # the caller's dict is never mutated
    _check_sent(server, method, 1)
    _check_traceparent(server, capture, internal)
    if capture is None:
        return
    (span,) = client_spans(capture)
    attrs = dict(span.attributes or {})
    assert span.name == method
    assert attrs[names.ATTR_HTTP_REQUEST_METHOD] == method
    assert attrs[names.ATTR_URL_FULL] == f"{server.url}/v1/run"
    assert attrs[names.ATTR_HTTP_RESPONSE_STATUS_CODE] == 200
    assert attrs[names.ATTR_SERVER_NAME] == "model"
    assert attrs[names.ATTR_SERVER_PORT] == server.port
    assert names.ATTR_HTTP_REQUEST_RESEND_COUNT not in attrs
    assert names.ATTR_ERROR_TYPE not in attrs
    assert span.status.status_code != StatusCode.ERROR
    assert not span.events
    assert span.end_time is not None and span.start_time is not None and span.end_time >= span.start_time
    points = capture.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)
    assert sum(p.count for p in points) == 1
    assert "SECRET" not in _everything_recorded(capture)


async def test_dropped_twice_then_ok(
    pools: None, raw_server: ServerFactory, capture: Capture | None, internal: bool, method: str
) -> None:
    server = await raw_server(lambda i: DROP if i < 2 else REPLY)
    headers = {"X-Caller": "1"}
    response = await request(method, f"http://u:pw@127.0.0.1:{server.port}/v1/run?key=SECRET",
                             _internal=internal, **_kwargs(method, headers))
    assert response.status == 200
    response.release()
    assert headers == {"X-Caller": "1"}
    _check_sent(server, method, 3)
    _check_traceparent(server, capture, internal)
    if capture is None:
        return
    (span,) = client_spans(capture)
    attrs = dict(span.attributes or {})
    assert attrs[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == 2
    assert attrs[names.ATTR_SERVER_NAME] == names.EXTERNAL_SERVER_NAME
    assert span.status.status_code != StatusCode.ERROR and names.ATTR_ERROR_TYPE not in attrs
    events = attempt_events(span)
    assert [e[names.ATTR_ATTEMPT] for e in events] == [1, 2]
    for event in events:
        assert event[names.ATTR_ERROR_TYPE] == "ServerDisconnectedError"
        assert isinstance(event[names.ATTR_BACKOFF_SECONDS], float) and event[names.ATTR_BACKOFF_SECONDS] >= 0
        assert event[names.ATTR_BODY_UPLOADED] is True
    assert metric_sum(capture, names.METRIC_CLIENT_RETRIES, **{
        names.ATTR_RETRY_REASON: names.RETRY_REASON_SERVER_DISCONNECTED}) == 2
    durations = capture.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)
    assert sum(p.count for p in durations) == 3
    recorded = _everything_recorded(capture)
    assert "SECRET" not in recorded and "pw@" not in recorded and "u:pw" not in recorded


async def test_5xx_is_an_error_and_not_retried(
    pools: None, raw_server: ServerFactory, capture: Capture | None, internal: bool, method: str
) -> None:
    server = await raw_server(lambda _i: Action("reply", status=503, body=b'{"error":"busy"}'))
    response = await request(method, f"{server.url}/v1/run", _internal=internal,
                             **_kwargs(method, {"X-Caller": "1"}))
    assert response.status == 503
    response.release()
    _check_sent(server, method, 1)
    if capture is None:
        return
    (span,) = client_spans(capture)
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes or {})[names.ATTR_ERROR_TYPE] == "503"
    assert metric_sum(capture, names.METRIC_HTTP_CLIENT_REQUEST_DURATION, **{
        names.ATTR_ERROR_TYPE: "503", names.ATTR_HTTP_RESPONSE_STATUS_CODE: 503}) == 1


async def test_caller_cancellation_is_not_an_error(
    pools: None, raw_server: ServerFactory, capture: Capture | None, internal: bool, method: str
) -> None:
    server = await raw_server(lambda _i: Action("hang"))
    task = asyncio.create_task(request(method, f"{server.url}/v1/run", _internal=internal,
                                       **_kwargs(method, {"X-Caller": "1"})))
    await asyncio.wait_for(server.wait_for_requests(1), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(server.requests) == 1
    if capture is None:
        return
    (span,) = client_spans(capture)
    assert span.end_time is not None
    assert span.status.status_code != StatusCode.ERROR
    assert names.ATTR_ERROR_TYPE not in (span.attributes or {})
    assert metric_sum(capture, names.METRIC_POOL_PENDING_REQUESTS) == 0
    assert metric_sum(capture, names.METRIC_CLIENT_RETRIES) == 0


async def test_cancellation_during_backoff_ends_the_span_without_error(
    raw_server: ServerFactory, capture: Capture | None, internal: bool, method: str
) -> None:
    # The backoff has full jitter (uniform in [0, 30 s] here), so a wall-clock wait cannot know that the
    # loop is still sleeping: a draw under the wait sends a second request first. The hook runs right
    # before the backoff sleep (nothing is awaited between the two), so a cancellation requested there is
    # delivered by that sleep, whatever was drawn.
    backoffs: list[float] = []

    def cancel_in_backoff(failure: TransportFailure) -> None:
        assert failure.will_retry
        backoffs.append(failure.backoff_s)
        task.cancel()

    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_retry_backoff_base_seconds=30.0, global_aiohttp_retry_backoff_cap_seconds=30.0))
    try:
        server = await raw_server(lambda _i: DROP)
        task = asyncio.create_task(request(method, f"{server.url}/v1/run", _internal=internal,
                                           _on_transport_failure=cancel_in_backoff,
                                           **_kwargs(method, {"X-Caller": "1"})))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    finally:
        await close_global_aiohttp_client()
    assert len(backoffs) == 1 and backoffs[0] > 0  # cancelled in the first backoff
    assert len(server.requests) == 1
    if capture is None:
        return
    (span,) = client_spans(capture)
    assert span.status.status_code != StatusCode.ERROR
    assert len(attempt_events(span)) == 1


async def test_refused_forever_ends_within_the_budget(
    capture: Capture | None, internal: bool, method: str
) -> None:
    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_retry_backoff_base_seconds=0.01, global_aiohttp_retry_backoff_cap_seconds=0.05,
        global_aiohttp_max_retry_seconds=0.4))
    port = unused_port()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(RetriesExhaustedError) as info:
            await request(method, f"http://127.0.0.1:{port}/v1/run?key=SECRET", _internal=internal,
                          **_kwargs(method, {"X-Caller": "1"}))
    finally:
        await close_global_aiohttp_client()
    assert loop.time() - started < 1.5
    error = info.value
    assert isinstance(error.__cause__, aiohttp.ClientConnectorError)
    assert error.attempts >= 2 and f"failed after {error.attempts} attempts over" in str(error)
    assert "SECRET" not in str(error)
    if capture is None:
        return
    (span,) = client_spans(capture)
    assert span.status.status_code == StatusCode.ERROR
    attrs = dict(span.attributes or {})
    assert attrs[names.ATTR_ERROR_TYPE] == "ClientConnectorError"
    assert attrs[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == error.attempts - 1
    events = attempt_events(span)
    assert [e[names.ATTR_ATTEMPT] for e in events] == list(range(1, error.attempts + 1))
    assert all(e[names.ATTR_BODY_UPLOADED] is False for e in events)
    assert "SECRET" not in _everything_recorded(capture)


# --- retry knobs, with telemetry on and off -----------------------------------------------------------


async def test_post_not_replayed_without_resend(
    pools: None, raw_server: ServerFactory, capture: Capture | None
) -> None:
    server = await raw_server(lambda _i: DROP)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await request("POST", f"{server.url}/run", json={"task": 1}, _resend_after_disconnect=False)
    assert len(server.requests) == 1 and server.requests[0].complete
    if capture is not None:
        (span,) = client_spans(capture)
        (event,) = attempt_events(span)
        assert event[names.ATTR_BODY_UPLOADED] is True
        assert span.status.status_code == StatusCode.ERROR


@pytest.mark.parametrize(
    ("kwargs", "sent", "limit"),
    [
        ({"_max_num_tries": 2}, 2, "_max_num_tries=2"),
        ({"_max_num_tries": 2, "_internal": True}, 2, "_max_num_tries=2"),
        ({"_max_connection_retries": 1}, 2, "_max_connection_retries=1"),
        ({"_max_connection_retries": 5, "_max_num_tries": 3}, 3, "_max_num_tries=3"),
    ],
)
async def test_attempt_limits_on_dropped_connections(
    pools: None, raw_server: ServerFactory, capture: Capture | None, kwargs: dict[str, Any], sent: int,
    limit: str,
) -> None:
    server = await raw_server(lambda _i: DROP)
    with pytest.raises(RetriesExhaustedError) as info:
        await request("GET", f"{server.url}/x", **kwargs)
    assert len(server.requests) == sent
    assert info.value.attempts == sent and limit in str(info.value)
    assert isinstance(info.value.__cause__, aiohttp.ServerDisconnectedError)
    if capture is not None:
        (span,) = client_spans(capture)
        assert (span.attributes or {})[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == sent - 1
        assert len(attempt_events(span)) == sent


async def test_max_num_tries_caps_refused_connections(pools: None, capture: Capture | None) -> None:
    port = unused_port()
    with pytest.raises(RetriesExhaustedError) as info:
        await request("GET", f"http://127.0.0.1:{port}/x", _internal=True, _max_num_tries=2)
    assert info.value.attempts == 2 and "_max_num_tries=2" in str(info.value)
    with pytest.raises(aiohttp.ClientConnectorError):  # one try: the attempt's own error, as is
        await request("GET", f"http://127.0.0.1:{port}/x", _max_num_tries=1)


async def test_other_errors_tries_external_internal_and_switched_off(
    raw_server: ServerFactory, capture: Capture | None
) -> None:
    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_retry_backoff_base_seconds=0.01, global_aiohttp_retry_backoff_cap_seconds=0.02,
        global_aiohttp_max_retry_seconds=0.7))
    try:
        server = await raw_server(lambda _i: Action("hang"))
        timeout = aiohttp.ClientTimeout(sock_read=0.1)
        with pytest.raises(aiohttp.SocketTimeoutError):
            await request("GET", f"{server.url}/a", timeout=timeout, _retry_other_errors=False)
        assert len(server.requests) == 1
        with pytest.raises(RetriesExhaustedError, match="3 tries for errors on external calls"):
            await request("GET", f"{server.url}/b", timeout=timeout)
        assert len(server.requests) == 1 + 3
        with pytest.raises(RetriesExhaustedError, match="retry budget"):
            await request("GET", f"{server.url}/c", timeout=timeout, _internal=True)
        assert len(server.requests) > 1 + 3 + 3  # internal calls: bounded by the budget, not by 3
    finally:
        await close_global_aiohttp_client()


async def test_retry_other_errors_false_still_resends_dropped_connections(
    pools: None, raw_server: ServerFactory, capture: Capture | None
) -> None:
    server = await raw_server(lambda i: DROP if i < 2 else REPLY)
    response = await request("GET", f"{server.url}/x", _retry_other_errors=False)
    assert response.status == 200
    response.release()
    assert len(server.requests) == 3


async def test_read_body_retries_a_reset_mid_body(
    pools: None, raw_server: ServerFactory, capture: Capture | None, method: str
) -> None:
    server = await raw_server(lambda i: Action("reset_mid_body") if i == 0 else REPLY)
    response = await request(method, f"{server.url}/big", _read_body=True,
                             **_kwargs(method, {"X-Caller": "1"}))
    assert response.status == 200 and await response.read() == b'{"ok":true}'
    _check_sent(server, method, 2)
    if capture is not None:
        (span,) = client_spans(capture)
        assert (span.attributes or {})[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == 1
        assert span.status.status_code != StatusCode.ERROR


# --- bad input: clear errors before anything is sent -----------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"json": {1: "a"}}, TypeError, r"request\(json=...\).*str"),
        ({"json": {"a": object()}}, TypeError, r"request\(json=...\).*object"),
        ({"json": {"a": {1, 2}}}, TypeError, r"request\(json=...\).*set"),
        ({"json": {}, "data": b"x"}, ValueError, "data and json"),
        ({"_max_num_tries": 0}, ValueError, "_max_num_tries"),
        ({"_max_num_tries": 2.5}, TypeError, "_max_num_tries"),
        ({"_max_connection_retries": -1}, ValueError, "_max_connection_retries"),
    ],
)
async def test_bad_arguments_fail_clearly_and_send_nothing(
    pools: None, raw_server: ServerFactory, capture: Capture | None, kwargs: dict[str, Any],
    error: type[Exception], match: str,
) -> None:
    server = await raw_server()
    with pytest.raises(error, match=match):
        await request("POST", f"{server.url}/x", **kwargs)
    assert server.requests == []
    if capture is not None:
        assert metric_sum(capture, names.METRIC_POOL_PENDING_REQUESTS) == 0


async def test_json_types_orjson_knows(
    pools: None, raw_server: ServerFactory, capture: Capture | None
) -> None:
    import dataclasses
    import enum
    import uuid

    @dataclasses.dataclass
    class Point:
        x: int

    class Colour(enum.Enum):
        RED = "red"

    server = await raw_server()
    payload = {"d": dt.date(2026, 1, 2), "u": uuid.UUID(int=1), "p": Point(3), "c": Colour.RED, "t": (1, 2)}
    (await request("POST", f"{server.url}/x", json=payload)).release()
    assert orjson.loads(server.requests[0].body) == {
        "d": "2026-01-02", "u": "00000000-0000-0000-0000-000000000001", "p": {"x": 3}, "c": "red",
        "t": [1, 2]}


async def test_request_debug_flag_logs_every_exchange_redacted(
    raw_server: ServerFactory, capture: Capture | None
) -> None:
    import structlog

    from gym_obs.client.http_client import is_global_aiohttp_client_request_debug_enabled

    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_client_request_debug=True, global_aiohttp_retry_backoff_base_seconds=0.01))
    try:
        assert is_global_aiohttp_client_request_debug_enabled()
        server = await raw_server(lambda i: DROP if i == 0 else REPLY)
        with structlog.testing.capture_logs() as logs:
            response = await request("GET", f"http://u:pw@127.0.0.1:{server.port}/x?key=SECRET",
                                     headers={"X-Api-Key": "TOKEN123"})
            response.release()
    finally:
        await close_global_aiohttp_client()
        from gym_obs.client import configure_global_aiohttp_client

        configure_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    assert not is_global_aiohttp_client_request_debug_enabled()
    debug = [entry for entry in logs if entry["event"] == "client_request_debug"]
    assert [("error" in e, e.get("status")) for e in debug] == [(True, None), (False, 200)]
    assert debug[1]["url"].endswith(f"127.0.0.1:{server.port}/x")  # aiohttp moved u:pw to a header
    text = repr(debug)
    assert "SECRET" not in text and "TOKEN123" not in text and "pw" not in text


async def test_metrics_only_telemetry(
    pools: None, raw_server: ServerFactory, telemetry: Capture, internal: bool, method: str
) -> None:
    """Traces off, metrics on: no span, no traceparent, the same sends and the per-attempt metrics."""
    saved = STATE.traces_enabled
    STATE.traces_enabled = False
    try:
        server = await raw_server(lambda i: DROP if i == 1 else REPLY)
        for _ in range(2):  # the first succeeds at once, the second after one dropped attempt
            headers = {"X-Caller": "1"}
            response = await request(method, f"{server.url}/v1/run", _internal=internal, _server_name="model",
                                     **_kwargs(method, headers))
            assert response.status == 200
            response.release()
            assert headers == {"X-Caller": "1"}
    finally:
        STATE.traces_enabled = saved
    _check_sent(server, method, 3)
    assert all("traceparent" not in seen.headers for seen in server.requests)
    assert telemetry.spans() == []
    assert sum(p.count for p in telemetry.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)) == 3
    assert metric_sum(telemetry, names.METRIC_CLIENT_RETRIES, **{names.ATTR_SERVER_NAME: "model"}) == 1


async def test_a_connection_never_made_is_retried_without_resend(
    raw_server: ServerFactory, capture: Capture | None
) -> None:
    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_retry_backoff_base_seconds=0.05, global_aiohttp_retry_backoff_cap_seconds=0.1))
    port = unused_port()

    async def start_later() -> RawServer:
        await asyncio.sleep(0.3)
        return await RawServer(port).start()

    starter = asyncio.create_task(start_later())
    try:
        response = await request("POST", f"http://127.0.0.1:{port}/run", json={"n": 1},
                                 _resend_after_disconnect=False)
        assert response.status == 200
        response.release()
    finally:
        server = await starter
        await close_global_aiohttp_client()
        await server.stop()
    assert len(server.requests) == 1 and orjson.loads(server.requests[0].body) == {"n": 1}
    if capture is not None:
        (span,) = client_spans(capture)
        events = attempt_events(span)
        assert events and all(e[names.ATTR_BODY_UPLOADED] is False for e in events)
        assert {e[names.ATTR_RETRY_REASON] for e in events} == {names.RETRY_REASON_CONNECTION_REFUSED}
        assert (span.attributes or {})[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == len(events)
        assert span.status.status_code != StatusCode.ERROR


async def test_a_server_that_never_answers_ends_with_the_callers_timeout(
    pools: None, raw_server: ServerFactory, capture: Capture | None, internal: bool
) -> None:
    server = await raw_server(lambda _i: Action("hang"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises((RetriesExhaustedError, asyncio.TimeoutError)):
        await request("GET", f"{server.url}/never", timeout=aiohttp.ClientTimeout(total=0.2),
                      _internal=internal, _max_num_tries=None if not internal else 4)
    assert loop.time() - started < 3.0
    assert len(server.requests) == (4 if internal else 3)
    if capture is not None:
        (span,) = client_spans(capture)
        assert span.status.status_code == StatusCode.ERROR
        assert len(attempt_events(span)) == len(server.requests)


@pytest.mark.parametrize("bad", ["", "GET /x HTTP/1.1\r\nX:", "G T"])
async def test_a_method_that_is_not_a_token_fails_before_sending(
    pools: None, raw_server: ServerFactory, capture: Capture | None, bad: str
) -> None:
    server = await raw_server()
    with pytest.raises(ValueError, match="method"):
        await request(bad, f"{server.url}/x")
    (await request("purge", f"{server.url}/x")).release()  # any token is fine, in any case
    assert [seen.method for seen in server.requests] == ["PURGE"]


async def test_non_canonical_methods_keep_their_original_on_the_span(
    pools: None, raw_server: ServerFactory, telemetry: Capture
) -> None:
    server = await raw_server()
    for method in ("get", "GET", "PURGE"):
        (await request(method, f"{server.url}/x")).release()
    assert [seen.method for seen in server.requests] == ["GET", "GET", "PURGE"]
    spans = client_spans(telemetry)
    got = [(s.name, (s.attributes or {}).get(names.ATTR_HTTP_REQUEST_METHOD),
            (s.attributes or {}).get(names.ATTR_HTTP_REQUEST_METHOD_ORIGINAL)) for s in spans]
    assert got == [("GET", "GET", "get"), ("GET", "GET", None), ("HTTP", "_OTHER", "PURGE")]
    methods = {p.attributes[names.ATTR_HTTP_REQUEST_METHOD]
               for p in telemetry.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)}
    assert methods == {"GET", "_OTHER"}  # bounded on metrics: no original method there
