"""Sessions: every caller of a gym server gets a stable, signed session id.

A resources server keeps per-episode state in memory and needs to know which episode a request belongs
to. The session middleware gives each caller a session id (``scope["session"][SESSION_ID_KEY]``, so
``request.session["session_id"]`` works in handlers, and :func:`current_session_id`), puts it on the SERVER
span (``gym.session.id``) and on every log line, and hands a new caller a signed token (issued when the
request first uses its session, so stateless routes pay nothing for it): a cookie
(``gym_obs_session``) for clients with a cookie jar, and the ``X-NG-Session`` reply header for clients
without one (gym's own pools share connections across rollouts and keep no cookies: send the token back
as the ``X-NG-Session`` header). Tokens are HMAC-SHA256 signed with a per-server key, so a caller cannot
forge or pick another caller's session; only the id travels, the state stays in the server.

With several uvicorn workers the state of one session must live in one process: see
``gym_obs.server._session_routing`` (``routes_sessions_to_owner``).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
import structlog
from opentelemetry import trace
from starlette.types import ASGIApp, Message, Receive, Scope

from gym_obs.failures.transport import current_log_holder
from gym_obs.server._exchange import Exchange
from gym_obs.server._steps import RequestSteps
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE

__all__ = [
    "MAX_SESSION_ID_CHARS",
    "SESSION_ID_KEY",
    "OwnedSessionRouting",
    "SessionLayer",
    "SessionMiddleware",
    "SessionSigner",
    "current_session_id",
    "derive_session_key",
    "ensure_session_secret",
    "session_from_headers",
    "session_from_request",
]

SESSION_ID_KEY: Final = "session_id"
MAX_SESSION_ID_CHARS: Final = 256

#: the session id a request names, resolved before the sessions step (by the owner router, or from the JSON
#: body); ``None``: it names none
RESOLVED_SCOPE_KEY: Final = "gym_obs.session"
_MAX_TOKEN_CHARS: Final = 512
_SIG_BYTES: Final = 16
_MAX_JSON_BODY: Final = 1 << 20
_COOKIE: Final = names.SESSION_COOKIE
_HEADER: Final = names.SESSION_HEADER.lower().encode("latin-1")
_SET_COOKIE: Final = b"set-cookie"
_COOKIE_HEADER: Final = b"cookie"


@dataclass(frozen=True)
class OwnedSessionRouting:
    """Where requests name their session, and how long a session (and its owning worker) lasts.

    ``cookie``/``header``: the signed token in the ``gym_obs_session`` cookie / ``X-NG-Session`` header
    (the header wins). ``json_field``: a top-level field of a JSON request body naming a caller-chosen
    session id (an episode id); it is not signed, so use it only for ids that are not secrets.
    ``ownership_ttl_s``: a token older than this is refused and the caller gets a new session (which may
    be owned by another worker); ``None`` keeps sessions for the server's lifetime. Caller-chosen ids
    do not expire.
    """

    cookie: bool = True
    header: bool = True
    json_field: str | None = None
    ownership_ttl_s: float | None = None


# --- keys and tokens --------------------------------------------------------------------------------------


def ensure_session_secret() -> str:
    """This deployment's session secret (``GYM_OBS_SESSION_SECRET``), generated and exported if unset.

    Exported so that processes started after this call (uvicorn workers, relaunched children) derive the
    same keys: every worker of a server must accept the tokens the others issued.
    """
    secret = os.environ.get(names.ENV_SESSION_SECRET)
    if not secret:
        secret = os.environ[names.ENV_SESSION_SECRET] = secrets.token_hex(32)
    return secret


def derive_session_key(server_name: str, secret: str | None = None) -> bytes:
    """The HMAC key of ``server_name``'s sessions: derived from ``secret`` (a config secret), else from the
    deployment secret; per server, so a token of one server is worthless at another."""
    master = secret or ensure_session_secret()
    return hmac.new(master.encode(), b"gym_obs.session:" + server_name.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _valid_id(value: object) -> str | None:
    if not isinstance(value, str) or not value or len(value) > MAX_SESSION_ID_CHARS:
        return None
    return value if value.isprintable() else None


class SessionSigner:
    """Issues and checks ``<id>.<issued, hex seconds>.<HMAC-SHA256, 128 bits>`` tokens."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a session key needs at least 16 bytes")
        self._key = key

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest()[:_SIG_BYTES])

    @staticmethod
    def new_session_id() -> str:
        return secrets.token_urlsafe(18)

    def issue(self, session_id: str, issued: int | None = None) -> str:
        payload = f"{session_id}.{int(time.time()) if issued is None else issued:x}"
        return f"{payload}.{self._mac(payload)}"

    def verify(self, token: object, max_age_s: float | None = None) -> str | None:
        """The session id of a valid, unexpired token, else ``None`` (never raises).

        Anything a caller can send is an invalid token, not an error: non-ASCII text (a header decoded as
        latin-1, a cookie with UTF-8 in it), control characters, a non-string.
        """
        if not isinstance(token, str) or not token or len(token) > _MAX_TOKEN_CHARS or not token.isascii():
            return None
        payload, _, mac = token.rpartition(".")
        session_id, _, issued_hex = payload.rpartition(".")
        if not session_id or not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        if max_age_s is not None:
            try:
                issued = int(issued_hex, 16)
            except ValueError:
                return None
            if time.time() - issued > max_age_s:
                return None
        return _valid_id(session_id)


