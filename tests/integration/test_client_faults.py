"""request() against real misbehaving loopback servers: what the server saw, and what telemetry recorded."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from opentelemetry.trace import StatusCode

from gym_obs.client.http_client import (
    GlobalAIOHTTPAsyncClientConfig,
    RetriesExhaustedError,
    close_global_aiohttp_client,
    request,
    set_global_aiohttp_client,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture
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

pytestmark = pytest.mark.integration

FAST = {
    "global_aiohttp_retry_backoff_base_seconds": 0.01,
    "global_aiohttp_retry_backoff_cap_seconds": 0.05,
    "global_aiohttp_max_retry_seconds": 5.0,
}

Setup = Callable[..., GlobalAIOHTTPAsyncClientConfig]


@pytest.fixture
async def pools() -> AsyncIterator[Setup]:
    """Configure this test's global pools (fast backoff by default); closed at the end."""

    def setup(**overrides: object) -> GlobalAIOHTTPAsyncClientConfig:
        cfg = GlobalAIOHTTPAsyncClientConfig.model_validate({**FAST, **overrides})
        set_global_aiohttp_client(cfg)
        return cfg

    yield setup
    await close_global_aiohttp_client()
    from gym_obs.client import _sessions

    _sessions.configure(GlobalAIOHTTPAsyncClientConfig())






