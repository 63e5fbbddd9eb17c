"""A request body streamed from the caller to another process, without holding it whole.

The session-routing proxy used to read the whole body before forwarding it (a 300 MB POST cost the
forwarding worker +877 MB). Now only a small prefix is held: a body that fits in it is forwarded as bytes
and can be sent again if the owner's connection fails before it answered; a larger one is streamed chunk
by chunk as the caller sends it (uvicorn pauses reading the caller while a chunk waits), so the
forwarding worker holds at most a few chunks. A streamed body can be sent only once. The body size limit
is the HTTP protocol's (``http_body_max_bytes``, 413), applied before any of this runs.

One reader of ``receive``: while the body streams, the stream itself notices a caller that goes away;
after the body, :meth:`ForwardedBody.wait_disconnect` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from starlette.types import Receive

__all__ = ["REPLAYABLE_BYTES", "ForwardedBody"]

REPLAYABLE_BYTES: Final = 256 * 1024
"""A body up to this size is held whole (replayable); a larger one is streamed."""


class ForwardedBody:
    """The caller's body: a held prefix, then (if any) the rest as it arrives."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._prefix: list[bytes] = []
        self._prefix_size = 0
        self.complete = False  # the caller has sent its whole body
        self.caller_gone = asyncio.Event()
        self._body_done = asyncio.Event()
        self._streamed = False

    async def read_prefix(self) -> None:
        """Read up to :data:`REPLAYABLE_BYTES` (or the whole body, if smaller), or until the caller leaves."""
        while not self.complete and self._prefix_size < REPLAYABLE_BYTES:
            if not await self._read_one():
                return

    async def _read_one(self) -> bool:
        """Read one message into the prefix; False if the caller went away."""
        message = await self._receive()
        if message["type"] != "http.request":
            self.caller_gone.set()
            return False
        chunk = message.get("body", b"")
        if chunk:
            self._prefix.append(chunk)
            self._prefix_size += len(chunk)
        if not message.get("more_body", False):
            self.complete = True
            self._body_done.set()
        return True

    @property
    def replayable(self) -> bool:
        """Whether the body can still be sent (again): held whole, or its stream not yet started."""
        return not self._streamed

    def payload(self) -> bytes | AsyncIterator[bytes] | None:
        """What to send on: the bytes when held whole, else a one-shot stream."""
        if self.complete:
            return b"".join(self._prefix) or None
        return self._stream()

    async def _stream(self) -> AsyncIterator[bytes]:
        if self._streamed:
            raise RuntimeError("a streamed request body can be sent only once")
        self._streamed = True
        prefix, self._prefix = self._prefix, []  # handed on: not held any longer
        for chunk in prefix:
            yield chunk
        while not self.complete:
            message = await self._receive()
            if message["type"] != "http.request":
                self.caller_gone.set()
                # Never end the stream here: a short body would reach the owner as if it were whole.
                await asyncio.Event().wait()
            chunk = message.get("body", b"")
            if not message.get("more_body", False):
                self.complete = True
            if chunk:
                yield chunk
        self._body_done.set()

    async def wait_disconnect(self) -> None:
        """Return when the caller goes away (whether during or after its body)."""
        done = asyncio.ensure_future(self._body_done.wait())
        gone = asyncio.ensure_future(self.caller_gone.wait())
        try:
            await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (done, gone):
                task.cancel()
        if self.caller_gone.is_set():
            return
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.caller_gone.set()
                return
