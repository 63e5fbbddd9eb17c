"""Owner routing streams bodies (issue 12, item 13), on a real two-worker server.

A large POST for a session owned by the other worker is streamed to the owner: the forwarding worker's
resident memory grows by far less than the body (VmRSS sampled from /proc while the upload runs) and the
owner receives every byte (length and SHA-256 compared). A body over ``http_body_max_bytes`` gets 413,
announced (Content-Length) or discovered while streaming (chunked).

Ports: head 31600, upload server 31601.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import select
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from gym_obs.config import GlobalConfig, parse_global_config
from gym_obs.server.launcher import Launch, launch
from gym_obs.telemetry import names
from tests.integration.otlp_receiver import LAUNCH_ENV

pytestmark = pytest.mark.integration

HEAD_PORT = 31600
PORT = 31601
URL = f"http://127.0.0.1:{PORT}"
MIB = 1024 * 1024
LIMIT = 128 * MIB
BODY = 96 * MIB
CHUNK = 64 * 1024


def _config() -> GlobalConfig:
    return parse_global_config(
        {
            "head_server": {"port": HEAD_PORT},
            "servers": {
                "uploads": {
                    "entrypoint": "tests.integration.upload_apps:UploadServer",
                    "server_type": "resources_servers",
                    "port": PORT,
                    "num_workers": 2,
                    "http_body_max_bytes": LIMIT,
                }
            },
        }
    )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    with launch(_config(), log_dir=tmp_path_factory.mktemp("logs"), env=LAUNCH_ENV) as running:
        asyncio.run(_both_workers_accepting())
        yield running


async def _both_workers_accepting() -> None:
    """The launcher is ready when one worker answers; wait until the other accepts too (one is held)."""
    async with _fresh() as session:
        for _ in range(60):
            held, response = await _hold(session, 0.5)
            served, _ = await _session_token(session)
            await response.read()
            response.release()
            if served != held:
                return
    raise AssertionError("the second worker never accepted a connection")


def _fresh() -> aiohttp.ClientSession:
    # A new connection per request: the kernel picks the accepting worker again every time.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()
    )


async def _session_token(session: aiohttp.ClientSession) -> tuple[int, str]:
    """A new session's token and the worker owning it (new sessions are owned by their issuing worker)."""
    async with session.post(f"{URL}/session") as response:
        assert response.status == 200
        return (await response.json())["pid"], response.headers[names.SESSION_HEADER]


async def _hold(session: aiohttp.ClientSession, seconds: float) -> tuple[int, aiohttp.ClientResponse]:
    """Block whichever worker accepts this for ``seconds``; returns its pid as soon as it is blocked."""
    response = await session.get(f"{URL}/hold", params={"seconds": str(seconds)})
    assert response.status == 200
    return json.loads(await response.content.readline())["pid"], response


@contextlib.asynccontextmanager
async def _through_the_other_worker(owner: int) -> AsyncIterator[None]:
    """While inside, a new connection is accepted by the worker that is *not* ``owner``.

    The owner's event loop is blocked (it accepts nothing). A hold that lands on the other worker blocks it,
    so the next hold lands on the owner; on a loaded machine a short hold may end before the next request
    arrives, so holds repeat (each as long as the one before or longer, so the owner's, started last, ends
    last) until one lands on the owner.
    """
    held: list[aiohttp.ClientResponse] = []
    async with _fresh() as session:
        try:
            pid, response = await _hold(session, 2.0)
            held.append(response)
            for _ in range(4):
                if pid == owner:
                    break
                pid, response = await _hold(session, 8.0)
                held.append(response)
            assert pid == owner
            yield
        finally:
            for response in held:
                await response.read()
                response.release()


