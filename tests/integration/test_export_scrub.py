"""Issue 12.2: no query string, fragment, userinfo or exception secret leaves a process on any span.

A real uvicorn server runs the contrib FastAPI instrumentation (which records ``url.query``, the raw
``http.target`` and the SDK's raw tracebacks) and exports over OTLP/HTTP, to the file sink and to the
console at once. Requests plant a canary in the query, the fragment-like tail, and in exception messages;
every byte the OTLP receiver got, every file line and the console output are grepped for it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from tests.integration.relay_support import CANARY, raw_sink, read_all, start_script, wait_listening

pytestmark = pytest.mark.integration

APP_PORT = 30500
OTLP_PORT = 30501

_SERVER = f"""
    import asyncio
    import uvicorn
    from fastapi import FastAPI
    from opentelemetry import trace
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from gym_obs.telemetry.setup import setup_telemetry
    from gym_obs.telemetry.spans import record_exception

    CANARY = {CANARY!r}
    handle = setup_telemetry("sec_app", "resources_server")
    app = FastAPI()

    @app.get("/echo")
    async def echo() -> dict:
        return {{"ok": True}}

    @app.get("/boom")
    async def boom() -> dict:
        raise ValueError("upstream said api_key=" + CANARY)

    @app.get("/record")
    async def record() -> dict:
        span = trace.get_current_span()
        try:
            raise RuntimeError("the token is " + CANARY)
        except RuntimeError as exc:
            span.record_exception(exc)          # the SDK's: a raw traceback
            record_exception(span, exc)         # gym_obs's own
        return {{"ok": True}}

    @app.post("/stop")
    async def stop() -> dict:
        server.should_exit = True
        return {{"ok": True}}

    FastAPIInstrumentor.instrument_app(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port={APP_PORT}, log_level="critical"))
    asyncio.run(server.serve())
    print("SHUTDOWN", handle.shutdown(timeout_s=10.0), flush=True)
"""


async def test_contrib_server_spans_leak_no_query_or_exception_secret(tmp_path: Path) -> None:
    env = {
        "GYM_OBS_TELEMETRY": "1",
        "OTEL_TRACES_EXPORTER": "otlp,file,console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{OTLP_PORT}",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "http/dup",  # old and new keys: http.target, http.url, url.query
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "GYM_OBS_TELEMETRY_DIR": str(tmp_path),
    }
    async with raw_sink(OTLP_PORT) as sink:
        proc = await start_script(_SERVER, env)
        try:
            await wait_listening(APP_PORT)
            base = f"http://127.0.0.1:{APP_PORT}"
            async with aiohttp.ClientSession() as session:
                for path in (
                    f"/echo?api_key={CANARY}",
                    f"/echo?x&q={CANARY}",
                    f"/boom?token={CANARY}",
                    f"/record?{CANARY}",
                ):
                    async with session.get(base + path) as response:
                        await response.read()
                async with session.post(base + "/stop") as response:
                    await response.read()
        finally:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert b"SHUTDOWN True" in stdout, stderr.decode(errors="replace")[-2000:]

    otlp = b"".join(sink.bodies)
    files = read_all(tmp_path)
    # The spans really arrived on every surface, with their exception events (the test could fail).
    for surface in (otlp, files, stdout):
        assert b"/boom" in surface and b"/record" in surface
        assert b"exception.stacktrace" in surface and b"[REDACTED]" in surface
    assert b"url.query" not in otlp and b"url.query" not in files
    for surface in (otlp, files, stdout):
        assert CANARY.encode() not in surface
        assert b"CANARYc4n4ry" not in surface
    assert all(json.loads(line) for line in files.splitlines() if line.strip())  # OTLP JSON lines
