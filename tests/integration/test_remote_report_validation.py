"""Issues 12.4 and 12.8: a peer's failure report is hostile in every field and in its size.

A raw loopback upstream answers with a crafted ``X-NG-Failure-Report`` (a canary secret and terminal escapes
in the kind, type name, reason, details keys and values, rollout id, server name) or with one far over
aiohttp's 8190-byte header limit. Asserted on what the caller raised, and on everything a real gym server
that relays the failure sent and wrote: its reply header and body, its log lines and its exported spans.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gym_obs.client.errors import UNREADABLE_HEAD_STATUS, ResponseError, ResponseHeadError
from gym_obs.client.http_client import close_global_aiohttp_client, raise_boundary_failure, request
from gym_obs.failures import FAILURE_REPORT_BODY_KEY, NgFailureEvent, decode_failure_report
from gym_obs.failures._base import new_event_id
from gym_obs.failures._codec import _encode
from gym_obs.failures.report import failure_report_for
from gym_obs.failures.transport import FAILURE_REPORT_HEADER, request_failure_log
from tests.integration.relay_apps import RELAY_SCRIPT
from tests.integration.relay_support import CANARY, read_all, start_script, wait_listening

pytestmark = pytest.mark.integration

UPSTREAM_PORT = 30520
RELAY_PORT = 30521
ESC = "\x1b[2J\x1b]0;pwned\x07\x9b31m"


def _hostile_header() -> str:
    root, final = new_event_id(), new_event_id()
    events: dict[str, Any] = {
        root: {
            "event_id": root, "failure_kind": None, "exception_type": f"{CANARY}{ESC}",
            "failure_reason": f"{ESC} root {CANARY} {ESC}", "cause_id": None,
            "details": {"password": CANARY},
        },
        final: {
            "event_id": final, "failure_kind": f"{CANARY}{ESC}",
            "failure_reason": f"model said {CANARY}{ESC}",
            "boundary": "model", "stage": None, "http_status": 200,
            "details": {"api_key": CANARY, "note": f"{ESC} {CANARY}", f"{ESC}k": [f"{CANARY}", {"token": 1}]},
            "cause_id": root, "trace_id": None, "span_id": None,
            "rollout_id": f"r-1 {CANARY}{ESC}", "server_name": f"{ESC}srv {CANARY}", "timestamp": 1.0,
        },
    }
    return _encode(final, events, False, 0)


@asynccontextmanager
async def hostile_upstream(header: Callable[[], str], status: int = 500) -> AsyncIterator[str]:
    body = b'{"detail": "the real upstream body"}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            head = (f"HTTP/1.1 {status} Upstream Failed\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n{FAILURE_REPORT_HEADER}: {header()}\r\n"
                    "Connection: close\r\n\r\n")
            writer.write(head.encode("utf-8") + body)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", UPSTREAM_PORT, reuse_address=True)
    try:
        yield f"http://127.0.0.1:{UPSTREAM_PORT}/generate"
    finally:
        server.close()
        await server.wait_closed()


def _assert_clean(text: str) -> None:
    assert CANARY not in text and "c4n4ry" not in text.lower()
    for control in ("\x1b", "\x07", "\x9b"):
        assert control not in text


async def test_every_field_of_a_remote_report_is_validated_and_scrubbed() -> None:
    async with hostile_upstream(_hostile_header):
        response = await request("GET", f"http://127.0.0.1:{UPSTREAM_PORT}/generate")
        with request_failure_log() as log, pytest.raises(NgFailureEvent) as info:
            await raise_boundary_failure(response)
    await close_global_aiohttp_client()
    event = info.value
    assert event.failure_kind == "unknown"
    assert event.details is not None and event.details["api_key"] == "[REDACTED]"
    assert event.http_error is not None and event.http_error.status == 500  # type: ignore[attr-defined]
    record = event.to_record()
    root = event.__cause__
    assert root is not None and getattr(root, "exception_type", None) == "UnknownException"
    assert "root" in str(root)
    for text in (json.dumps(record, ensure_ascii=False), str(event), str(root), repr(dict(log.events)),
                 json.dumps(failure_report_for(event).to_payload(), ensure_ascii=False)):
        _assert_clean(text)


async def test_a_relaying_gym_server_passes_on_nothing_hostile(tmp_path: Path) -> None:
    config = {
        "telemetry": {"enabled": True, "traces_exporter": "file", "metrics_exporter": "none",
                      "file_export_dir": str(tmp_path)},
        "servers": {"relay": {"entrypoint": "tests.integration.relay_apps:RelayServer",
                              "server_type": "simple_agents", "port": RELAY_PORT,
                              "upstream_url": f"http://127.0.0.1:{UPSTREAM_PORT}/generate"}},
    }
    async with hostile_upstream(_hostile_header):
        proc = await start_script(RELAY_SCRIPT, {"OTEL_BSP_SCHEDULE_DELAY": "50", "GYM_OBS_LOG_JSON": "1"},
                                  json.dumps(config))
        try:
            await wait_listening(RELAY_PORT)
            async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{RELAY_PORT}/relay"
            ) as reply:
                body = await reply.read()
                header = reply.headers.get(FAILURE_REPORT_HEADER, "")
                status = reply.status
        finally:
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert status >= 500
    report = decode_failure_report(header)
    kinds = {record["failure_kind"] for record in report.events.values()}
    assert {"agent_request_failed", "unknown"} <= kinds
    spans = read_all(tmp_path).decode("utf-8", "replace")
    assert "agent_request_failed" in spans  # the spans were written (the grep below can fail)
    logs = (stdout + stderr).decode("utf-8", "replace")
    assert "upstream_failed" in logs
    for text in (body.decode("utf-8", "replace"), json.dumps(report.to_payload(), ensure_ascii=False),
                 spans, logs):
        _assert_clean(text)
    assert FAILURE_REPORT_BODY_KEY in json.loads(body)


@pytest.mark.parametrize("size", [9_000, 60_000, 200_000])
async def test_an_oversize_failure_header_keeps_the_real_status_and_body_and_pickles(size: int) -> None:
    async with hostile_upstream(lambda: "v1." + "A" * size):
        try:
            response = await request("GET", f"http://127.0.0.1:{UPSTREAM_PORT}/generate?token={CANARY}")
            with pytest.raises(ResponseError) as info:
                await raise_boundary_failure(response)
        except ResponseHeadError as head_error:  # only beyond the bounded read limit
            assert size > 64 * 1024
            error: ResponseError = head_error
            assert error.status == UNREADABLE_HEAD_STATUS and "reply head could not be read" in error.message
        else:
            error = info.value
            assert size < 64 * 1024
            assert not isinstance(error, ResponseHeadError)
            assert error.status == 500 and error.response_content == b'{"detail": "the real upstream body"}'
    await close_global_aiohttp_client()
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and copy.status == error.status
    assert CANARY not in repr(pickle.dumps(error))


async def test_a_gym_server_never_emits_a_failure_header_over_4096_bytes(tmp_path: Path) -> None:
    config = {"servers": {"relay": {"entrypoint": "tests.integration.relay_apps:RelayServer",
                                    "server_type": "simple_agents", "port": RELAY_PORT,
                                    "upstream_url": "http://127.0.0.1:1/"}}}
    proc = await start_script(RELAY_SCRIPT, {}, json.dumps(config))
    try:
        await wait_listening(RELAY_PORT)
        reader, writer = await asyncio.open_connection("127.0.0.1", RELAY_PORT)
        writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = await reader.read(-1)
        writer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 30)
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    values = [line.split(":", 1)[1].strip() for line in head.split("\r\n")
              if line.lower().startswith(FAILURE_REPORT_HEADER.lower() + ":")]
    assert len(values) == 1 and 512 < len(values[0]) <= 4096
    report = decode_failure_report(values[0])
    assert report.truncated and report.failure_id in report.events
