"""Helpers for the client security regression tests (issues 11/12): a raw OTLP sink, a subprocess runner, a
header-recording server. Ports 30500-30999."""

from __future__ import annotations

import asyncio
import gzip
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

import gym_obs

SRC = str(Path(gym_obs.__file__).resolve().parents[1])
REPO_ROOT = str(Path(SRC).parent)

CANARY = "sk-CANARYc4n4ry0123456789xyz"
"""A canary secret in the shape of a provider key: every scrubber knows it, so any occurrence is a leak."""


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_OBS_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, REPO_ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


async def start_script(script: str, env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", textwrap.dedent(script), *args, env=clean_env(env),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def wait_listening(port: int, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def read_all(directory: Path) -> bytes:
    """Every file under ``directory``, concatenated (span files, logs) to grep."""
    return b"".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


@dataclass
class RawSink:
    """Every request body (decompressed) and header set it received, as bytes to grep."""

    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@asynccontextmanager
async def raw_sink(port: int, status: int = 200) -> AsyncIterator[RawSink]:
    sink = RawSink()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        sink.bodies.append(body)
        sink.headers.append({k.lower(): v for k, v in request.headers.items()})
        sink.paths.append(request.path_qs)
        return web.Response(status=status, body=b"")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    try:
        yield sink
    finally:
        await runner.cleanup()
