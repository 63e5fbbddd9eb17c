"""The server of the SERVER-span conformance test: one route per kind of request the span must describe.

Imported by the launched child process through its ``entrypoint``, so it works from the global config alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, WebSocket
from fastapi.responses import StreamingResponse

from gym_obs.failures.event import NgFailureEvent
from gym_obs.server import SimpleServer

SECRET = "sk-CONFORMc0nf0rm0123456789"


class ConformanceServer(SimpleServer):
    """GET/POST 2xx, 4xx, 5xx, an unhandled exception, streams, a router prefix and a websocket."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.get("/items/{item_id}")
        async def item(item_id: str) -> dict[str, Any]:
            return {"item": item_id}

        @app.post("/echo")
        async def echo(body: dict[str, Any]) -> dict[str, Any]:
            return body

        @app.get("/missing/{key}")
        async def missing(key: str) -> None:
            raise HTTPException(status_code=404, detail=f"no {key}")

        @app.get("/unavailable")
        async def unavailable() -> None:
            raise NgFailureEvent("provider_unavailable", "overloaded", boundary="model", http_status=503)

        @app.get("/boom")
        async def boom() -> None:
            raise RuntimeError(f"database unreachable (api_key={SECRET})")

        @app.get("/stream")
        async def stream() -> StreamingResponse:
            async def chunks() -> AsyncIterator[bytes]:
                for index in range(3):
                    yield f"chunk {index}\n".encode()

            return StreamingResponse(chunks(), media_type="text/plain")

        @app.get("/stream_fails")
        async def stream_fails() -> StreamingResponse:
            async def chunks() -> AsyncIterator[bytes]:
                yield b"first\n"
                raise ValueError(f"stream broke (token={SECRET})")

            return StreamingResponse(chunks(), media_type="text/plain")

        router = APIRouter()

        @router.get("/things/{thing_id}")
        async def thing(thing_id: int) -> dict[str, int]:
            return {"thing": thing_id}

        app.include_router(router, prefix="/api")

        @app.websocket("/ws")
        async def ws(websocket: WebSocket) -> None:
            await websocket.accept()
            await websocket.send_text("hello")
            await websocket.close()

        return app
