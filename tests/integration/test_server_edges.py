"""Edge cases of one SimpleServer under a real uvicorn on loopback: malformed and encoded path segments,
streaming, validation errors, secrets in failures, SERVER spans for unknown routes, sessions on failure
replies, every ``poll_for_status`` outcome, and finding the config through a real head server.

Ports 28000-28099.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import StreamingResponse
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from pydantic import BaseModel

from gym_obs.client import HeadServerUnavailableError, ServerClient
from gym_obs.client.http_client import close_global_aiohttp_client
from gym_obs.config import GlobalConfig, HeadServerConfig, parse_global_config
from gym_obs.failures import FAILURE_REPORT_BODY_KEY, FailureReport, NgFailureEvent
from gym_obs.server import SESSION_ID_KEY, SimpleServer
from gym_obs.server.head_server import HeadServer
from gym_obs.server.launcher import LaunchError, launch
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import current_rollout_id, rollout_path_prefix
from gym_obs.telemetry.testing import Capture

pytestmark = pytest.mark.integration

PORT = 28010
HEAD_PORT = 28011
TRACED_PORT = 28012
HANG_PORT = 28024
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"
SECRET = "sk-live-ABCDEF1234567890abcdef"


HANGS: list[str] = []  # what ``/hang`` went through


class _Item(BaseModel):
    count: int


class EdgeServer(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        @app.get("/where")
        async def where(request: Request) -> dict[str, Any]:
            context = trace.get_current_span().get_span_context()
            return {
                "path": request.url.path,
                "trace_id": format(context.trace_id, "032x") if context.is_valid else None,
                "rollout_id": current_rollout_id(),
            }

        @app.get("/items/{item_id}")
        async def item(item_id: str) -> dict[str, Any]:
            return {"item": item_id, "rollout_id": current_rollout_id()}

        @app.post("/validate")
        async def validate(item: _Item) -> _Item:
            return item

        @app.get("/secret_failure")
        async def secret_failure() -> None:
            raise NgFailureEvent(
                "judge_failed", f"judge rejected api_key={SECRET}", boundary="resources_server"
            )

        @app.get("/secret_crash")
        async def secret_crash() -> None:
            raise RuntimeError(f"db login failed password={SECRET}")

        @app.get("/session_then_crash")
        async def session_then_crash(request: Request) -> None:
            assert request.session[SESSION_ID_KEY]
            raise RuntimeError("after the session was issued")

        @app.get("/hang")
        async def hang() -> None:
            """Waits to be cancelled (its caller hangs up), noting the watcher tasks there are meanwhile."""
            await asyncio.sleep(0.1)  # past the disconnect watch's delay: a watcher would run by now
            watchers = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "_Watch._watch"]
            HANGS.append(f"waiting with {len(watchers)} watchers")
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                HANGS.append("cancelled")
                raise

        @app.get("/stream")
        async def stream() -> StreamingResponse:
            async def chunks() -> AsyncIterator[str]:
                for index in range(3):
                    yield f"chunk{index}\n"
                    await asyncio.sleep(0.01)

            return StreamingResponse(chunks(), media_type="text/plain")

        @app.websocket("/ws")
        async def ws(websocket: WebSocket) -> None:
            await websocket.accept()
            await websocket.send_text(websocket.session[SESSION_ID_KEY])
            await websocket.close()

        return app


def _config(**server: Any) -> GlobalConfig:
    entry = {"entrypoint": f"{__name__}:EdgeServer", "server_type": "resources_servers", "port": PORT}
    return parse_global_config(
        {"head_server": {"port": HEAD_PORT}, "servers": {"edge": {**entry, **server}}}
    )


@contextlib.contextmanager
def _uvicorn(app: Any, port: int, host: str = "127.0.0.1", http: str = "auto") -> Iterator[None]:
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=host, port=port, http=http, log_level="warning", lifespan="on", log_config=None
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def running() -> Iterator[str]:
    app = EdgeServer("edge", _config()).build_app()
    with _uvicorn(app, PORT):
        yield f"http://127.0.0.1:{PORT}"


@pytest.fixture
async def http(running: str) -> AsyncIterator[httpx.AsyncClient]:
    """The module's server: built with telemetry off."""
    async with httpx.AsyncClient(base_url=running) as client:
        yield client


