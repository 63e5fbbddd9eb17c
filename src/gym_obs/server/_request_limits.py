"""Request limits at the HTTP protocol: head size, head deadline, body size.

httptools has no limit of its own, and it builds each header value by concatenating the pieces of every
read (quadratic in the value's size): a 50 MB header cost seconds of CPU and stalled every other request
of the process. So the bytes are counted as they arrive, *before* they reach the parser: a head that
would pass ``max_head_bytes`` is never parsed past the limit and gets ``431``. A head that does not
complete within ``head_timeout_s`` of its first byte (or of the connection, for a client that sends
nothing) closes the connection (``408`` when part of a request had arrived): a slow-loris client can no
longer hold a connection, and its handler slot, forever. A body over ``max_body_bytes`` gets ``413``:
up front from ``Content-Length`` (the app never runs), or as soon as a chunked body passes the limit.
Chunked trailers and chunk extensions count as head bytes (they are parsed the same way).

Idle keep-alive connections are uvicorn's ``timeout_keep_alive`` (``timeout_keep_alive_s``).
The limits travel on the uvicorn Config (picklable), so spawned workers get them too.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gym_obs.config import ServerInstanceConfig

__all__ = ["LimitedHttpToolsProtocol", "RequestLimits", "attach_request_limits"]

_LIMITS_ATTR: Final = "_gym_obs_request_limits"
_DEFAULTS: Final = ServerInstanceConfig.model_fields
_LINGER_S: Final = 1.0  # after a refusal, how long the client's further bytes are read and dropped
_LINGER_BYTES: Final = 4 * 1024 * 1024  # ... and how many, at most


@dataclass(frozen=True)
class RequestLimits:
    """What one request may cost before the app sees it; defaults are the server config's."""

    max_head_bytes: int = _DEFAULTS["http_head_max_bytes"].default
    head_timeout_s: float = _DEFAULTS["http_head_timeout_s"].default
    max_body_bytes: int = _DEFAULTS["http_body_max_bytes"].default

    @classmethod
    def from_server(cls, server: ServerInstanceConfig) -> RequestLimits:
        return cls(
            max_head_bytes=server.http_head_max_bytes,
            head_timeout_s=server.http_head_timeout_s,
            max_body_bytes=server.http_body_max_bytes,
        )


def attach_request_limits(config: Any, limits: RequestLimits) -> None:
    """Give a uvicorn Config the limits its LimitedHttpToolsProtocol connections enforce."""
    setattr(config, _LIMITS_ATTR, limits)


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    lengths = [value for name, value in headers if name == b"content-length"]
    if not lengths:
        return None
    try:
        return max(int(value) for value in lengths)
    except ValueError:
        return None  # httptools refuses a malformed length itself


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads, head deadlines and bodies."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits: RequestLimits = getattr(config, _LIMITS_ATTR, None) or RequestLimits()
        self._in_body = False  # between on_headers_complete and on_message_complete
        self._head_bytes = 0  # bytes of the head being received (request line, headers, CRLFs)
        self._body_bytes = 0  # body bytes of the current request
        self._stalled_bytes = 0  # body-phase bytes that carried no body (trailers, chunk extensions)
        self._body_progress = False
        self._refused = False
        self._upgraded = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._discarded = 0

    # -- connection ------------------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_head_timer()  # a client that connects and sends nothing is a slow head too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        self._upgraded = True
        self._cancel_head_timer()
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            self._discard(data)
            return
        while data and not (self._refused or self._upgraded):
            if self._in_body:
                self._feed_body(data)
                return
            self._arm_head_timer()
            room = self._limits.max_head_bytes - self._head_bytes
            part, data = data[:room], data[room:]
            if part:
                self._head_bytes += len(part)
                super().data_received(part)
                if self.transport.is_closing():
                    return
            if data and not self._in_body and not self._upgraded:
                self._refuse_head(431, f"Request head larger than {self._limits.max_head_bytes} bytes.")
                return

    def _feed_body(self, data: bytes) -> None:
        self._body_progress = False
        super().data_received(data)
        if not self._in_body or self._refused:
            return  # the message ended in this read (its tail counted nothing here)
        if self._body_progress:
            self._stalled_bytes = 0
            return
        self._stalled_bytes += len(data)
        if self._stalled_bytes > self._limits.max_head_bytes:
            self._refuse_body(431, f"Request trailers larger than {self._limits.max_head_bytes} bytes.")

    # -- parser callbacks ----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self._in_body = True
        self._body_bytes = self._stalled_bytes = 0
        declared = _declared_length(self.headers)
        if declared is not None and declared > self._limits.max_body_bytes:
            self._refuse_head(413, f"Request body larger than {self._limits.max_body_bytes} bytes.")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_progress = True
        self._body_bytes += len(body)
        if self._body_bytes > self._limits.max_body_bytes:
            self._refuse_body(413, f"Request body larger than {self._limits.max_body_bytes} bytes.")
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._in_body = False
        self._head_bytes = 0

    # -- deadlines -----------------------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        if self._head_timer is None and not self._refused:
            self._head_timer = self.loop.call_later(self._limits.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_body or self._upgraded or self._refused or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm_head_timer()  # a pipelined head waits behind a reply still being written
            return
        if self._head_bytes == 0:
            self._refused = True
            self.transport.close()  # nothing of a request arrived: nothing to answer
            return
        self._refuse_head(408, f"Request head not received within {self._limits.head_timeout_s:g} s.")

    # -- refusals ------------------------------------------------------------------------------------------

    def _refuse_head(self, status: int, message: str) -> None:
        """Refuse the request whose head is arriving; a reply still being written is cut, not interleaved."""
        self._refused = True
        self._cancel_head_timer()
        self.logger.warning("%s (%d); closing the connection", message, status)
        previous = self.cycle
        if previous is not None and not previous.response_complete:
            previous.disconnected = True
            previous.message_event.set()
            self.transport.close()
            return
        self._write_refusal(status, message)

    def _refuse_body(self, status: int, message: str) -> None:
        """Refuse the request whose body is arriving: its app sees a disconnect and its reply is dropped."""
        self._refused = True
        self.logger.warning("%s (%d); closing the connection", message, status)
        cycle = self.cycle
        started = cycle is not None and cycle.response_started
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
        if started:
            self.transport.close()
        else:
            self._write_refusal(status, message)

    def _write_refusal(self, status: int, message: str) -> None:
        body = message.encode("ascii")
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(b"".join(content))
        if not transport.can_write_eof():
            transport.close()
            return
        # Lingering close: closing with the client's bytes still unread would reset the connection and
        # could destroy the reply before the client reads it. So end our side, read (and drop, unparsed)
        # what the client still sends for a moment, then close.
        transport.write_eof()
        self._linger = self.loop.call_later(_LINGER_S, transport.close)

    def _discard(self, data: bytes) -> None:
        self._discarded += len(data)
        if self._discarded > _LINGER_BYTES and not self.transport.is_closing():
            self.transport.close()
