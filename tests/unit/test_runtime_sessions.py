"""Session tokens and the session middleware in process (httpx ASGI transport, real SDK in-memory spans)."""

from __future__ import annotations

import collections
import time
from typing import Any

import httpx
import pytest
import structlog
from fastapi import FastAPI, Request
from opentelemetry.trace import SpanKind

from gym_obs.server import PathContextMiddleware, instrument_app_for_telemetry
from gym_obs.server._session_routing import owner_slot
from gym_obs.server.sessions import (
    SESSION_ID_KEY,
    OwnedSessionRouting,
    SessionMiddleware,
    SessionSigner,
    current_session_id,
    derive_session_key,
    ensure_session_secret,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.testing import Capture

KEY = derive_session_key("resources", "a-config-secret")


def test_tokens_round_trip_and_resist_tampering() -> None:
    signer = SessionSigner(KEY)
    token = signer.issue("abc")
    assert signer.verify(token) == "abc"
    _, issued, mac = token.split(".")
    assert signer.verify(f"abd.{issued}.{mac}") is None
    other = "B" if mac[0] == "A" else "A"
    assert signer.verify(f"abc.{issued}.{other}{mac[1:]}") is None
    assert signer.verify(f"abc.{int(issued, 16) + 1:x}.{mac}") is None
    assert signer.verify("") is None and signer.verify("abc") is None and signer.verify("x" * 5000) is None
    assert SessionSigner(derive_session_key("other", "a-config-secret")).verify(token) is None  # per server


def test_tokens_expire_after_the_ownership_ttl() -> None:
    signer = SessionSigner(KEY)
    old = signer.issue("abc", issued=int(time.time()) - 100)
    assert signer.verify(old) == "abc"
    assert signer.verify(old, max_age_s=200) == "abc"
    assert signer.verify(old, max_age_s=50) is None


def test_keys_derive_from_the_config_secret_or_the_deployment_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(names.ENV_SESSION_SECRET, raising=False)
    assert derive_session_key("a", "s") == derive_session_key("a", "s") != derive_session_key("b", "s")
    generated = derive_session_key("a")
    secret = ensure_session_secret()
    assert secret and len(secret) == 64
    assert derive_session_key("a") == generated  # exported: workers started later derive the same key
    with pytest.raises(ValueError):
        SessionSigner(b"short")


def test_owner_slots_are_stable_and_spread() -> None:
    ids = [f"session-{i}" for i in range(4000)]
    slots = collections.Counter(owner_slot(session_id, 4) for session_id in ids)
    assert set(slots) == {0, 1, 2, 3}
    assert min(slots.values()) > 800
    assert [owner_slot(i, 4) for i in ids[:50]] == [owner_slot(i, 4) for i in ids[:50]]


def _app(routing: OwnedSessionRouting | None = None, **kwargs: Any) -> FastAPI:
    app = FastAPI()
    seen: list[dict[str, Any]] = []

    @app.api_route("/whoami", methods=["GET", "POST"])
    async def whoami(request: Request) -> dict[str, Any]:
        body = await request.body()
        entry = {
            "session_id": request.session[SESSION_ID_KEY],
            "current": current_session_id(),
            "log": structlog.contextvars.get_contextvars().get("session_id"),
            "body": body.decode(),
        }
        seen.append(entry)
        return entry

    @app.get("/livez")
    async def livez(request: Request) -> dict[str, bool]:
        return {"has_session": "session" in request.scope}

    @app.get("/stateless")
    async def stateless() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/current")
    def current() -> dict[str, Any]:  # a sync handler: runs on a worker thread with the request's context
        current = current_session_id()  # issues the session: from here on it is on log lines
        return {"current": current, "log": structlog.contextvars.get_contextvars().get("session_id")}

    app.state.seen = seen
    app.add_middleware(
        SessionMiddleware, signer=SessionSigner(KEY), routing=routing, excluded_paths=("/livez",), **kwargs
    )
    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


async def test_a_session_survives_many_requests_by_cookie() -> None:
    async with _client(_app()) as client:
        first = await client.get("/whoami")
        session_id = first.json()["session_id"]
        assert first.json()["current"] == first.json()["log"] == session_id
        assert "httponly" in first.headers["set-cookie"].lower()
        assert SessionSigner(KEY).verify(client.cookies[names.SESSION_COOKIE]) == session_id
        for _ in range(20):
            reply = await client.get("/whoami")
            assert reply.json()["session_id"] == session_id
            assert "set-cookie" not in reply.headers  # issued once
    assert current_session_id() is None
    assert structlog.contextvars.get_contextvars().get("session_id") is None


async def test_callers_without_cookies_use_the_header_and_forged_tokens_get_a_new_session() -> None:
    async with _client(_app()) as client:
        first = await client.get("/whoami")
        token = first.headers[names.SESSION_HEADER]
        client.cookies.clear()
        again = await client.get("/whoami", headers={names.SESSION_HEADER: token})
        assert again.json()["session_id"] == first.json()["session_id"]
        client.cookies.clear()
        mac = token.rsplit(".", 1)[1]
        forged = token[: -len(mac)] + ("B" if mac[0] == "A" else "A") + mac[1:]
        other = await client.get("/whoami", headers={names.SESSION_HEADER: forged})
        assert other.json()["session_id"] != first.json()["session_id"]
        client.cookies.clear()
        fresh = await client.get("/whoami")
        assert fresh.json()["session_id"] not in (first.json()["session_id"], other.json()["session_id"])


async def test_json_field_names_a_caller_chosen_session_and_the_body_is_replayed() -> None:
    app = _app(OwnedSessionRouting(cookie=False, header=False, json_field="episode_id"))
    async with _client(app) as client:
        reply = await client.post("/whoami", json={"episode_id": "ep-7", "x": 1})
        assert reply.json()["session_id"] == "ep-7"
        assert reply.json()["body"] == '{"episode_id":"ep-7","x":1}'
        assert names.SESSION_HEADER not in reply.headers  # named by the caller: nothing issued
        minted = await client.post("/whoami", json={"other": 1})
        assert minted.json()["session_id"] and "set-cookie" not in minted.headers
        assert names.SESSION_HEADER in minted.headers


async def test_excluded_paths_get_no_session() -> None:
    async with _client(_app()) as client:
        reply = await client.get("/livez")
    assert "set-cookie" not in reply.headers
    assert reply.json() == {"has_session": False}


async def test_sessions_are_issued_only_when_used() -> None:
    async with _client(_app()) as client:
        reply = await client.get("/stateless")
        assert "set-cookie" not in reply.headers and names.SESSION_HEADER not in reply.headers
        used = await client.get("/current")
        assert used.json()["current"] == used.json()["log"]
        token = used.headers[names.SESSION_HEADER]
        assert SessionSigner(KEY).verify(token) == used.json()["current"]
        again = await client.get("/current")
        assert again.json()["current"] == used.json()["current"]
    assert structlog.contextvars.get_contextvars().get("session_id") is None


async def test_new_sessions_are_drawn_until_owned() -> None:
    app = _app(owns=lambda session_id: owner_slot(session_id, 8) == 3)
    async with _client(app) as client:
        for _ in range(10):
            client.cookies.clear()
            reply = await client.get("/whoami")
            assert owner_slot(reply.json()["session_id"], 8) == 3


async def test_session_id_is_on_the_server_span(telemetry: Capture) -> None:
    app = _app()
    assert instrument_app_for_telemetry(app)
    async with _client(app) as client:
        reply = await client.get("/whoami")
    (server,) = [span for span in telemetry.spans() if span.kind == SpanKind.SERVER]
    assert server.attributes is not None
    assert server.attributes[names.ATTR_SESSION_ID] == reply.json()["session_id"]


# --- SimpleServer: the session steps fused into the failure-reply layer ------------------------------------


def _simple_server(name: str = "resources", **server: Any) -> Any:
    from gym_obs.config import parse_global_config
    from gym_obs.server import SimpleServer

    class EpisodeServer(SimpleServer):
        def setup_webserver(self) -> FastAPI:
            app = FastAPI()
            steps: collections.Counter[str] = collections.Counter()

            @app.post("/step")
            async def step(request: Request) -> dict[str, Any]:
                session_id = request.session[SESSION_ID_KEY]
                steps[session_id] += 1
                log = structlog.contextvars.get_contextvars().get("session_id")
                return {"session_id": session_id, "steps": steps[session_id], "log": log}

            @app.get("/stateless")
            async def stateless() -> dict[str, bool]:
                return {"ok": True}

            return app

    entry = {"entrypoint": "x.y:EpisodeServer", "server_type": "resources_servers", "port": 28040, **server}
    return EpisodeServer(name, parse_global_config({"servers": {name: entry}}))


def test_public_session_names_and_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(names.ENV_SESSION_SECRET, raising=False)
    assert SESSION_ID_KEY == "session_id"
    secret = "a-config-secret-of-16+"
    configured = _simple_server(session_secret=secret)
    key = configured.get_session_middleware_key()
    assert isinstance(key, bytes) and len(key) == 32
    assert key == configured.get_session_middleware_key() == derive_session_key("resources", secret)
    assert key != _simple_server("other", session_secret=secret).get_session_middleware_key()
    generated = _simple_server().get_session_middleware_key()
    assert generated == _simple_server().get_session_middleware_key() != key  # one deployment secret
    assert configured.multiple_workers_unsupported_reason() is None


async def test_simple_server_sessions_are_stable_on_the_span_and_in_logs(telemetry: Capture) -> None:
    app = _simple_server().build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as plain:
        stateless = await plain.get("/stateless")
        assert names.SESSION_HEADER not in stateless.headers and "set-cookie" not in stateless.headers
        first = await plain.post("/step")
        token = first.headers[names.SESSION_HEADER]
        session_id = first.json()["session_id"]
        assert first.json()["log"] == session_id
        plain.cookies.clear()  # a client without a cookie jar: the header carries the token
        for count in range(2, 52):
            reply = await plain.post("/step", headers={names.SESSION_HEADER: token})
            assert reply.json() == {"session_id": session_id, "steps": count, "log": session_id}
            assert names.SESSION_HEADER not in reply.headers  # issued once
        assert (await plain.get("/livez")).status_code == 200
    spans = [span for span in telemetry.spans() if span.kind == SpanKind.SERVER]
    with_session = [span for span in spans if span.attributes and names.ATTR_SESSION_ID in span.attributes]
    assert len(with_session) == 51
    assert {span.attributes[names.ATTR_SESSION_ID] for span in with_session} == {session_id}  # type: ignore[index]
    assert current_session_id() is None


async def test_the_session_step_reads_the_headers_the_context_layer_indexed_as_it_reads_them_itself() -> None:
    """Behind the context layer the session step looks headers up in the index that layer built (and
    verifies no token when a request carries neither the header nor a cookie): same sessions as alone."""
    signer = SessionSigner(KEY)
    token, other = signer.issue("by-header"), signer.issue("by-cookie")
    cookie = f"{names.SESSION_COOKIE}={other}"
    requests: list[dict[str, str]] = [
        {},
        {names.SESSION_HEADER: token},
        {"Cookie": cookie},
        {names.SESSION_HEADER: token, "Cookie": cookie},  # the header wins
        {names.SESSION_HEADER: "forged.1.abc", "Cookie": cookie},  # an invalid header: the cookie
        {"Cookie": f"theme=dark; {cookie}"},
        {names.SESSION_HEADER: "forged.1.abc"},
        {names.ROLLOUT_ID_HEADER: "r-1", names.SESSION_HEADER: token},
    ]
    answers: dict[str, list[Any]] = {}
    for name, app in (("alone", _app()), ("behind the context layer", PathContextMiddleware(_app()))):
        async with _client(app) as client:
            answers[name] = []
            for headers in requests:
                client.cookies.clear()
                reply = (await client.get("/whoami", headers=headers)).json()
                named = reply["session_id"] in {"by-header", "by-cookie"}
                answers[name].append(reply["session_id"] if named else "issued")
    assert answers["alone"] == answers["behind the context layer"]
    header, cookie_named = "by-header", "by-cookie"
    expected = ["issued", header, cookie_named, header, cookie_named, cookie_named, "issued", header]
    assert answers["alone"] == expected
