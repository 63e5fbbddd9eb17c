"""Callers against real loopback servers answering with failure reports: valid, truncated and hostile.

An aiohttp.web server plays the gym servers (ports 21000, 21002, 21003); a raw asyncio server (port 21001)
lets the fuzz test put arbitrary bytes on the wire, which no well-behaved server library would send.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gym_obs.client.boundary import raise_boundary_failure
from gym_obs.client.errors import (
    MAX_ERROR_BODY_BYTES,
    ResponseError,
    ResponseJSONError,
    format_exception_with_response_body,
    get_response_json,
    raise_for_status,
)
from gym_obs.failures import (
    FAILURE_REPORT_BODY_KEY,
    FAILURE_REPORT_HEADER,
    FailureReport,
    ForeignFailure,
    NgFailureEvent,
    encode_failure_report,
    failure_report_for,
    observe_failure,
    request_failure_log,
)
from gym_obs.failures._base import new_event_id
from gym_obs.failures._shrink import final_chain
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
WEB_PORT = 21000
RAW_PORT = 21001
INNER_PORT = 21002
OUTER_PORT = 21003
SECRET = "sk-" + "s" * 40


def _verifier_failure(extra_causes: int = 0, reason_chars: int = 10) -> NgFailureEvent:
    """resources_server verifier_error caused (through ``extra_causes`` gym events) by ZeroDivisionError."""
    try:
        _ = 1 / 0
    except ZeroDivisionError as zde:
        cause: BaseException = zde
    for i in range(extra_causes):
        event = NgFailureEvent(
            "judge_failed",
            f"{i}:" + "".join(new_event_id() for _ in range(reason_chars // 27)),
            boundary="resources_server",
        )
        event.__cause__ = cause
        cause = event
    final = NgFailureEvent(
        "verifier_error",
        "verification crashed",
        boundary="resources_server",
        stage="verification",
        http_status=500,
    )
    final.__cause__ = cause
    return final


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass
class WebServer:
    reply: Reply = field(default_factory=Reply)
    received: list[web.Request] = field(default_factory=list)

    def url(self, path: str = "/run") -> str:
        return f"http://{HOST}:{WEB_PORT}{path}?api_key={SECRET}"


@pytest.fixture
async def server() -> AsyncIterator[WebServer]:
    state = WebServer()

    async def handle(request: web.Request) -> web.Response:
        state.received.append(request)
        r = state.reply
        return web.Response(status=r.status, headers=r.headers, body=r.body)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, HOST, WEB_PORT)
    await site.start()
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _call(session: aiohttp.ClientSession, url: str, content: bytes | None = None) -> None:
    async with session.get(url, headers={"Authorization": f"Bearer {SECRET}", "X-Trace": "t"}) as response:
        await raise_boundary_failure(response, content)


# --- valid and truncated reports -------------------------------------------------------------------------


async def test_header_report_is_raised_with_original_ids_and_causes(
    server: WebServer, session: aiohttp.ClientSession
) -> None:
    final = _verifier_failure()
    report = failure_report_for(final)
    server.reply = Reply(
        500, {FAILURE_REPORT_HEADER: encode_failure_report(report)}, b"Internal Server Error"
    )
    with pytest.raises(NgFailureEvent) as info:
        await _call(session, server.url())
    raised = info.value
    assert raised.to_record() == final.to_record()
    assert isinstance(raised.__cause__, ForeignFailure)
    assert str(raised.__cause__) == "ZeroDivisionError: division by zero"
    error = raised.http_error
    assert isinstance(error, ResponseError) and isinstance(error, aiohttp.ClientResponseError)
    assert error.status == 500
    assert error.response_content == b"Internal Server Error"
    assert error.request_info.method == "GET"
    assert str(error.request_info.url) == f"http://{HOST}:{WEB_PORT}/run"
    assert "Authorization" not in error.request_info.headers
    assert error.request_info.headers.get("X-Trace") == "t"
    blob = pickle.dumps(raised)
    assert SECRET.encode() not in blob
    clone = pickle.loads(blob)
    assert clone.event_id == final.event_id
    assert (
        isinstance(clone.http_error, ResponseError)
        and clone.http_error.response_content == b"Internal Server Error"
    )
    text = format_exception_with_response_body(raised)
    assert "verifier_error" in text and "caused by ZeroDivisionError: division by zero" in text
    assert "Response body: Internal Server Error" in text


async def test_body_report_payload_and_encoded_string(
    server: WebServer, session: aiohttp.ClientSession
) -> None:
    final = _verifier_failure(extra_causes=2)
    report = failure_report_for(final)
    for value in (report.to_payload(), encode_failure_report(report)):
        body = orjson.dumps({"detail": "failed", FAILURE_REPORT_BODY_KEY: value})
        server.reply = Reply(500, {"Content-Type": "application/json"}, body)
        with pytest.raises(NgFailureEvent) as info:
            await _call(session, server.url())
        assert info.value.event_id == final.event_id
        assert info.value.http_error is not None
        assert info.value.http_error.response_content == body  # type: ignore[attr-defined]
        assert len(final_chain(failure_report_for(info.value).events, final.event_id)) == 4


async def test_truncated_header_keeps_final_and_root(
    server: WebServer, session: aiohttp.ClientSession
) -> None:
    final = _verifier_failure(extra_causes=30, reason_chars=300)
    value = encode_failure_report(failure_report_for(final))
    assert len(value) <= 4096
    server.reply = Reply(502, {FAILURE_REPORT_HEADER: value}, b"bad gateway")
    with pytest.raises(NgFailureEvent) as info:
        await _call(session, server.url())
    raised = info.value
    assert raised.event_id == final.event_id
    chain: list[BaseException] = [raised]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)  # type: ignore[arg-type]
    assert str(chain[-1]) == "ZeroDivisionError: division by zero"
    assert len(chain) < 32
    assert sum(getattr(e, "skipped_causes", 0) for e in chain) == 32 - len(chain)


async def test_complete_body_wins_over_truncated_header(
    server: WebServer, session: aiohttp.ClientSession
) -> None:
    final = _verifier_failure(extra_causes=30, reason_chars=300)
    report = failure_report_for(final)
    body = orjson.dumps({FAILURE_REPORT_BODY_KEY: report.to_payload()})
    assert len(body) < MAX_ERROR_BODY_BYTES
    server.reply = Reply(500, {FAILURE_REPORT_HEADER: encode_failure_report(report)}, body)
    with pytest.raises(NgFailureEvent) as info:
        await _call(session, server.url())
    assert failure_report_for(info.value).events.keys() == report.events.keys()


async def test_one_report_is_read_the_header_not_at_all_when_the_body_names_the_final_failure(
    server: WebServer, session: aiohttp.ClientSession
) -> None:
    report = failure_report_for(_verifier_failure(extra_causes=2))
    other = failure_report_for(NgFailureEvent("judge_failed", "another hop's failure", boundary="agent"))
    assert not other.events.keys() & report.events.keys()
    body = orjson.dumps({FAILURE_REPORT_BODY_KEY: report.to_payload()})
    server.reply = Reply(500, {FAILURE_REPORT_HEADER: encode_failure_report(other)}, body)
    with request_failure_log() as log, pytest.raises(NgFailureEvent) as info:
        await _call(session, server.url())
    assert info.value.event_id == report.failure_id
    # Only the body's report was decoded: the (different) header report reached neither the raised
    # failure nor the request's failure log.
    assert log.events.keys() == report.events.keys()


# --- no valid remote failure: exactly what raise_for_status raises ---------------------------------------


@pytest.mark.parametrize(
    "headers, body",
    [
        ({}, b"plain failure"),
        ({FAILURE_REPORT_HEADER: "v1.bm90IGEgcmVwb3J0"}, b"garbage header"),
        ({FAILURE_REPORT_HEADER: "v9.whatever"}, b'{"ng_failure_report": {"failure_id": 5}}'),
        ({}, b'{"ng_failure_report": "v1.' + b"A" * 5000 + b'"}'),
        ({}, b'{"ng_failure_report": ' + b"[" * 100_000),
        ({}, b"[1, 2, 3]"),
    ],
)
async def test_hostile_or_missing_reports_raise_the_http_error(
    server: WebServer, session: aiohttp.ClientSession, headers: dict[str, str], body: bytes
) -> None:
    server.reply = Reply(503, headers, body)
    with pytest.raises(ResponseError) as via_boundary:
        await _call(session, server.url())
    async with session.get(server.url()) as response:
        with pytest.raises(ResponseError) as via_status:
            await raise_for_status(response)
    for error in (via_boundary.value, via_status.value):
        assert type(error) is ResponseError
        assert error.status == 503
        assert error.response_content == body[:MAX_ERROR_BODY_BYTES]
        assert str(error.request_info.url) == f"http://{HOST}:{WEB_PORT}/run"


async def test_report_without_final_failure_is_merged_and_the_http_error_raised(
    server: WebServer, session: aiohttp.ClientSession, telemetry: Capture
) -> None:
    recovered = NgFailureEvent("transport_timeout", "first attempt timed out", boundary="model")
    recovered._observed = True  # counted by the remote process
    value = encode_failure_report(FailureReport(events=failure_report_for(recovered).events))
    server.reply = Reply(500, {FAILURE_REPORT_HEADER: value}, b"boom")
    with request_failure_log() as log, pytest.raises(ResponseError):
        await _call(session, server.url())
    assert list(log.events) == [recovered.event_id]
    assert telemetry.metric_points(names.METRIC_FAILURE_EVENTS) == []


async def test_success_reply_observes_recovered_failures(
    server: WebServer, session: aiohttp.ClientSession, telemetry: Capture
) -> None:
    recovered = NgFailureEvent("transport_peer_drop", "retried", boundary="model")
    recovered._observed = True
    value = encode_failure_report(FailureReport(events=failure_report_for(recovered).events))
    server.reply = Reply(200, {FAILURE_REPORT_HEADER: value}, b'{"ok": true}')
    with request_failure_log() as log:
        async with session.get(server.url()) as response:
            assert await raise_boundary_failure(response) is None
            assert await get_response_json(response) == {"ok": True}
    assert list(log.events) == [recovered.event_id]
    assert telemetry.metric_points(names.METRIC_FAILURE_EVENTS) == []


# --- raise_for_status and friends ------------------------------------------------------------------------


async def test_raise_for_status_bounds_the_body_and_pickles(
    server: WebServer, session: aiohttp.ClientSession
) -> None:
    big = b"x" * (MAX_ERROR_BODY_BYTES * 4)
    server.reply = Reply(500, {"Set-Cookie": "session=abc", "X-Other": "kept"}, big)
    response = await session.get(server.url())
    with pytest.raises(ResponseError) as info:
        await raise_for_status(response)
    error = info.value
    assert error.response_content == big[:MAX_ERROR_BODY_BYTES]
    assert error.headers is not None
    assert "Set-Cookie" not in error.headers and error.headers["X-Other"] == "kept"
    assert response.closed  # released, like aiohttp's own raise_for_status
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is ResponseError
    assert (clone.status, clone.message, clone.response_content) == (
        500,
        error.message,
        error.response_content,
    )
    assert str(clone) == str(error)
    assert str(clone.request_info.url) == f"http://{HOST}:{WEB_PORT}/run"
    text = format_exception_with_response_body(error)
    assert len(text) < 3000 and "elided" in text


async def test_raise_for_status_uses_given_content_and_passes_success(
    server: WebServer, session: aiohttp.ClientSession
) -> None:
    server.reply = Reply(404, {}, b"not found here")
    async with session.get(server.url()) as response:
        body = await response.read()
        with pytest.raises(ResponseError) as info:
            await raise_for_status(response, body)
    assert info.value.response_content == b"not found here"
    server.reply = Reply(200, {}, b"not json")
    async with session.get(server.url()) as response:
        await raise_for_status(response)
        with pytest.raises(ResponseJSONError):
            await get_response_json(response)


async def test_explicit_content_is_bounded(server: WebServer, session: aiohttp.ClientSession) -> None:
    server.reply = Reply(500, {}, b"ignored")
    huge = b"{" + b"a" * 1_000_000
    with pytest.raises(ResponseError) as info:
        await _call(session, server.url(), content=huge)
    assert info.value.response_content == huge[:MAX_ERROR_BODY_BYTES]


# --- two hops: ids survive, each failure counted once ----------------------------------------------------


async def test_two_hops_keep_ids_and_count_once(session: aiohttp.ClientSession, telemetry: Capture) -> None:
    inner_ids: list[str] = []

    def failure_reply(error: NgFailureEvent, log: Any) -> web.Response:
        observe_failure(error)
        report = log.report(final=error)
        body = orjson.dumps({"detail": str(error), FAILURE_REPORT_BODY_KEY: report.to_payload()})
        return web.Response(
            status=500,
            body=body,
            content_type="application/json",
            headers={FAILURE_REPORT_HEADER: encode_failure_report(report)},
        )

    async def resources(request: web.Request) -> web.Response:
        with request_failure_log() as log:
            failure = _verifier_failure()
            inner_ids.append(failure.event_id)
            return failure_reply(failure, log)

    async def agent(request: web.Request) -> web.Response:
        with request_failure_log() as log:
            try:
                async with session.post(f"http://{HOST}:{INNER_PORT}/verify") as response:
                    await raise_boundary_failure(response)
            except NgFailureEvent as remote:
                try:
                    raise NgFailureEvent(
                        "agent_request_failed",
                        "verify call failed",
                        boundary="agent",
                        http_status=remote.http_error.status,
                    ) from remote  # type: ignore[union-attr]
                except NgFailureEvent as failure:
                    return failure_reply(failure, log)
        return web.Response(text="unreachable")

    inner = web.Application()
    inner.router.add_post("/verify", resources)
    outer = web.Application()
    outer.router.add_post("/run", agent)
    runners = [web.AppRunner(inner), web.AppRunner(outer)]
    for runner in runners:
        await runner.setup()
    await web.TCPSite(runners[0], HOST, INNER_PORT).start()
    await web.TCPSite(runners[1], HOST, OUTER_PORT).start()
    try:
        async with session.post(f"http://{HOST}:{OUTER_PORT}/run") as response:
            with pytest.raises(NgFailureEvent) as info:
                await raise_boundary_failure(response)
    finally:
        for runner in runners:
            await runner.cleanup()
    raised = info.value
    assert raised.failure_kind == "agent_request_failed" and raised.http_status == 500
    remote = raised.__cause__
    assert isinstance(remote, NgFailureEvent) and remote.event_id == inner_ids[0]
    assert str(remote.__cause__) == "ZeroDivisionError: division by zero"
    counts = {
        p.attributes[names.ATTR_FAILURE_KIND]: p.value
        for p in telemetry.metric_points(names.METRIC_FAILURE_EVENTS)
    }
    assert counts == {"verifier_error": 1, "agent_request_failed": 1}


# --- fuzz: arbitrary bytes on the wire -------------------------------------------------------------------


class _RawPortal:
    """A raw HTTP/1.1 server and an aiohttp client in one background event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.reply = b""
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server: asyncio.Server = self.run(asyncio.start_server(self._handle, HOST, RAW_PORT))
        self.session: aiohttp.ClientSession = self.run(self._session())

    async def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    def run(self, coro: Any, timeout: float = 10.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(self.reply)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self.run(self.session.close())
        self.server.close()
        self.run(self.server.wait_closed())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def portal() -> Iterator[_RawPortal]:
    p = _RawPortal()
    try:
        yield p
    finally:
        p.close()


def _valid_report() -> tuple[FailureReport, str]:
    final = _verifier_failure(extra_causes=2)
    return failure_report_for(final), final.event_id


_FIXED = [f"fe_{i:024x}" for i in range(5)]
_json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
_json = st.recursive(
    _json_leaf,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)


@st.composite
def _event_maps(draw: st.DrawFn) -> dict[str, Any]:
    """Cause maps gone wrong: cycles, dangling causes, duplicate/malformed ids, unknown kinds, bad types."""
    ids = draw(st.lists(st.sampled_from([*_FIXED, "fe_nope", ""]), max_size=6))
    events: dict[str, Any] = {}
    for eid in ids:
        record = NgFailureEvent("internal_error", boundary="agent").to_record()
        record["event_id"] = eid
        record["cause_id"] = draw(st.sampled_from([None, *ids, "fe_" + "f" * 24]))
        record["failure_kind"] = draw(st.sampled_from(["internal_error", "unknown_kind", None, 3]))
        if draw(st.booleans()):
            record[draw(st.sampled_from(sorted(record)))] = draw(_json)
        events[eid] = record
    return {"failure_id": draw(st.sampled_from([None, *ids])), "events": events}


@st.composite
def _replies(draw: st.DrawFn) -> tuple[int, bytes, bytes, str | None, bool]:
    """(status, header value bytes, body, failure id a correct client must raise, pass content explicitly).

    A mutated body report may happen to be valid; it then wins over a valid header, with one of _FIXED ids.
    """
    status = draw(st.sampled_from([200, 201, 400, 404, 422, 500, 502, 503, 599]))
    report, final_id = _valid_report()
    expect: str | None = None
    header_kind = draw(st.sampled_from(["none", "valid", "bytes", "mutated", "b64"]))
    header = b""
    if header_kind == "valid":
        header, expect = encode_failure_report(report).encode(), final_id
    elif header_kind == "bytes":
        header = draw(st.binary(max_size=400)).translate(None, bytes([*range(0, 0x20), 0x7F])).strip()
    elif header_kind == "mutated":
        header = encode_failure_report(FailureReport.model_construct(**draw(_event_maps()))).encode()
    elif header_kind == "b64":
        header = b"v1." + draw(st.text("ABCDEFabcdef0123456789-_", max_size=2000)).encode()
    body_kind = draw(
        st.sampled_from(["empty", "bytes", "huge", "payload", "mutated", "deep", "string", "type"])
    )
    body = b""
    if body_kind == "bytes":
        body = draw(st.binary(max_size=2000))
    elif body_kind == "huge":
        body = b'{"ng_failure_report": "' + b"A" * 1_000_000 + b'"}'
    elif body_kind == "payload":
        body, expect = orjson.dumps({FAILURE_REPORT_BODY_KEY: report.to_payload()}), final_id
    elif body_kind == "mutated":
        body = orjson.dumps({FAILURE_REPORT_BODY_KEY: draw(_event_maps())})
    elif body_kind == "deep":
        body = b'{"ng_failure_report": {"events": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3000 + b"}}"
    elif body_kind == "string":
        body = orjson.dumps({FAILURE_REPORT_BODY_KEY: draw(st.text(max_size=200))})
    elif body_kind == "type":
        body = orjson.dumps({FAILURE_REPORT_BODY_KEY: draw(_json)})
    return status, header, body, (expect if status >= 400 else None), draw(st.booleans())


def _wire(status: int, header: bytes, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status} Whatever\r\nContent-Length: {len(body)}\r\nConnection: close\r\n".encode()
    if header:
        head += FAILURE_REPORT_HEADER.encode() + b": " + header + b"\r\n"
    return head + b"\r\n" + body


async def _fuzz_call(
    session: aiohttp.ClientSession, content: bool
) -> tuple[BaseException | None, bytes | None]:
    async with session.get(f"http://{HOST}:{RAW_PORT}/x") as response:
        body: bytes | None = None
        if content:
            body = await response.read()
        try:
            await raise_boundary_failure(response, body)
        except Exception as exc:
            return exc, body
        return None, body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply=_replies())
def test_fuzz_raise_boundary_failure(
    portal: _RawPortal, reply: tuple[int, bytes, bytes, str | None, bool]
) -> None:
    status, header, body, expect, content = reply
    portal.reply = _wire(status, header, body)
    started = time.perf_counter()
    try:
        raised, _ = portal.run(_fuzz_call(portal.session, content))
    except aiohttp.ClientResponseError as exc:  # the client refused the header itself (before our code ran)
        assert exc.status == 400
        event("client refused the reply")
        return
    event(f"outcome: {type(raised).__name__}")
    assert time.perf_counter() - started < 5.0
    if status < 400:
        assert raised is None
        return
    assert raised is not None
    if isinstance(raised, NgFailureEvent):
        http_error = raised.http_error
        if expect is not None:
            assert raised.event_id == expect or raised.event_id in _FIXED
    else:
        assert expect is None, f"a valid report was not raised: {raised!r}"
        http_error = raised
    assert type(http_error) is ResponseError
    assert http_error.status == status
    assert http_error.response_content == body[:MAX_ERROR_BODY_BYTES]