@pytest.fixture
async def traced(telemetry: Capture) -> AsyncIterator[httpx.AsyncClient]:
    """A server built (and called) with telemetry on."""
    app = EdgeServer("edge", _config(port=TRACED_PORT)).build_app()
    with _uvicorn(app, TRACED_PORT):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{TRACED_PORT}") as client:
            telemetry.clear()
            yield client


# --- path segments --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "segment",
    [
        "garbage",
        "",
        f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01",  # wrong length
        f"00-{TRACE_ID.upper()}-{SPAN_ID}-01",  # uppercase hex is invalid (W3C)
        f"00-{'0' * 32}-{SPAN_ID}-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE_ID}-{SPAN_ID}-01",  # version ff is forbidden
    ],
)
async def test_malformed_trace_segment_is_stripped_and_ignored(
    traced: httpx.AsyncClient, segment: str
) -> None:
    """Decision: the segment is still a segment (stripped, so routing never depends on it), but an invalid
    value is dropped: the request starts its own trace instead of joining a bogus one (no 400)."""
    response = await traced.get(f"/ng-trace/{segment}/where")
    assert response.status_code == 200
    body = response.json()
    assert body["path"] == "/where"
    assert body["trace_id"] not in (None, TRACE_ID, "0" * 32)


async def test_segments_in_either_order_and_encoded_rollout_ids(traced: httpx.AsyncClient) -> None:
    for path in (
        f"/ng-trace/{TRACEPARENT}/ng-rollout/r-1/where",
        f"/ng-rollout/r-1/ng-trace/{TRACEPARENT}/where",
    ):
        body = (await traced.get(path)).json()
        assert body == {"path": "/where", "trace_id": TRACE_ID, "rollout_id": "r-1"}, path
    for rollout_id in ("ep/7", "a b", "100%", "%41", "ü"):
        response = await traced.get(rollout_path_prefix(rollout_id) + "/items/x%20y")
        assert response.status_code == 200, rollout_id
        assert response.json() == {"item": "x y", "rollout_id": rollout_id}


async def test_a_valid_header_wins_over_the_segment_and_a_malformed_one_does_not(
    traced: httpx.AsyncClient,
) -> None:
    header_trace = "11111111111111111111111111111111"
    valid = {"traceparent": f"00-{header_trace}-2222222222222222-01"}
    body = (await traced.get(f"/ng-trace/{TRACEPARENT}/where", headers=valid)).json()
    assert body["trace_id"] == header_trace
    malformed = {"traceparent": "00-not-a-trace-01"}
    body = (await traced.get(f"/ng-trace/{TRACEPARENT}/where", headers=malformed)).json()
    assert body["trace_id"] == TRACE_ID


async def test_segment_stripped_when_traces_are_off(http: httpx.AsyncClient) -> None:
    body = (await http.get(f"/ng-trace/{TRACEPARENT}/ng-rollout/r-off/where")).json()
    assert body == {"path": "/where", "trace_id": None, "rollout_id": "r-off"}