# --- finding a request's session --------------------------------------------------------------------------


def _cookie_value(cookie_headers: list[bytes], name: str) -> str | None:
    for value in cookie_headers:
        for part in value.decode("latin-1").split(";"):
            cookie_name, sep, cookie_value = part.strip().partition("=")
            if sep and cookie_name == name:
                return cookie_value.strip().strip('"')
    return None


def _is_json(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(key == b"content-type" and b"json" in value.lower() for key, value in headers)


async def read_body(receive: Receive) -> tuple[list[Message], bytes]:
    """Every message of the request body (to replay) and the body itself."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def replaying(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that hands out ``messages`` first, then defers to the real one."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def json_field_value(body: bytes, field: str) -> str | None:
    if not body or len(body) > _MAX_JSON_BODY:
        return None
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _valid_id(data.get(field)) if isinstance(data, dict) else None


def session_from_headers(
    headers: Sequence[tuple[bytes, bytes]], signer: SessionSigner, routing: OwnedSessionRouting
) -> str | None:
    """The session a valid token names: the ``X-NG-Session`` header first (the last one), then the cookie.

    The headers are looked up through a dict built in C (every request passes here, and a Python loop
    over the headers costs several times more); only a request with a cookie walks them for every
    ``Cookie`` header.
    """
    return _session_from_header_map(headers, dict(headers), signer, routing)


def _session_from_header_map(
    headers: Sequence[tuple[bytes, bytes]],
    by_name: dict[bytes, bytes],
    signer: SessionSigner,
    routing: OwnedSessionRouting,
) -> str | None:
    """:func:`session_from_headers` with the headers by name already built (``by_name``)."""
    header_token = by_name.get(_HEADER)
    if header_token is not None and routing.header:
        found = signer.verify(header_token.decode("latin-1").strip(), routing.ownership_ttl_s)
        if found is not None:
            return found
    if _COOKIE_HEADER in by_name and routing.cookie:
        token = _cookie_value([value for key, value in headers if key == _COOKIE_HEADER], _COOKIE)
        if token:
            return signer.verify(token, routing.ownership_ttl_s)
    return None


async def session_from_request(
    scope: Scope, receive: Receive, signer: SessionSigner, routing: OwnedSessionRouting
) -> tuple[str | None, Receive]:
    """The session a request names (header token, cookie token, then JSON field), and the ``receive`` to
    use from now on (the body is replayed when it had to be read for the JSON field)."""
    found = session_from_headers(scope["headers"], signer, routing)
    if found is None and routing.json_field and scope["type"] == "http" and _is_json(scope["headers"]):
        messages, body = await read_body(receive)
        return json_field_value(body, routing.json_field), replaying(messages, receive)
    return found, receive


# --- the middleware ---------------------------------------------------------------------------------------


class RequestSession(dict[str, str]):
    """``scope["session"]``: holds the id of a session the request named, or issues one on first use.

    Issuing lazily keeps sessions free for requests that never use one (health probes, stateless routes):
    no id, no signature, no cookie. ``session[SESSION_ID_KEY]``, ``.get(SESSION_ID_KEY)`` and
    :func:`current_session_id` all issue it.

    Made by :meth:`SessionLayer.open` with no ``__init__`` (made in C on every request) and only its three
    slots set; the other fields are class-level defaults, stored (in the instance's ``__dict__``) only by
    a request that names or issues a session, or records a span. Its context (made current while the
    request runs) is the gym frame's to set: the request's exchange when the failure step runs (one
    context variable for the session and the failure log), else ``_CURRENT``.
    """

    __slots__ = ("__dict__", "_exchange", "_layer", "ends")

    _layer: SessionLayer
    #: a session issued during the request goes back on this exchange's reply (a start hook)
    _exchange: Exchange | None
    _span: Any = None
    #: set when issued here: the reply hands it to the caller
    token: str | None = None
    _log_tokens: list[Any] | None = None
    #: whether :meth:`end` has work to do when the request ends (log lines to unbind, a hook to drop); a
    #: slot, set when the session is made: the gym frame reads it on every request
    ends: bool

    def _adopt(self, session_id: str) -> None:
        dict.__setitem__(self, SESSION_ID_KEY, session_id)
        if self._span is not None and self._span.is_recording():
            self._span.set_attribute(names.ATTR_SESSION_ID, session_id)
        tokens = structlog.contextvars.bind_contextvars(session_id=session_id)
        self._log_tokens = [*(self._log_tokens or ()), tokens]
        self.ends = True

    def _unbind(self) -> None:
        for tokens in self._log_tokens or ():
            with contextlib.suppress(ValueError):  # bound in another context (a sync handler's thread)
                structlog.contextvars.reset_contextvars(**tokens)

    @property
    def session_id(self) -> str:
        found = dict.get(self, SESSION_ID_KEY)
        if found is None:
            found = self._layer.new_session_id()
            self.token = self._layer.signer.issue(found)
            self._adopt(found)
            if self._exchange is not None:  # only a request that issued a session pays for the hook
                self._exchange.on_start(self.on_reply_start)
        return found

    def on_reply_start(self, _exchange: Exchange, message: Message) -> Message:
        """The request's start hook (see ``_exchange``): ``message`` (an ``http.response.start``) handing
        back a session issued during this request."""
        return self._layer.reply_start(message, self)

    def end(self) -> None:
        """The request is over (called when :attr:`ends`): log lines no longer carry the session."""
        self._exchange = None  # (its hook refers back to this session: no cycle outlives the request)
        if self._log_tokens is not None:
            self._unbind()

    def __missing__(self, key: str) -> str:
        if key == SESSION_ID_KEY:
            return self.session_id
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.session_id if key == SESSION_ID_KEY else dict.get(self, key, default)


_CURRENT: Final[contextvars.ContextVar[RequestSession | None]] = contextvars.ContextVar(
    "gym_obs_session", default=None
)


def current_session_id() -> str | None:
    """The session of the request being handled (issued now if the request named none); ``None``
    outside a request of a server with sessions.

    Looked up on the current failure-log holder first (a gym server's request: its exchange, or a
    ``request_failure_log`` made inside the request, which keeps the request's session), then in the
    sessions step's own variable (a step running without the failure step)."""
    holder = current_log_holder()
    session = holder.session if holder is not None else None
    if not isinstance(session, RequestSession):
        session = _CURRENT.get()
    return session.session_id if session is not None else None


class SessionLayer:
    """What the sessions of one server share: signer, routing, owner check, excluded paths.

    The sessions step of the gym layers' one frame (``_steps``; :class:`SessionMiddleware` runs it on its
    own): ``open`` -> the session made current (by the frame) -> handler -> ``reply_start`` on the
    response start (only for a session issued here) -> the session's ``end`` (only when it ``ends``).
    """

    __slots__ = ("excluded_paths", "owns", "routing", "signer")

    def __init__(
        self,
        *,
        signer: SessionSigner,
        routing: OwnedSessionRouting | None = None,
        owns: Callable[[str], bool] | None = None,
        excluded_paths: Iterable[str] = (),
    ) -> None:
        self.signer = signer
        self.routing = routing or OwnedSessionRouting()
        self.owns = owns
        self.excluded_paths = frozenset(excluded_paths)

    def new_session_id(self) -> str:
        """A fresh id; under owner routing, drawn until this worker owns it (served where it was created)."""
        session_id = self.signer.new_session_id()
        if self.owns is not None:
            for _ in range(10_000):
                if self.owns(session_id):
                    break
                session_id = self.signer.new_session_id()
        return session_id

    def open(self, scope: Scope, exchange: Exchange | None = None) -> RequestSession | None:
        """The request's session, as ``scope["session"]`` and on ``exchange`` (not yet current: see
        :meth:`enter`; a session issued later goes back on ``exchange``'s reply), resolved from its headers;
        ``None`` when the JSON body must be read first (then call :meth:`open_reading_body`).

        A session resolved outside (``RESOLVED_SCOPE_KEY``: by the owner router; ``None``: no session named)
        is taken as it is. The headers are read through the exchange's ``headers_by_name`` (built once by
        the context layer); a request with neither the session header nor a cookie (most) verifies no token.
        The session is made here, not in a helper: every request of a server with sessions passes.
        """
        if RESOLVED_SCOPE_KEY in scope:
            session_id: str | None = scope.pop(RESOLVED_SCOPE_KEY)
        else:
            session_id = None
            headers = scope["headers"]
            by_name = exchange.headers_by_name if exchange is not None else None
            if by_name is None:
                by_name = dict(headers)
            if _HEADER in by_name or _COOKIE_HEADER in by_name:
                session_id = _session_from_header_map(headers, by_name, self.signer, self.routing)
            routing = self.routing
            if session_id is None and routing.json_field and scope["type"] == "http" and _is_json(headers):
                return None
        session = scope["session"] = RequestSession()
        session._layer = self
        session._exchange = exchange
        session.ends = False
        if exchange is not None:
            exchange.session = session
        if STATE.enabled:  # the SERVER span the request's session id goes on
            session._span = trace.get_current_span()
        if session_id is not None:
            session._adopt(session_id)
        return session

    #: make a session current for a step running without the failure step (``enter(session) -> token``;
    #: ``leave(token)``); with it, the request's exchange (holding the session) is made current instead
    enter = staticmethod(_CURRENT.set)
    leave = staticmethod(_CURRENT.reset)

    async def open_reading_body(
        self, scope: Scope, receive: Receive, exchange: Exchange | None = None
    ) -> tuple[RequestSession, Receive]:
        """:meth:`open` for a session named by a JSON field: the body is read and replayed."""
        messages, body = await read_body(receive)
        field = self.routing.json_field
        scope[RESOLVED_SCOPE_KEY] = json_field_value(body, field) if field else None
        session = self.open(scope, exchange)
        assert session is not None  # (resolved: the body is not asked for again)
        return session, replaying(messages, receive)

    def reply_start(self, message: Message, session: RequestSession) -> Message:
        """The ``http.response.start`` message with a session issued during this request handed back."""
        token = session.token
        if token is None:
            return message
        extra = [(_HEADER, token.encode("latin-1"))]
        if self.routing.cookie:
            extra.append((_SET_COOKIE, self._cookie_header(token)))
        return {**message, "headers": [*message.get("headers", ()), *extra]}

    def _cookie_header(self, token: str) -> bytes:
        cookie = f"{_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax"
        ttl = self.routing.ownership_ttl_s
        if ttl is not None:
            cookie += f"; Max-Age={int(ttl)}"
        return cookie.encode("latin-1")


class SessionMiddleware(RequestSteps):
    """Pure ASGI: resolve the caller's session, or issue one when the handler first asks for it; put the id
    on the SERVER span and on log lines; hand a new session's token back on the reply.

    Install it inside the SERVER span (the id goes on it) and outside the failure-reply layer (the session
    is still current when a failure reply is logged, and a failure reply hands a new session back too: the
    token is a start hook on the request's :class:`~gym_obs.server._exchange.Exchange`). ``owns`` (set
    under owner routing) says whether this worker owns a session id; new ids are drawn until this worker
    owns them, so a new session is always served where it was created.
    """

    __slots__ = ()

    def __init__(
        self,
        app: ASGIApp,
        *,
        signer: SessionSigner,
        routing: OwnedSessionRouting | None = None,
        owns: Callable[[str], bool] | None = None,
        excluded_paths: Iterable[str] = (),
    ) -> None:
        layer = SessionLayer(signer=signer, routing=routing, owns=owns, excluded_paths=excluded_paths)
        super().__init__(app, sessions=layer)
