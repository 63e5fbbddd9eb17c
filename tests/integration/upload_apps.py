"""Servers for the denial-of-service regression tests (imported by launched children via ``entrypoint``).

No tests here (the name does not start with test_, so pytest does not collect it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from gym_obs.server import SimpleServer
from gym_obs.server.sessions import SESSION_ID_KEY
from gym_obs.telemetry import names


class UploadServer(SimpleServer):
    """A resources server that routes sessions to their owner and digests uploads without holding them."""

    routes_sessions_to_owner = True

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.get("/client")
        async def client(request: Request) -> dict[str, Any]:
            host, port = request.scope["client"]
            return {"host": host, "port": port}

        @app.post("/session")
        async def session(request: Request) -> dict[str, Any]:
            return {"session_id": request.session[SESSION_ID_KEY], "pid": os.getpid()}

        @app.get("/hold")
        async def hold(seconds: float) -> StreamingResponse:
            """Say which worker this is, then block its event loop: it accepts no connection meanwhile."""

            async def body() -> AsyncIterator[bytes]:
                yield json.dumps({"pid": os.getpid()}).encode() + b"\n"
                await asyncio.sleep(0)
                time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point
                yield b"released\n"

            return StreamingResponse(body(), media_type="text/plain")

        @app.post("/upload")
        async def upload(request: Request) -> dict[str, Any]:
            digest = hashlib.sha256()
            length = 0
            async for chunk in request.stream():
                digest.update(chunk)
                length += len(chunk)
            return {
                "length": length,
                "sha256": digest.hexdigest(),
                "pid": os.getpid(),
                "session_id": request.session[SESSION_ID_KEY],
                "forwarded": request.headers.get(names.SESSION_FORWARDED_HEADER) is not None,
            }

        return app
