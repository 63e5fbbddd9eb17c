"""Real loopback servers for the client tests: a raw asyncio HTTP/1.1 server that misbehaves on cue.

Each request the server reads is recorded (method, path, headers, body, whether the body arrived in full)
and answered according to a plan: ``plan(index)`` returns what to do with request number ``index``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture

_PORTS = itertools.count(22100)


def next_port() -> int:
    """A fresh loopback port in this helper's range (22000-22999)."""
    port = next(_PORTS)
    assert port < 23000
    return port


@dataclass
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    complete: bool


@dataclass
class Action:
    kind: str  # reply | drop | drop_before_body | reset_mid_body | hang
    status: int = 200
    body: bytes = b'{"ok":true}'
    delay_s: float = 0.0


REPLY = Action("reply")
DROP = Action("drop")


@dataclass
class RawServer:
    port: int
    plan: Callable[[int], Action] = lambda _i: REPLY
    requests: list[SeenRequest] = field(default_factory=list)
    connections: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    _server: asyncio.Server | None = None
    _seen: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def wait_for_requests(self, count: int = 1) -> None:
        """Until the server has read the head of ``count`` requests."""
        while len(self.requests) < count:
            self._seen.clear()
            await self._seen.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stop(): end quietly (a cancelled connection task makes asyncio log an error)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, path, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        index = len(self.requests)
        action = self.plan(index)
        length = int(headers.get("content-length", "0"))
        seen = SeenRequest(method, path, headers, b"", length == 0)
        self.requests.append(seen)
        self._seen.set()
        if action.kind == "drop_before_body":
            _abort(writer)
            return False
        if length:
            seen.body = await reader.readexactly(length)
            seen.complete = True
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if action.delay_s:
                await asyncio.sleep(action.delay_s)
            if action.kind == "drop":
                writer.close()
                return False
            if action.kind == "hang":
                await asyncio.sleep(3600)
                return False
            if action.kind == "reset_mid_body":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
                await writer.drain()
                await asyncio.sleep(0.01)
                _abort(writer)
                return False
            reason = "OK" if action.status < 400 else "Error"
            writer.write(
                f"HTTP/1.1 {action.status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(action.body)}\r\n\r\n".encode() + action.body
            )
            await writer.drain()
            return True
        finally:
            self.in_flight -= 1


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), the way a crashed peer or a proxy reset looks to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def unused_port() -> int:
    """A port in this helper's range with nothing listening (connections are refused)."""
    while True:
        port = next_port()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port


ServerFactory = Callable[..., Awaitable["RawServer"]]
"""``raw_server(plan=..., port=None)``: start a ``RawServer`` for this test (stopped at its end)."""


def client_spans(capture: Capture) -> list[ReadableSpan]:
    return [s for s in capture.spans() if s.kind == SpanKind.CLIENT]


def attempt_events(span: ReadableSpan) -> list[dict[str, object]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == names.SPAN_EVENT_ATTEMPT_FAILED]


def metric_sum(capture: Capture, metric: str, **attrs: object) -> float:
    """Sum of the matching points: values of sums and gauges, counts of histograms."""
    total = 0.0
    for point in capture.metric_points(metric):
        if all(point.attributes.get(k) == v for k, v in attrs.items()):
            total += point.value if point.value is not None else point.count
    return total