def _chunk(index: int) -> bytes:
    return hashlib.sha256(index.to_bytes(8, "big")).digest() * (CHUNK // 32)


def _expected_digest(size: int) -> str:
    digest = hashlib.sha256()
    for index in range(size // CHUNK):
        digest.update(_chunk(index))
    return digest.hexdigest()


async def _body(size: int) -> AsyncIterator[bytes]:
    for index in range(size // CHUNK):
        yield _chunk(index)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


class _PeakRss:
    """The highest VmRSS of some processes while a block runs (sampled every 10 ms)."""

    def __init__(self, pids: list[int]) -> None:
        self.baseline = {pid: _rss_bytes(pid) for pid in pids}
        self.peak = dict(self.baseline)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            for pid in self.peak:
                self.peak[pid] = max(self.peak[pid], _rss_bytes(pid))

    def growth(self, pid: int) -> int:
        return self.peak[pid] - self.baseline[pid]

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def test_a_large_post_is_streamed_through_the_forwarding_worker(deployment: Launch) -> None:
    async with _fresh() as session:
        owner, token = await _session_token(session)
    pids = {owner, *(int(pid) for pid in _worker_pids(deployment))}
    (forwarder,) = pids - {owner}
    for _ in range(3):
        reply, rss = await _upload_through_the_other_worker(owner, forwarder, token)
        assert reply["pid"] == owner
        if reply["forwarded"]:
            break
        # The owner accepted the upload itself: its hold ended before the connection arrived (a loaded
        # machine), so nothing was forwarded and the setup is repeated.
    assert reply["forwarded"], "the upload never landed on the forwarding worker"
    assert (reply["length"], reply["sha256"]) == (BODY, _expected_digest(BODY))  # every byte arrived
    # The forwarding worker held a few chunks, not the body (it used to hold it about three times over).
    assert rss.growth(forwarder) < BODY // 8, f"forwarder grew {rss.growth(forwarder) / MIB:.1f} MiB"


async def _upload_through_the_other_worker(
    owner: int, forwarder: int, token: str
) -> tuple[dict[str, Any], _PeakRss]:
    """Upload the large body on a connection the owner does not accept; the reply and both workers' RSS."""
    with _PeakRss([owner, forwarder]) as rss:
        async with (
            _through_the_other_worker(owner),
            _fresh() as session,
            session.post(
                f"{URL}/upload", data=_body(BODY), headers={names.SESSION_HEADER: token}
            ) as response,
        ):
            assert response.status == 200, await response.text()
            reply: dict[str, Any] = await response.json()
    return reply, rss


def _worker_pids(deployment: Launch) -> list[str]:
    """The uvicorn workers of the launched server: the children of its process."""
    parent = deployment.servers["uploads"].pid
    with open(f"/proc/{parent}/task/{parent}/children", encoding="ascii") as handle:
        children = handle.read().split()
    workers = []
    for child in children:  # uvicorn spawns its workers; the resource tracker is a child too
        with open(f"/proc/{child}/cmdline", "rb") as handle:
            if b"spawn_main" in handle.read():
                workers.append(child)
    assert len(workers) == 2, children
    return workers


def _send_until_answered(head: bytes, body_chunk: bytes, total: int) -> bytes:
    """Send ``head`` then body chunks up to ``total`` bytes, stopping when the server answers or closes."""
    sent = 0
    with socket.create_connection(("127.0.0.1", PORT)) as sock:
        sock.sendall(head)
        try:
            while sent < total:
                readable, writable, _ = select.select([sock], [sock], [], 10)
                if readable:
                    break
                if writable:
                    sent += sock.send(body_chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(15)
        received = b""
        try:
            while data := sock.recv(65536):
                received += data
        except ConnectionResetError:
            pass
    assert sent < total  # refused before the whole body was sent
    return received


async def test_a_body_over_the_limit_gets_413(deployment: Launch) -> None:
    async with _fresh() as session:
        owner, token = await _session_token(session)
    for _ in range(2):
        announced = (
            f"POST /upload HTTP/1.1\r\nHost: x\r\n{names.SESSION_HEADER}: {token}\r\n"
            f"Content-Length: {LIMIT + 1}\r\n\r\n"
        ).encode()
        async with _through_the_other_worker(owner):
            received = await asyncio.to_thread(_send_until_answered, announced, b"x" * CHUNK, LIMIT + 1)
        assert received.startswith(b"HTTP/1.1 413 "), received[:200]

        chunked = (
            f"POST /upload HTTP/1.1\r\nHost: x\r\n{names.SESSION_HEADER}: {token}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        frame = b"%x\r\n" % CHUNK + b"y" * CHUNK + b"\r\n"
        async with _through_the_other_worker(owner):  # streamed to the owner until the limit
            received = await asyncio.to_thread(_send_until_answered, chunked, frame, 2 * LIMIT)
        assert received.startswith(b"HTTP/1.1 413 "), received[:200]

    async with (
        _fresh() as session,
        session.post(  # the workers still serve after refusing
            f"{URL}/upload", data=b"z" * 1000, headers={names.SESSION_HEADER: token}
        ) as response,
    ):
        assert response.status == 200
        assert (await response.json())["length"] == 1000
