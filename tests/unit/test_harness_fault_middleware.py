"""Fault middleware driven as plain ASGI (no network): replies, control route, raise hooks."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from gym_obs.harness.fault_middleware import (
    CONTROL_PATH,
    HUGE_BODY_BYTES,
    FaultMiddleware,
    raise_injected_fault,
)
from gym_obs.harness.faults import CANARY_SECRET, FaultSelector, parse_fault_plan
from gym_obs.telemetry.names import FAILURE_REPORT_HEADER


async def _inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
    raise_injected_fault()
    body = json.dumps({"ok": True}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"11")]})
    await send({"type": "http.response.body", "body": body})


def _middleware(*rules: dict[str, Any], hooked: frozenset[str] = frozenset({"/verify"})) -> FaultMiddleware:
    selector = FaultSelector("resources", "resources_0", parse_fault_plan({"faults": list(rules)}))
    return FaultMiddleware(_inner, selector, hooked)


async def _call(app: FaultMiddleware, path: str, method: str = "POST", body: bytes = b"{}") -> dict[str, Any]:
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    await app(scope, receive, send)
    start = sent[0]
    return {
        "status": start["status"],
        "headers": {k.decode(): v.decode() for k, v in start["headers"]},
        "body": b"".join(m.get("body", b"") for m in sent[1:]),
    }


async def test_no_rule_passes_through() -> None:
    reply = await _call(_middleware(), "/verify")
    assert reply["status"] == 200 and json.loads(reply["body"]) == {"ok": True}


async def test_status_and_delay() -> None:
    reply = await _call(
        _middleware({"server": "resources", "route": "/verify", "action": "status", "status": 503}), "/verify"
    )
    assert reply["status"] == 503
    app = _middleware({"server": "resources", "route": "/verify", "action": "delay", "seconds": 0.2})
    started = time.perf_counter()
    reply = await _call(app, "/verify")
    assert reply["status"] == 200 and time.perf_counter() - started >= 0.2


async def test_raise_is_armed_for_hooked_routes_and_raised_elsewhere() -> None:
    app = _middleware(
        {"server": "resources", "route": "*", "action": "raise", "exception": "ZeroDivisionError"}
    )
    with pytest.raises(ZeroDivisionError, match="injected fault"):
        await _call(app, "/verify")  # raised by the handler's hook
    with pytest.raises(ZeroDivisionError):
        await _call(app, "/other")  # no hook: the middleware raises
    raise_injected_fault()  # nothing armed outside a request


async def test_bad_failure_report_alternates_malformed_and_oversized() -> None:
    app = _middleware({"server": "resources", "route": "/verify", "action": "bad_failure_report"})
    first = await _call(app, "/verify")
    second = await _call(app, "/verify")
    header = FAILURE_REPORT_HEADER.lower()
    assert first["status"] == second["status"] == 500
    assert len(first["headers"][header]) < 100
    assert 4096 < len(second["headers"][header]) < 8190  # over the encoder's bound, under aiohttp's


async def test_huge_body_and_secret() -> None:
    app = _middleware({"server": "resources", "route": "/verify", "action": "huge_body"})
    reply = await _call(app, "/verify")
    assert reply["status"] == 500 and len(reply["body"]) == HUGE_BODY_BYTES
    assert reply["body"].rstrip().endswith(b"RuntimeError: injected huge error body")
    app = _middleware({"server": "resources", "route": "/verify", "action": "secret_in_error"})
    reply = await _call(app, "/verify")
    assert reply["status"] == 500
    assert CANARY_SECRET.encode() in reply["body"]
    assert reply["headers"]["x-api-key"] == CANARY_SECRET
    assert f"?api_key={CANARY_SECRET}" in reply["headers"]["location"]


async def test_control_route_swaps_the_plan_at_run_time() -> None:
    app = _middleware()
    described = json.loads((await _call(app, CONTROL_PATH, "GET"))["body"])
    assert described["plan"] == {"faults": []} and described["role"] == "resources"
    plan = {
        "faults": [
            {"server": "resources", "route": "/verify", "action": "status", "status": 502},
            {"server": "model", "route": "/v1/responses", "action": "status", "status": 500},
        ]
    }
    reply = await _call(app, CONTROL_PATH, "POST", json.dumps(plan).encode())
    assert reply["status"] == 200
    assert len(json.loads(reply["body"])["plan"]["faults"]) == 1  # only the rules for this server
    assert (await _call(app, "/verify"))["status"] == 502
    described = json.loads((await _call(app, CONTROL_PATH, "GET"))["body"])
    assert described["injected"] == {"status": 1}
    bad = await _call(app, CONTROL_PATH, "POST", b'{"faults": [{"server": "x", "route": "/", "actoin": 1}]}')
    assert bad["status"] == 422 and "actoin" in json.loads(bad["body"])["detail"]
    assert (await _call(app, "/verify"))["status"] == 502  # a bad plan leaves the old one active
    await _call(app, CONTROL_PATH, "DELETE")
    assert (await _call(app, "/verify"))["status"] == 200
    assert (await _call(app, CONTROL_PATH, "PATCH"))["status"] == 405
