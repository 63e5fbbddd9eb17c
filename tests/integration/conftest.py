"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from tests.integration.client_support import REPLY, Action, RawServer, ServerFactory, next_port


@pytest.fixture
async def raw_server() -> AsyncIterator[ServerFactory]:
    """Start misbehaving loopback servers on demand; all are stopped when the test ends."""
    started: list[RawServer] = []

    async def start(plan: Callable[[int], Action] = lambda _i: REPLY, port: int | None = None) -> RawServer:
        server = await RawServer(port or next_port(), plan).start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()
