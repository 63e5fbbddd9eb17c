"""Owner routing: under several uvicorn workers, every request of a session is served by one worker.

uvicorn's workers share one listening socket and the kernel hands each connection to whichever worker
accepts it, so two requests of the same session may land on two processes, each with half the state. A
server that sets ``routes_sessions_to_owner`` gets this middleware outermost (before telemetry): each
worker claims a slot ``0..num_workers-1`` (an ``flock`` on a file in a directory shared by the workers, so
a restarted worker takes over the slot of the one that died), serves the same app on a private loopback
port registered next to its slot, and owns the sessions whose id hashes to its slot. A request naming a
session owned by another worker is proxied, untouched (path segments, ``traceparent``, body), to the
owner's private port through the control pool; the owner does all telemetry, so there is still exactly
one SERVER span. New sessions are issued with an id this worker owns, so they never move.
Ownership lasts as long as the session (see ``OwnedSessionRouting.ownership_ttl_s``) and follows the slot:
a worker that dies takes its sessions' state with it; its replacement owns the same ids, fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import aiohttp
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from yarl import URL

from gym_obs.client import global_config_from_environment
from gym_obs.client.http_client import get_global_aiohttp_control_client
from gym_obs.server._forward_body import ForwardedBody
from gym_obs.server._request_limits import LimitedHttpToolsProtocol, RequestLimits, attach_request_limits
from gym_obs.server.sessions import (
    RESOLVED_SCOPE_KEY,
    OwnedSessionRouting,
    SessionSigner,
    session_from_request,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.logging import get_logger

__all__ = ["OwnerRoutingMiddleware", "owner_routing_dir", "owner_slot", "worker_routing_environment"]

_FORWARDED: Final = names.SESSION_FORWARDED_HEADER.lower().encode("latin-1")
_HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",  # recomputed by whoever sends the body on
    }
)
_REPLY_DROP: Final = _HOP_BY_HOP - {b"content-length"} | {b"date", b"server"}
_FORWARD_SLACK: Final = 1024
_CLAIM_TIMEOUT_S: Final = 30.0
_OWNER_WAIT_S: Final = 10.0
_RETRY_S: Final = 0.05

_log = get_logger("gym_obs.server.sessions")


def owner_slot(session_id: str, num_workers: int) -> int:
    """The worker slot owning ``session_id``: stable across processes and restarts."""
    digest = hashlib.blake2b(session_id.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_workers


def _limits_from_environment() -> RequestLimits:
    """This worker's request limits: its server's entry of the config the launcher passed to the workers
    (they run from that config; see ``run_webserver``), else the defaults."""
    try:
        config = global_config_from_environment()
        name = os.environ.get(names.ENV_SERVER_NAME)
        if config is not None and name in config.servers:
            return RequestLimits.from_server(config.servers[name])
    except ValueError:
        pass
    return RequestLimits()


class _OwnerUnavailableError(ConnectionError):
    pass


class _Slot:
    """This worker's claim on a slot, plus where every slot's private port is."""

    def __init__(self, directory: Path, num_workers: int) -> None:
        self.directory = directory
        self.num_workers = num_workers
        self.index: int | None = None
        self._fd: int | None = None
        self._ports: dict[int, int] = {}

    async def claim(self) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + _CLAIM_TIMEOUT_S
        while True:
            for index in range(self.num_workers):
                fd = os.open(self.directory / f"slot-{index}.lock", os.O_CREAT | os.O_RDWR, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                self.index, self._fd = index, fd  # held (and the slot owned) until this process exits
                return index
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no free worker slot of {self.num_workers} in {self.directory} "
                    f"after {_CLAIM_TIMEOUT_S:g}s"
                )
            await asyncio.sleep(0.1)

    def publish(self, port: int) -> None:
        assert self.index is not None
        path = self.directory / f"slot-{self.index}.json"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "port": port}), encoding="utf-8")
        os.replace(tmp, path)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                (self.directory / f"slot-{self.index}.json").unlink()
            os.close(self._fd)
            self._fd = None

    def port(self, index: int, *, fresh: bool = False) -> int | None:
        if not fresh and index in self._ports:
            return self._ports[index]
        try:
            data = json.loads((self.directory / f"slot-{index}.json").read_text(encoding="utf-8"))
            port = int(data["port"])
        except (OSError, ValueError, KeyError, TypeError):
            self._ports.pop(index, None)
            return None
        self._ports[index] = port
        return port


class _PrivateServer:
    """The same app on a private loopback port, for requests other workers forward to this one."""

    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        # The forwarded head carries one more header than the caller's, which the public port checked.
        self.limits = dataclasses.replace(limits, max_head_bytes=limits.max_head_bytes + _FORWARD_SLACK)
        self._server: Any = None
        self._sock: socket.socket | None = None

    async def start(self, state: dict[str, Any] | None) -> int:
        import uvicorn
        from uvicorn.lifespan.off import LifespanOff

        config = uvicorn.Config(
            _RestoreForwardedClient(self.app),
            host="127.0.0.1",
            port=0,
            http=LimitedHttpToolsProtocol,
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=False,  # the forwarding worker already applied the proxy rules
            server_header=False,
            date_header=False,  # the worker answering the caller adds its own
            timeout_keep_alive=75,
        )
        attach_request_limits(config, self.limits)
        config.load()
        server = uvicorn.Server(config)
        lifespan = LifespanOff(config)
        if state is not None:
            lifespan.state = state  # the app's lifespan state, shared with the public server
        server.lifespan = lifespan
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await server.startup(sockets=[sock])
        self._server, self._sock = server, sock
        port: int = sock.getsockname()[1]
        return port

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.should_exit = True
            await server.shutdown(sockets=[self._sock] if self._sock is not None else None)


class _RestoreForwardedClient:
    """On the private port only: the caller's address and scheme as the forwarding worker saw them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for key, value in scope["headers"]:
                if key == _FORWARDED:
                    _restore_client(scope, value.decode("latin-1"))
                    break
        await self.app(scope, receive, send)