async def test_drops_before_reply_are_retried_in_one_span(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools()
    server = await raw_server(lambda i: DROP if i < 2 else REPLY)
    response = await request("GET", f"{server.url}/items?page=1", _server_name="resources")
    assert response.status == 200
    assert await response.json() == {"ok": True}

    assert len(server.requests) == 3
    (span,) = client_spans(telemetry)
    attrs = dict(span.attributes or {})
    assert span.name == "GET"
    assert attrs[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == 2
    assert attrs[names.ATTR_HTTP_RESPONSE_STATUS_CODE] == 200
    assert attrs[names.ATTR_SERVER_NAME] == "resources"
    assert attrs[names.ATTR_SERVER_ADDRESS] == "127.0.0.1"
    assert attrs[names.ATTR_SERVER_PORT] == server.port
    assert attrs[names.ATTR_URL_FULL] == f"{server.url}/items"
    assert names.ATTR_ERROR_TYPE not in attrs
    assert span.status.status_code != StatusCode.ERROR
    events = attempt_events(span)
    assert [e[names.ATTR_ATTEMPT] for e in events] == [1, 2]
    assert {e[names.ATTR_ERROR_TYPE] for e in events} == {"ServerDisconnectedError"}
    assert all(e[names.ATTR_BODY_UPLOADED] is True for e in events)
    assert all(isinstance(e[names.ATTR_BACKOFF_SECONDS], float) for e in events)

    assert metric_sum(telemetry, names.METRIC_CLIENT_RETRIES, **{
        names.ATTR_SERVER_NAME: "resources", names.ATTR_RETRY_REASON: "server_disconnected"}) == 2
    durations = telemetry.metric_points(names.METRIC_HTTP_CLIENT_REQUEST_DURATION)
    assert sum(p.count for p in durations) == 3
    ok = [p for p in durations if p.attributes.get(names.ATTR_HTTP_RESPONSE_STATUS_CODE) == 200]
    assert sum(p.count for p in ok) == 1
    assert ok[0].attributes[names.ATTR_SERVER_NAME] == "resources"


async def test_refused_connections_end_within_the_budget_with_a_clear_error(
    pools: Setup, telemetry: Capture
) -> None:
    pools(global_aiohttp_max_retry_seconds=0.5)
    port = unused_port()
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError) as info:
        await request("POST", f"http://bob:hunter22@127.0.0.1:{port}/run?api_key=SECRETKEY", json={"a": 1})
    elapsed = time.monotonic() - started
    assert elapsed < 1.5
    error = info.value
    assert isinstance(error.__cause__, aiohttp.ClientConnectorError)
    assert error.attempts >= 2
    destination = rf"http://REDACTED:REDACTED@127\.0\.0\.1:{port}/run"
    assert re.search(rf"POST {destination} failed after \d+ attempts over \d+\.\d\ds", str(error))
    assert "retry budget 0.5s" in str(error) and "connection_refused" in str(error)

    (span,) = client_spans(telemetry)
    attrs = dict(span.attributes or {})
    assert span.status.status_code == StatusCode.ERROR
    assert attrs[names.ATTR_ERROR_TYPE] == "ClientConnectorError"
    assert attrs[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == error.attempts - 1
    assert len(attempt_events(span)) == error.attempts
    assert all(e[names.ATTR_BODY_UPLOADED] is False for e in attempt_events(span))
    assert metric_sum(telemetry, names.METRIC_CLIENT_RETRIES, **{
        names.ATTR_RETRY_REASON: "connection_refused"}) == error.attempts - 1
    recorded = [str(error)] + [str(v) for v in attrs.values()]
    for event in span.events:
        recorded += [str(v) for v in (event.attributes or {}).values()]
    for secret in ("SECRETKEY", "api_key", "hunter22"):
        assert secret not in " ".join(recorded)


async def test_a_connect_timeout_message_with_the_url_is_scrubbed_in_events(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools(global_aiohttp_connector_limit=1, global_aiohttp_connector_limit_per_host=1)
    server = await raw_server(lambda _i: Action("hang"))
    holder = asyncio.create_task(request("GET", f"{server.url}/hold"))
    await asyncio.wait_for(server.wait_for_requests(1), 5)
    with pytest.raises(RetriesExhaustedError) as info:
        await request("GET", f"{server.url}/q?token=TOPSECRET", timeout=aiohttp.ClientTimeout(connect=0.05),
                      _max_num_tries=2)
    assert "TOPSECRET" in str(info.value.__cause__)  # aiohttp puts the whole URL in its message
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    spans = [s for s in client_spans(telemetry) if "/q" in str((s.attributes or {}).get(names.ATTR_URL_FULL))]
    (span,) = spans
    events = attempt_events(span)
    assert len(events) == 2 and {e[names.ATTR_RETRY_REASON] for e in events} == {"timeout"}
    text = repr([dict(e.attributes or {}) for e in span.events]) + repr(dict(span.attributes or {}))
    assert "TOPSECRET" not in text and "token=" not in text


async def test_max_connection_retries_bounds_refused_connections(pools: Setup) -> None:
    pools()
    port = unused_port()
    with pytest.raises(RetriesExhaustedError) as info:
        await request("GET", f"http://127.0.0.1:{port}/", _max_connection_retries=2)
    assert info.value.attempts == 3
    assert "_max_connection_retries=2" in str(info.value)


async def test_a_connection_never_made_is_retried_even_without_resend(
    pools: Setup, raw_server: ServerFactory
) -> None:
    pools(global_aiohttp_retry_backoff_base_seconds=0.05, global_aiohttp_retry_backoff_cap_seconds=0.1)
    port = unused_port()

    async def start_later() -> RawServer:
        await asyncio.sleep(0.3)
        return await raw_server(port=port)

    starter = asyncio.create_task(start_later())
    response = await request("POST", f"http://127.0.0.1:{port}/run", data=b"payload",
                             _resend_after_disconnect=False)
    server = await starter
    assert response.status == 200
    response.release()
    assert len(server.requests) == 1 and server.requests[0].body == b"payload"


async def test_post_is_not_replayed_when_resend_after_disconnect_is_false(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools()
    server = await raw_server(lambda _i: DROP)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await request("POST", f"{server.url}/run", json={"task": 1}, _resend_after_disconnect=False)
    assert len(server.requests) == 1
    assert server.requests[0].complete and server.requests[0].body == b'{"task":1}'
    (span,) = client_spans(telemetry)
    (event,) = attempt_events(span)
    assert event[names.ATTR_BODY_UPLOADED] is True
    assert names.ATTR_HTTP_REQUEST_RESEND_COUNT not in (span.attributes or {})
    assert metric_sum(telemetry, names.METRIC_CLIENT_RETRIES) == 0


async def test_post_replay_is_bounded_by_max_num_tries(pools: Setup, raw_server: ServerFactory) -> None:
    pools()
    server = await raw_server(lambda _i: DROP)
    with pytest.raises(RetriesExhaustedError) as info:
        await request("PUT", f"{server.url}/state", data=b"x", _max_num_tries=3)
    assert len(server.requests) == 3
    assert info.value.attempts == 3 and "_max_num_tries=3" in str(info.value)


async def test_a_partly_uploaded_request_is_resent_even_without_resend(
    pools: Setup, raw_server: ServerFactory
) -> None:
    pools()
    server = await raw_server(lambda i: Action("drop_before_body") if i == 0 else REPLY)
    body = b"z" * (8 * 1024 * 1024)
    response = await request("POST", f"{server.url}/upload", data=body, _resend_after_disconnect=False)
    assert response.status == 200
    response.release()
    assert len(server.requests) == 2
    assert not server.requests[0].complete
    assert server.requests[1].complete and len(server.requests[1].body) == len(body)


async def test_read_timeouts_are_other_errors(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools()
    server = await raw_server(lambda _i: Action("hang"))
    timeout = aiohttp.ClientTimeout(sock_read=0.1)
    with pytest.raises(aiohttp.SocketTimeoutError):
        await request("GET", f"{server.url}/slow", timeout=timeout, _retry_other_errors=False)
    assert len(server.requests) == 1

    with pytest.raises(RetriesExhaustedError) as info:
        await request("GET", f"{server.url}/slow", timeout=timeout)
    assert len(server.requests) == 1 + 3  # MAX_NUM_TRIES on an external call
    assert "3 tries for errors on external calls" in str(info.value)
    assert isinstance(info.value.__cause__, aiohttp.SocketTimeoutError)
    assert metric_sum(telemetry, names.METRIC_CLIENT_RETRIES, **{names.ATTR_RETRY_REASON: "timeout"}) == 2


async def test_slow_answers_are_waited_for_not_retried(pools: Setup, raw_server: ServerFactory) -> None:
    pools()
    server = await raw_server(lambda _i: Action("reply", delay_s=0.3))
    started = time.monotonic()
    response = await request("GET", f"{server.url}/slow")
    assert response.status == 200 and await response.read() == b'{"ok":true}'
    assert time.monotonic() - started >= 0.3
    assert len(server.requests) == 1


async def test_reset_mid_body_is_retried_when_the_body_is_read_inside(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools()
    server = await raw_server(lambda i: Action("reset_mid_body") if i == 0 else REPLY)
    response = await request("GET", f"{server.url}/big", _read_body=True)
    assert response.status == 200 and await response.read() == b'{"ok":true}'
    assert len(server.requests) == 2
    (span,) = client_spans(telemetry)
    assert (span.attributes or {})[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == 1
    (event,) = attempt_events(span)
    assert event[names.ATTR_RETRY_REASON] == "server_disconnected"

    # Without _read_body the reply is handed over and the broken body is the caller's to read.
    server2 = await raw_server(lambda _i: Action("reset_mid_body"))
    response = await request("GET", f"{server2.url}/big")
    with pytest.raises(aiohttp.ClientPayloadError):
        await response.read()
    assert len(server2.requests) == 1


async def test_a_10mb_error_body_is_not_retried_and_is_read_bounded(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    from gym_obs.client.http_client import format_exception_with_response_body, raise_for_status

    pools()
    huge = b"E" * (10 * 1024 * 1024)
    server = await raw_server(lambda _i: Action("reply", status=500, body=huge))
    response = await request("POST", f"{server.url}/v1/responses", json={}, _read_body=True)
    assert response.status == 500
    assert len(server.requests) == 1
    with pytest.raises(aiohttp.ClientResponseError) as info:
        await raise_for_status(response)
    content = getattr(info.value, "response_content", b"")
    assert 0 < len(content) <= 64 * 1024
    assert len(format_exception_with_response_body(info.value)) < 10_000
    (span,) = client_spans(telemetry)
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes or {})[names.ATTR_ERROR_TYPE] == "500"
    assert metric_sum(telemetry, names.METRIC_HTTP_CLIENT_REQUEST_DURATION,
                     **{names.ATTR_ERROR_TYPE: "500"}) == 1


async def test_a_caller_cancelling_mid_request_is_not_an_error(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools()
    server = await raw_server(lambda _i: Action("hang"))
    task = asyncio.create_task(request("GET", f"{server.url}/never"))
    await asyncio.wait_for(server.wait_for_requests(1), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (span,) = client_spans(telemetry)
    assert span.status.status_code != StatusCode.ERROR
    assert names.ATTR_ERROR_TYPE not in (span.attributes or {})
    assert metric_sum(telemetry, names.METRIC_CLIENT_RETRIES) == 0
    assert metric_sum(telemetry, names.METRIC_POOL_PENDING_REQUESTS) == 0


async def test_a_server_that_never_answers_ends_with_the_callers_timeout(
    pools: Setup, raw_server: ServerFactory
) -> None:
    pools()
    server = await raw_server(lambda _i: Action("hang"))
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError):
        await request("GET", f"{server.url}/never", timeout=aiohttp.ClientTimeout(total=0.2))
    assert time.monotonic() - started < 2.0
    assert len(server.requests) == 3


async def test_transport_failure_hook_sees_every_failed_attempt(
    pools: Setup, raw_server: ServerFactory
) -> None:
    from gym_obs.client.http_client import TransportFailure

    pools()
    server = await raw_server(lambda i: DROP if i < 2 else REPLY)
    seen: list[TransportFailure] = []

    async def hook(failure: TransportFailure) -> None:
        seen.append(failure)

    response = await request("GET", f"{server.url}/x?secret=1", _on_transport_failure=hook)
    response.release()
    assert [(f.attempt, f.reason, f.will_retry) for f in seen] == [
        (1, "server_disconnected", True), (2, "server_disconnected", True)]
    assert seen[0].destination == f"{server.url}/x"
    assert seen[0].failure_kind == "transport_peer_drop"


async def test_first_retry_is_logged_at_once_and_repeats_are_summarised(
    pools: Setup, raw_server: ServerFactory
) -> None:
    import structlog

    pools(global_aiohttp_retry_backoff_base_seconds=0.001, global_aiohttp_retry_backoff_cap_seconds=0.002)
    server = await raw_server(lambda i: DROP if i < 12 else REPLY)
    with structlog.testing.capture_logs() as logs:
        response = await request("GET", f"{server.url}/flaky?token=abc")
    response.release()
    events = [entry["event"] for entry in logs]
    assert events == ["request_retry", "request_still_retrying", "request_retries_summary"]
    first, repeated, summary = logs
    assert first["log_level"] == "warning"
    assert first["reason"] == "server_disconnected" and first["attempt"] == 1
    assert first["destination"] == f"{server.url}/flaky"  # redacted: no query string
    assert repeated["retries"] == 10 and repeated["reasons"] == {"server_disconnected": 10}
    assert summary["outcome"] == "recovered" and summary["attempts"] == 13
    assert "abc" not in repr(logs)


async def test_retried_attempts_become_failure_events_of_the_current_request(
    pools: Setup, raw_server: ServerFactory
) -> None:
    from gym_obs.client.http_client import observe_transport_failures
    from gym_obs.failures.transport import request_failure_log

    pools()
    server = await raw_server(lambda i: DROP if i < 1 else REPLY)
    with request_failure_log() as log:
        response = await request("POST", f"{server.url}/v1/responses", json={},
                                 _on_transport_failure=observe_transport_failures("model"))
        response.release()
    (record,) = [r for r in log.events.values() if r.get("boundary") == "model"]
    assert record["failure_kind"] == "transport_peer_drop"
    assert "retrying" in record["failure_reason"]
    cause = log.events[record["cause_id"]]  # the transport error, kept as the explicit (foreign) cause
    assert "ServerDisconnectedError" in repr(cause)


async def test_every_attempt_of_an_internal_call_carries_the_one_spans_traceparent(
    pools: Setup, raw_server: ServerFactory, telemetry: Capture
) -> None:
    pools()
    server = await raw_server(lambda i: DROP if i < 2 else REPLY)
    response = await request("POST", f"{server.url}/verify", json={}, _internal=True, _server_name="judge")
    response.release()
    sent = [seen.headers.get("traceparent") for seen in server.requests]
    assert len(sent) == 3 and len(set(sent)) == 1
    (span,) = client_spans(telemetry)
    ctx = span.get_span_context()
    assert sent[0] is not None and sent[0].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    assert (span.attributes or {})[names.ATTR_HTTP_REQUEST_RESEND_COUNT] == 2
