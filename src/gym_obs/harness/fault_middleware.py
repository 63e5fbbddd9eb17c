"""Pure-ASGI middleware that applies a fault plan, plus the control route that swaps plans at run time.

Pure ASGI (never BaseHTTPMiddleware) so it adds no task, no body buffering and no context copy, and so that
a fault looks to the caller exactly like the real thing: a reply that never comes, a connection dropped
before or in the middle of the body, a header the caller must not trust. It sits inside the server's own
middlewares, so the server's telemetry and failure replies see injected faults as they would see real ones.

``raise`` is not raised here: it arms a context variable that the demo handlers check at their domain point
(model generation, agent loop, verifier), so the exception takes the same path a real bug would, e.g. a
verifier exception becomes ``verifier_error`` at boundary ``resources_server``.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from gym_obs.harness.faults import (
    CANARY_SECRET,
    FaultPlanError,
    FaultRule,
    FaultSelector,
    parse_fault_plan,
)
from gym_obs.telemetry.names import FAILURE_REPORT_HEADER

__all__ = [
    "CONTROL_PATH",
    "MALFORMED_BODIES",
    "ControlRoute",
    "FaultMiddleware",
    "raise_injected_fault",
    "serve_control",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CONTROL_PATH: Final = "/_gym/faults"
HUGE_BODY_BYTES: Final = 4 * 1024 * 1024
BAD_REPORT_OVERSIZED_CHARS: Final = 6000
#: ``malformed_body`` answers 200 with each of these in turn: not JSON, then JSON of the wrong shape.
MALFORMED_BODIES: Final = (
    b"<html>502 Bad Gateway</html>",
    b"[1, 2, 3]",
    b'{"reward": "high", "hops": []}',
    b'{"reward": 1.0, "hops": [["model"]]}',
    b'{"reward": 1.0, "hops": "model=0.1"}',
    b'{"reward": 1.0, "hops": [["model", -1]]}',
)
_HANG_DEFAULT_S: Final = 3600.0
_DISCONNECT_WAIT_S: Final = 2.0

_LOG = logging.getLogger(__name__)
_ARMED: contextvars.ContextVar[FaultRule | None] = contextvars.ContextVar("gym_harness_fault", default=None)


def raise_injected_fault() -> None:
    """Raise the exception an armed ``raise`` fault asks for; a no-op otherwise.

    Demo handlers call this where a real bug would surface, so the injected exception travels the same path.
    """
    rule = _ARMED.get()
    if rule is not None:
        _ARMED.set(None)
        raise rule.exception_class()(f"injected fault ({rule.action} on {rule.route})")


def _huge_body() -> bytes:
    head = b'Traceback (most recent call last):\n  File "model.py", line 1, in generate\n'
    tail = b"\nRuntimeError: injected huge error body\n"
    return head + b"x" * (HUGE_BODY_BYTES - len(head) - len(tail)) + tail


class FaultMiddleware:
    """Applies the active plan of ``selector`` to matching requests; serves ``/_gym/faults``.

    ``hooked_routes`` are paths whose handlers call :func:`raise_injected_fault`; a ``raise`` fault on any
    other path is raised by the middleware itself.
    """

    def __init__(self, app: ASGIApp, selector: FaultSelector, hooked_routes: frozenset[str] = frozenset()):
        self.app = app
        self.selector = selector
        self.hooked_routes = hooked_routes
        self._bad_report_count = 0
        self._malformed_count = 0
        self._huge: bytes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == CONTROL_PATH:
            await self._control(scope, receive, send)
            return
        rule = self.selector.pick(path)
        if rule is None:
            await self.app(scope, receive, send)
            return
        await self._apply(rule, scope, receive, send)

    async def _apply(self, rule: FaultRule, scope: Scope, receive: Receive, send: Send) -> None:
        action = rule.action
        if action == "raise":
            if scope["path"] not in self.hooked_routes:
                raise rule.exception_class()(f"injected fault ({rule.action} on {rule.route})")
            token = _ARMED.set(rule)
            try:
                await self.app(scope, receive, send)
            finally:
                _ARMED.reset(token)
        elif action == "delay":
            await asyncio.sleep(rule.seconds or 0.0)
            await self.app(scope, receive, send)
        elif action == "status":
            status = rule.status or 500
            await _send_json(send, status, {"detail": f"injected fault: status {status}"})
        elif action == "hang":
            await _drain(receive)
            await asyncio.sleep(rule.seconds or _HANG_DEFAULT_S)
            await _drop_connection(scope, receive)
        elif action == "disconnect":
            await _drain(receive)
            await _drop_connection(scope, receive)
        elif action == "disconnect_mid_body":
            await _drain(receive)
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"65536")],
                }
            )
            await send(
                {"type": "http.response.body", "body": b'{"id": "partial", "output": [', "more_body": True}
            )
            await _drop_connection(scope, receive)
        elif action == "bad_failure_report":
            await self._bad_failure_report(send)
        elif action == "huge_body":
            if self._huge is None:
                self._huge = _huge_body()
            await _send_bytes(send, 500, self._huge, b"text/plain; charset=utf-8")
        elif action == "secret_in_error":
            await _send_secret(send)
        elif action == "malformed_body":
            await _drain(receive)
            body = MALFORMED_BODIES[self._malformed_count % len(MALFORMED_BODIES)]
            self._malformed_count += 1
            await _send_bytes(send, 200, body, b"application/json")

    async def _bad_failure_report(self, send: Send) -> None:
        self._bad_report_count += 1
        if self._bad_report_count % 2:
            value = "v1.%%%not-a-report%%%{]"
        else:
            value = "v1." + "QUJD" * (BAD_REPORT_OVERSIZED_CHARS // 4)
        body = json.dumps({"detail": "injected fault: bad failure report"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (FAILURE_REPORT_HEADER.lower().encode(), value.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve_control(self.selector, scope, receive, send)


class ControlRoute:
    """Serves ``/_gym/faults`` outside the server's telemetry layers (wrap the finished app with it).

    The harness's control calls (reading what was injected, setting a plan) are not workload: inside the
    instrumented app each made a parentless SERVER span without a route (``GET``) and a request metric.
    """

    def __init__(self, app: ASGIApp, selector: FaultSelector) -> None:
        self.app = app
        self.selector = selector

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CONTROL_PATH:
            await serve_control(self.selector, scope, receive, send)
            return
        await self.app(scope, receive, send)


def _describe(selector: FaultSelector) -> dict[str, Any]:
    return {
        "server": selector.server_name,
        "role": selector.role,
        "plan": selector.plan.model_dump(mode="json", exclude_none=True),
        "injected": selector.injected(),
    }


async def serve_control(selector: FaultSelector, scope: Scope, receive: Receive, send: Send) -> None:
    """``GET`` the plan and the counts injected, ``POST``/``PUT`` a new plan, ``DELETE`` to clear it."""
    method = scope["method"]
    if method == "GET":
        await _send_json(send, 200, _describe(selector))
    elif method == "DELETE":
        selector.set_plan(parse_fault_plan({}))
        await _send_json(send, 200, _describe(selector))
    elif method in ("POST", "PUT"):
        raw = await _read_body(receive, limit=1024 * 1024)
        try:
            data = json.loads(raw or b"{}")
        except ValueError as exc:
            await _send_json(send, 422, {"detail": f"fault plan: the body is not JSON ({exc})"})
            return
        try:
            plan = parse_fault_plan(data, source="fault plan")
        except FaultPlanError as exc:
            await _send_json(send, 422, {"detail": str(exc)})
            return
        selector.set_plan(plan)
        await _send_json(send, 200, _describe(selector))
    else:
        await _send_json(send, 405, {"detail": f"method {method} not allowed on {CONTROL_PATH}"})


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    await _send_bytes(send, status, json.dumps(payload).encode(), b"application/json")


async def _send_bytes(
    send: Send, status: int, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_secret(send: Send) -> None:
    """An error reply carrying the canary in its body, in a URL query string, and in headers."""
    leak_url = f"https://api.example.invalid/v1/responses?api_key={CANARY_SECRET}"
    body = json.dumps(
        {
            "detail": f"upstream rejected the request: Authorization: Bearer {CANARY_SECRET}",
            "retry_url": leak_url,
            "hint": f"api_key={CANARY_SECRET}",
        }
    ).encode()
    extra = [
        (b"x-api-key", CANARY_SECRET.encode()),
        (b"set-cookie", f"session={CANARY_SECRET}; HttpOnly".encode()),
        (b"location", leak_url.encode()),
    ]
    await _send_bytes(send, 500, body, b"application/json", extra)


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _drain(receive: Receive) -> None:
    """Read the whole request first: the interesting drop is the one after the upload completed."""
    await _read_body(receive, limit=0)


async def _drop_connection(scope: Scope, receive: Receive) -> None:
    """Close this request's TCP connection without a reply (the caller sees the server disconnect).

    ASGI offers no way to drop a connection, so the socket is found by its address pair in this process's
    open descriptors and shut down; the server then sees the disconnect and sends nothing more.
    """
    sock = _find_socket(scope.get("client"), scope.get("server"))
    if sock is None:
        raise ConnectionAbortedError("injected disconnect: connection socket not found")
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
    try:
        async with asyncio.timeout(_DISCONNECT_WAIT_S):
            while (await receive())["type"] != "http.disconnect":
                pass
    except TimeoutError:
        pass


def _find_socket(client: Any, server: Any) -> socket.socket | None:
    if not client or not server:
        return None
    want_peer = (str(client[0]), int(client[1]))
    want_local = (str(server[0]), int(server[1]))
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            dup = os.dup(fd)
        except (OSError, ValueError):
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        try:
            if sock.getpeername()[:2] == want_peer and sock.getsockname()[:2] == want_local:
                return sock
        except OSError:
            pass
        sock.close()
    return None