def _restore_client(scope: Scope, value: str) -> None:
    # "<slot> <scheme> <host> <port>"
    parts = value.split(" ")
    if len(parts) == 4 and parts[3].isdigit():
        scope["scheme"] = parts[1]
        scope["client"] = (parts[2], int(parts[3]))


def _forward_headers(scope: Scope, slot: int) -> list[tuple[str, str]]:
    headers = [
        (key.decode("latin-1"), value.decode("latin-1"))
        for key, value in scope["headers"]
        if key not in _HOP_BY_HOP and key != _FORWARDED
    ]
    host, port = scope.get("client") or ("-", 0)
    scheme = scope.get("scheme", "http")
    headers.append((names.SESSION_FORWARDED_HEADER, f"{slot} {scheme} {host} {port}"))
    return headers


def _reply_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(key.lower(), value) for key, value in raw if key.lower() not in _REPLY_DROP]


class OwnerRoutingMiddleware:
    """Outermost middleware of a multi-worker server that routes sessions to their owning worker."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        signer: SessionSigner,
        routing: OwnedSessionRouting,
        num_workers: int,
        routing_dir: str | os.PathLike[str],
        excluded_paths: Iterable[str] = (),
        limits: RequestLimits | None = None,
    ) -> None:
        self.app = app
        self.signer = signer
        self.routing = routing
        self.num_workers = num_workers
        self.excluded_paths = frozenset(excluded_paths)
        self.slot = _Slot(Path(routing_dir), num_workers)
        self._private = _PrivateServer(app, limits or _limits_from_environment())
        self._lifespan_state: dict[str, Any] | None = None

    def owns(self, session_id: str) -> bool:
        """Whether this worker owns ``session_id`` (always, until it holds a slot)."""
        index = self.slot.index
        return index is None or owner_slot(session_id, self.num_workers) == index

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if kind != "http" or scope["path"] in self.excluded_paths or self.slot.index is None:
            await self.app(scope, receive, send)
            return
        session_id, receive = await session_from_request(scope, receive, self.signer, self.routing)
        if session_id is not None:
            owner = owner_slot(session_id, self.num_workers)
            if owner != self.slot.index:
                await self._forward(scope, receive, send, owner)
                return
            scope[RESOLVED_SCOPE_KEY] = session_id
        await self.app(scope, receive, send)

    # -- lifespan: slot and private server -----------------------------------------------------------------

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        self._lifespan_state = state if isinstance(state, dict) else None

        async def lifespan_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self._stop()  # stop taking forwarded requests before the app shuts down
            return message

        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await self._start()
                except Exception as error:
                    _log.exception("session owner routing failed to start")
                    await send({"type": "lifespan.startup.failed", "message": f"session routing: {error}"})
                    return
            await send(message)

        await self.app(scope, lifespan_receive, lifespan_send)

    async def _start(self) -> None:
        index = await self.slot.claim()
        port = await self._private.start(self._lifespan_state)
        self.slot.publish(port)
        _log.info("session owner routing", slot=index, workers=self.num_workers, private_port=port)

    async def _stop(self) -> None:
        await self._private.stop()
        self.slot.release()

    # -- forwarding ----------------------------------------------------------------------------------------

    async def _forward(self, scope: Scope, receive: Receive, send: Send, owner: int) -> None:
        body = ForwardedBody(receive)
        await body.read_prefix()
        if body.caller_gone.is_set():
            return
        proxy = asyncio.ensure_future(self._proxy(scope, body, send, owner))
        watch = asyncio.ensure_future(body.wait_disconnect())
        try:
            await asyncio.wait({proxy, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (proxy, watch):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if proxy.done() and not proxy.cancelled():
            proxy.result()

    async def _proxy(self, scope: Scope, body: ForwardedBody, send: Send, owner: int) -> None:
        session = get_global_aiohttp_control_client()
        raw_path = scope.get("raw_path") or scope["path"].encode("utf-8")
        target = raw_path.decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = _forward_headers(scope, self.slot.index or 0)
        deadline = time.monotonic() + _OWNER_WAIT_S
        fresh = False
        started = False
        while True:
            port = self.slot.port(owner, fresh=fresh)
            try:
                if port is None:
                    raise _OwnerUnavailableError(f"worker slot {owner} has no private port yet")
                async with session.request(
                    scope["method"],
                    URL(f"http://127.0.0.1:{port}{target}", encoded=True),
                    headers=headers,
                    data=body.payload(),
                    allow_redirects=False,
                    auto_decompress=False,
                    skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                ) as response:
                    started = True
                    await send(
                        {
                            "type": "http.response.start",
                            "status": response.status,
                            "headers": _reply_headers(response.raw_headers),
                        }
                    )
                    async for chunk in response.content.iter_any():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
            except (aiohttp.ClientConnectionError, _OwnerUnavailableError) as error:
                if started:
                    raise  # the owner went away mid-reply: the caller sees a broken reply, as it would
                if not body.replayable:
                    # Part of a streamed body went to the owner and is gone: it cannot be sent again.
                    await _owner_unavailable(send, owner, error)
                    return
                # Nothing reached the caller: the owner is restarting, not up yet, or a pooled connection
                # to its old port went stale. Re-read its port and retry, bounded. (A request the dead owner
                # had started is replayed to its successor, whose state for the session starts afresh.)
                if time.monotonic() > deadline:
                    await _owner_unavailable(send, owner, error)
                    return
                fresh = True
                await asyncio.sleep(_RETRY_S)


async def _owner_unavailable(send: Send, owner: int, error: Exception) -> None:
    _log.warning("session owner unavailable", slot=owner, error=str(error))
    body = json.dumps(
        {"detail": f"the worker owning this session (slot {owner}) is unavailable; retry later"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


@contextlib.contextmanager
def worker_routing_environment(server_name: str) -> Iterator[Path]:
    """A fresh slot directory for one multi-worker server, exported (``GYM_OBS_SESSION_ROUTING_DIR``) to
    the workers it is about to start, removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix=f"gym-obs-sessions-{server_name}-"))
    previous = os.environ.get(names.ENV_SESSION_ROUTING_DIR)
    os.environ[names.ENV_SESSION_ROUTING_DIR] = str(directory)
    try:
        yield directory
    finally:
        if previous is None:
            os.environ.pop(names.ENV_SESSION_ROUTING_DIR, None)
        else:
            os.environ[names.ENV_SESSION_ROUTING_DIR] = previous
        shutil.rmtree(directory, ignore_errors=True)


def owner_routing_dir() -> Path | None:
    """The slot directory a worker was started with, if any."""
    value = os.environ.get(names.ENV_SESSION_ROUTING_DIR)
    return Path(value) if value else None
