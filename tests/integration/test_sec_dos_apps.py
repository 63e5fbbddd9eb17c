"""Servers for the denial-of-service regression tests (imported by launched children via ``entrypoint``).

No tests here: the file is named like its tests so that it stays with them.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from fastapi import FastAPI, Request

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