# --- replies --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_caller_hanging_up_cancels_the_handler_with_no_task_per_request(http: str) -> None:
    """Under uvicorn (either HTTP implementation) the disconnect step watches uvicorn's own flags: the
    hung-up request is cancelled and no watcher task was started for it (the path for other servers would
    have one by then)."""
    HANGS.clear()
    app = EdgeServer("edge", _config(port=HANG_PORT)).build_app()
    with _uvicorn(app, HANG_PORT, http=http):
        reader, writer = await asyncio.open_connection("127.0.0.1", HANG_PORT)
        writer.write(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        for _ in range(200):
            if HANGS:
                break
            await asyncio.sleep(0.01)
        writer.close()
        await writer.wait_closed()
        for _ in range(200):
            if HANGS[-1:] == ["cancelled"]:
                break
            await asyncio.sleep(0.01)
        assert HANGS == ["waiting with 0 watchers", "cancelled"]
        assert await reader.read() == b""  # nothing was sent for the abandoned request


async def test_streaming_and_validation_replies_pass_through(http: httpx.AsyncClient) -> None:
    async with http.stream("GET", "/stream") as response:
        chunks = [chunk async for chunk in response.aiter_text()]
    assert "".join(chunks) == "chunk0\nchunk1\nchunk2\n"
    invalid = await http.post("/validate", json={"count": "many"})
    assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == ["body", "count"]
    assert names.FAILURE_REPORT_HEADER not in invalid.headers
    assert (await http.get("/not-a-route")).status_code == 404


async def test_no_secret_and_no_traceback_in_failure_replies(http: httpx.AsyncClient) -> None:
    for path, status in (("/secret_failure", 500), ("/secret_crash", 500)):
        response = await http.get(path)
        assert response.status_code == status
        wire = response.text + response.headers.get(names.FAILURE_REPORT_HEADER, "")
        assert SECRET not in wire and "Traceback" not in wire and 'File "' not in wire, path
        assert FailureReport.from_payload(response.json()[FAILURE_REPORT_BODY_KEY]).final_record is not None


async def test_a_session_issued_before_a_crash_is_handed_back_on_the_failure_reply(
    http: httpx.AsyncClient,
) -> None:
    response = await http.get("/session_then_crash")
    assert response.status_code == 500
    assert response.headers.get(names.SESSION_HEADER)
    assert names.SESSION_COOKIE in response.headers.get("set-cookie", "")


async def test_websockets_get_a_session_too(running: str) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(f"{running}/ws") as websocket:
        message = await websocket.receive(timeout=5)
    assert message.type == aiohttp.WSMsgType.TEXT and message.data


async def test_one_server_span_for_unknown_routes_and_none_for_health(
    traced: httpx.AsyncClient, telemetry: Capture
) -> None:
    await traced.get("/not-a-route")
    await traced.get("/ng-rollout/r-9/not-a-route")
    spans = telemetry.spans()
    assert [span.kind for span in spans] == [SpanKind.SERVER, SpanKind.SERVER]
    assert spans[1].attributes is not None and spans[1].attributes[names.ATTR_ROLLOUT_ID] == "r-9"
    telemetry.clear()
    await traced.get("/livez")
    await traced.get("/readyz")
    assert telemetry.spans() == []


# --- ServerClient -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _silent_listener(port: int) -> Iterator[None]:
    """Accepts connections (the kernel does) and never answers: a hung server."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(8)
        yield


async def test_poll_for_status_outcomes(running: str) -> None:
    config = parse_global_config(
        {
            "servers": {
                "up": {"entrypoint": "a.b:C", "server_type": "resources_servers", "port": PORT},
                "down": {"entrypoint": "a.b:C", "server_type": "resources_servers", "port": 28013},
                "hung": {"entrypoint": "a.b:C", "server_type": "resources_servers", "port": 28014},
                "starting": {"entrypoint": "a.b:C", "server_type": "resources_servers", "port": 28015},
            }
        }
    )
    client = ServerClient(config)
    not_ready = FastAPI()

    @not_ready.get("/readyz")
    async def readyz() -> dict[str, str]:
        raise RuntimeError("still loading")

    try:
        assert await client.poll_for_status("up") == "success"
        assert await client.poll_for_status("down", timeout_seconds=2) == "connection_error"
        with _silent_listener(28014):
            started = time.monotonic()
            assert await client.poll_for_status("hung", timeout_seconds=0.5) == "timeout"
            assert time.monotonic() - started < 3
        with _uvicorn(not_ready, 28015):
            assert await client.poll_for_status("starting") == "unknown_error"
    finally:
        await close_global_aiohttp_client()


def test_load_from_global_config_fetches_from_a_running_head_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(names.ENV_GLOBAL_CONFIG, raising=False)
    config = _config(model_name="m-1")
    assert HeadServerConfig().port == 11000
    with _uvicorn(HeadServer(config, poll_servers=False).build_app(), HEAD_PORT):
        client = ServerClient.load_from_global_config(HeadServerConfig(port=HEAD_PORT))
        assert client.global_config == config
        assert client.server_config("edge").own_config() == {"model_name": "m-1"}
        yaml_text = httpx.get(f"http://127.0.0.1:{HEAD_PORT}/global_config.yaml").text
        assert "model_name: m-1" in yaml_text
    with pytest.raises(HeadServerUnavailableError, match=rf"http://127\.0\.0\.1:{HEAD_PORT}/global_config"):
        ServerClient.load_from_global_config(HeadServerConfig(port=HEAD_PORT))


def test_environment_config_wins_over_the_head_server(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(model_name="from-env")
    monkeypatch.setenv(names.ENV_GLOBAL_CONFIG, config.model_dump_json())
    # No head server runs on this port: the environment must be enough.
    assert ServerClient.load_from_global_config(HeadServerConfig(port=28016)).global_config == config


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


_NO_IPV6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")


@pytest.mark.parametrize("host", ["0.0.0.0", pytest.param("::", marks=_NO_IPV6)])
async def test_wildcard_bind_hosts_are_reachable(host: str) -> None:
    config = _config(host=host, port=28017)
    app = EdgeServer("edge", config).build_app()
    client = ServerClient(config)
    try:
        with _uvicorn(app, 28017, host=host):
            assert await client.poll_for_status("edge") == "success"
            response = await client.get("edge", "/items/1")
            assert response.status == 200
            response.release()
    finally:
        await close_global_aiohttp_client()


# --- launcher ---------------------------------------------------------------------------------------------


def test_a_server_that_never_becomes_ready_is_named_after_a_bounded_wait(tmp_path: Path) -> None:
    config = parse_global_config(
        {
            "head_server": {"port": 28020},
            "servers": {
                "loader": {
                    "entrypoint": "tests.integration.server_apps:NeverReadyServer",
                    "server_type": "responses_api_models",
                    "port": 28021,
                    "startup_timeout_s": 3,
                }
            },
        }
    )
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught, launch(config, log_dir=tmp_path):
        pass
    message = str(caught.value)
    assert message.startswith(
        "server 'loader' did not become ready at http://127.0.0.1:28021/readyz within 3s"
    )
    assert "still loading the weights" in message  # the tail of its log
    assert time.monotonic() - started < 25
    with pytest.raises(OSError):  # stopped again
        urllib.request.urlopen("http://127.0.0.1:28021/livez", timeout=1)


_SERVER_YAML = "servers:\n  m:\n    entrypoint: a.b:C\n    server_type: resources_servers\n    port: 28022\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the file is empty"),
        ("servers: [unclosed\n", "line 2, column 1"),
        ("head_server: {port: 1}\nhead_server: {port: 2}\n", "duplicate key 'head_server'"),
        ("bogus: 1\n", "bogus: unknown key"),
        ("head_server: {hots: x}\n", "head_server.hots: unknown key"),
        (
            "servers:\n  m:\n    entrypoint: a.b:C\n    server_type: resources_servers\n    port: high\n",
            "servers.m.port: Input should be a valid integer",
        ),
        (
            "servers:\n  m:\n    server_type: resources_servers\n    port: 28022\n",
            "servers.m.entrypoint: Field required",
        ),
        (
            "servers:\n  m:\n    entrypoint: nocolon\n    server_type: resources_servers\n    port: 28022\n",
            "servers.m.entrypoint: must look like 'package.module:ClassName'",
        ),
        (_SERVER_YAML + "    num_workers: 0\n", "servers.m.num_workers: Input should be greater than"),
        (_SERVER_YAML + "    num_workers: -2\n", "servers.m.num_workers: Input should be greater than"),
    ],
)
def test_serve_command_gives_one_clear_message_for_bad_configs(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "serve", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("gym_obs: ") and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["missing.yaml"], "cannot read global config"),
        (["config.yaml", "--log-dir", "config.yaml/logs"], "cannot create the log directory"),
    ],
)
def test_serve_command_reports_unusable_paths(tmp_path: Path, args: list[str], expected: str) -> None:
    (tmp_path / "config.yaml").write_text("head_server: {port: 28023}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 1 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
