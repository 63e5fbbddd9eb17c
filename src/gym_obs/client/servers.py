"""Reaching the other servers of a deployment by name: ServerClient, server URLs, bind addresses.

A process started by the launcher already has the resolved global config in its environment
(``GYM_OBS_GLOBAL_CONFIG``); any other process (a harness, a notebook) fetches it from the head server.
``ServerClient`` requests go through :func:`gym_obs.client.request` as internal gym calls, so they get the
retries, the CLIENT span, trace propagation and the ``gym.server.name`` label; the current rollout id
travels as the ``X-NG-Rollout-Id`` header (and on the span as ``gym.rollout.id``). The destination's config
says whether its dialect routes are model calls, with which provider and model allow-list.

Code that is not a gym client (third-party SDKs, subprocess agents) uses :func:`get_server_url`. A
subprocess agent (a harness in a sandbox, a CLI tool) cannot read the global config or carry a context
variable across ``exec``; its parent gives it two environment variables instead
(:func:`subprocess_agent_env`): ``GYM_OBS_MODEL_SERVER_NAME`` and ``GYM_OBS_MODEL_SERVER_BASE_URL``, the
latter already carrying the parent's ``/ng-rollout/<id>`` (and ``/ng-trace/<traceparent>``) segments.
:func:`get_server_url` prefers that URL over any config look-up, so the child's calls land in the parent's
rollout and trace without the child knowing about either.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Final, Literal

import aiohttp
from multidict import CIMultiDict

from gym_obs.client._request import request
from gym_obs.client._sessions import default_server_client, get_global_aiohttp_control_client
from gym_obs.client.model_calls import ModelCallTarget, model_call_target
from gym_obs.config import (
    ConfigError,
    GlobalConfig,
    HeadServerConfig,
    ServerInstanceConfig,
    parse_global_config,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import ROLLOUT_ID, apply_rollout_prefix, current_rollout_id

__all__ = [
    "HeadServerUnavailableError",
    "PollStatus",
    "ServerClient",
    "connectable_host",
    "fetch_global_config",
    "get_server_url",
    "global_config_from_environment",
    "head_server_from_environment",
    "model_server_url_from_env",
    "server_base_url",
    "subprocess_agent_env",
]

PollStatus = Literal["success", "connection_error", "timeout", "unknown_error"]

_HEAD_TIMEOUT_S: Final = 5.0
_READY_PATH: Final = "/readyz"
_WILDCARD_HOSTS: Final = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


# -- addresses -------------------------------------------------------------------------------------------


def connectable_host(host: str) -> str:
    """A bind address a client can connect to: wildcard binds (0.0.0.0, ::) become loopback."""
    return _WILDCARD_HOSTS.get(host, host)


def server_base_url(host: str, port: int) -> str:
    """``http://host:port`` with wildcard hosts made connectable and IPv6 literals bracketed."""
    host = connectable_host(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def model_server_url_from_env(server_name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``GYM_OBS_MODEL_SERVER_BASE_URL`` (no trailing slash) when ``GYM_OBS_MODEL_SERVER_NAME`` names
    ``server_name``, else ``None``: the one rule both :func:`get_server_url` and ``ServerClient`` follow."""
    if environ is None:
        environ = os.environ
    if environ.get(names.ENV_MODEL_SERVER_NAME) != server_name:
        return None
    url = environ.get(names.ENV_MODEL_SERVER_BASE_URL, "").strip()
    return url.rstrip("/") or None


# -- the global config -----------------------------------------------------------------------------------


class HeadServerUnavailableError(ConnectionError):
    """The head server could not be reached or gave no usable config; the message says where we looked."""


def head_server_from_environment() -> HeadServerConfig | None:
    """The head server named by ``GYM_OBS_HEAD_SERVER`` (``host:port`` or ``http://host:port``), else
    ``None``: how a driver outside the launcher finds a deployment without a config file."""
    raw = os.environ.get(names.ENV_HEAD_SERVER, "").strip()
    if not raw:
        return None
    text = raw.removeprefix("http://").rstrip("/")
    host, sep, port = text.rpartition(":")
    try:
        if not sep or "/" in text:
            raise ValueError(raw)
        return HeadServerConfig(host=host.strip("[]") or "127.0.0.1", port=int(port))
    except (ValueError, TypeError):
        raise ConfigError(
            f"${names.ENV_HEAD_SERVER} must be host:port or http://host:port, got {raw[:100]!r}"
        ) from None


def global_config_from_environment() -> GlobalConfig | None:
    """The config the launcher injected into this process (``GYM_OBS_GLOBAL_CONFIG``), else ``None``."""
    raw = os.environ.get(names.ENV_GLOBAL_CONFIG)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise ConfigError(f"${names.ENV_GLOBAL_CONFIG} is not valid JSON: {error}") from None
    return parse_global_config(data, source=f"${names.ENV_GLOBAL_CONFIG}")


def fetch_global_config(
    head_server_config: HeadServerConfig, *, timeout_s: float = _HEAD_TIMEOUT_S
) -> GlobalConfig:
    """GET ``/global_config`` from the head server (blocking; proxies from the environment are ignored)."""
    url = server_base_url(head_server_config.host, head_server_config.port) + "/global_config"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    hint = (
        "is the head server running (`gym-obs serve CONFIG.yaml`)? Processes started by the launcher get "
        f"the config through ${names.ENV_GLOBAL_CONFIG} instead"
    )
    try:
        with opener.open(url, timeout=timeout_s) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise HeadServerUnavailableError(
            f"the head server at {url} answered HTTP {error.code}; {hint}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise HeadServerUnavailableError(
            f"could not fetch the global config from the head server at {url}: {reason}; {hint}"
        ) from None
    return parse_global_config(data, source=url)


class ServerClient:
    """Finds servers by name in the global config and sends requests to them."""

    def __init__(
        self, global_config: GlobalConfig, head_server_config: HeadServerConfig | None = None
    ) -> None:
        self.global_config = global_config
        self.head_server_config = head_server_config or global_config.head_server
        self._base_urls: dict[str, str] = {}
        self._model_targets: dict[str, ModelCallTarget] = {}
        # A subprocess agent's parent-given model server (see base_url): read once, here. A process's
        # environment is given when it starts; reading it per request cost every hop an os.environ look-up.
        env_name = os.environ.get(names.ENV_MODEL_SERVER_NAME)
        self._env_server: tuple[str, str] | None = None
        if env_name is not None:
            env_url = model_server_url_from_env(env_name)
            if env_url is not None:
                self._env_server = (env_name, env_url)

    @classmethod
    def load_from_global_config(cls, head_server_config: HeadServerConfig | None = None) -> ServerClient:
        """The launcher's config when this process was launched by it (or by one of its servers: the
        environment is inherited), else the head server's: ``head_server_config``, else
        ``GYM_OBS_HEAD_SERVER`` (``host:port``), else 127.0.0.1:11000.

        Raises :class:`HeadServerUnavailableError` naming the URL it tried when the head server is down.
        """
        config = global_config_from_environment()
        if config is None:
            head = head_server_config or head_server_from_environment() or HeadServerConfig()
            return cls(fetch_global_config(head), head)
        return cls(config)

    # -- addresses -----------------------------------------------------------------------------------------

    def server_config(self, server_name: str) -> ServerInstanceConfig:
        return self.global_config.server(server_name)

    def base_url(self, server_name: str) -> str:
        """``http://host:port`` of a server; wildcard bind addresses become loopback.

        In a subprocess agent whose parent named this server in ``GYM_OBS_MODEL_SERVER_NAME``, the
        parent's ``GYM_OBS_MODEL_SERVER_BASE_URL`` wins (as in :func:`get_server_url`): the config's address
        may not be reachable from the child, and the parent's URL carries its rollout and trace segments.
        Both variables are read when the client is made.
        """
        url = self._base_urls.get(server_name)
        if url is None:
            env = self._env_server
            if env is not None and env[0] == server_name:
                url = env[1]
            else:
                server = self.server_config(server_name)
                url = server_base_url(server.host, server.port)
            self._base_urls[server_name] = url
        return url

    def url(self, server_name: str, url_path: str) -> str:
        base = self._base_urls.get(server_name)
        if base is None:
            base = self.base_url(server_name)
        return base + url_path if url_path.startswith("/") else f"{base}/{url_path}"

    # -- requests ------------------------------------------------------------------------------------------

    async def request(
        self, server_name: str, url_path: str, method: str = "GET", **kwargs: Any
    ) -> aiohttp.ClientResponse:
        """Send ``method url_path`` to ``server_name`` through ``request()`` (retries, span, propagation).

        Keyword arguments are ``request()``'s and aiohttp's (``json=``, ``headers=``, ``_route=``...).
        The caller owns the response: read it or release it.
        """
        url = self._prepare(server_name, url_path, kwargs)
        return await request(method, url, _internal=True, _server_name=server_name, **kwargs)

    def model_call_target(self, server_name: str) -> ModelCallTarget:
        """What the config says about ``server_name`` as a model endpoint, by the rule its own model-call
        layer follows: its calls to the dialect routes are model calls, with its provider and allow-list."""
        target = self._model_targets.get(server_name)
        if target is None:
            server = self.server_config(server_name)
            target = self._model_targets[server_name] = model_call_target(
                server.server_type, server.own_config()
            )
        return target

    async def get(self, server_name: str, url_path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        url = self._prepare(server_name, url_path, kwargs)  # not through request(): one frame less per hop
        return await request("GET", url, _internal=True, _server_name=server_name, **kwargs)

    async def post(self, server_name: str, url_path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        url = self._prepare(server_name, url_path, kwargs)
        return await request("POST", url, _internal=True, _server_name=server_name, **kwargs)

    def _prepare(self, server_name: str, url_path: str, kwargs: dict[str, Any]) -> str:
        """The URL of ``url_path`` on ``server_name``; the current rollout id goes into the headers (a
        copy: the caller's are never changed; a header the caller set, in any case, is kept), and what the
        config says about the server as a model endpoint into ``_model_call``."""
        rollout_id = ROLLOUT_ID.get()
        if rollout_id is not None:
            headers: CIMultiDict[str] = CIMultiDict(kwargs.get("headers") or ())
            headers.setdefault(names.ROLLOUT_ID_HEADER, rollout_id)
            kwargs["headers"] = headers
        if "_model_call" not in kwargs:
            kwargs["_model_call"] = self.model_call_target(server_name)
        return self.url(server_name, url_path)

    async def poll_for_status(self, server_name: str, timeout_seconds: float = 5) -> PollStatus:
        """One readiness probe (``GET /readyz`` on the control pool, no retries, no span).

        ``success`` for a 200, ``connection_error`` when nothing listens or the connection drops,
        ``timeout`` when no answer came in time, ``unknown_error`` otherwise (a 503 while starting, too).
        """
        url = self.url(server_name, _READY_PATH)
        try:
            async with asyncio.timeout(timeout_seconds):
                session = get_global_aiohttp_control_client()
                async with session.get(url) as response:
                    await response.read()
                    return "success" if response.status == 200 else "unknown_error"
        except TimeoutError:
            return "timeout"
        except (aiohttp.ClientConnectionError, ConnectionError):
            return "connection_error"
        except Exception:
            return "unknown_error"


# -- URLs for code that is not a gym client --------------------------------------------------------------


def get_server_url(
    server_name: str, *, server_client: ServerClient | None = None, rollout_prefix: bool = True
) -> str:
    """The base URL (no trailing slash) a non-gym client should use for ``server_name``.

    ``GYM_OBS_MODEL_SERVER_BASE_URL`` wins when ``GYM_OBS_MODEL_SERVER_NAME`` names this server (it is
    returned as given: already prefixed by the parent). Otherwise the URL comes from the global config
    (``server_client``, else one loaded once per process from the launcher's environment or the head
    server, which blocks on first use) and, with ``rollout_prefix`` and a current rollout, gets the
    rollout and trace segments. A URL with a trace segment belongs to the current span: build it per
    rollout, don't cache it.
    """
    env_url = model_server_url_from_env(server_name)
    if env_url is not None:
        return env_url
    client = server_client
    if client is None:
        client = default_server_client(ServerClient.load_from_global_config)
    url = client.base_url(server_name)
    rollout_id = current_rollout_id()
    if rollout_prefix and rollout_id is not None:
        url = apply_rollout_prefix(url, rollout_id)
    return url


def subprocess_agent_env(
    model_server_name: str,
    *,
    base_env: Mapping[str, str] | None = None,
    server_client: ServerClient | None = None,
    base_url: str | None = None,
) -> dict[str, str]:
    """The environment for a child process that calls ``model_server_name``: ``base_env`` (default: this
    process's environment) plus ``GYM_OBS_MODEL_SERVER_NAME`` and ``GYM_OBS_MODEL_SERVER_BASE_URL``.

    The URL (``base_url``, else the server's from the config) gets the current rollout's segments and,
    while traces export, the current span's, so the child's model calls join this rollout and trace.
    This process's session secret is not passed on.
    """
    env = dict(os.environ if base_env is None else base_env)
    env.pop(names.ENV_SESSION_SECRET, None)
    url = base_url
    if url is None:
        url = get_server_url(model_server_name, server_client=server_client, rollout_prefix=False)
    url = apply_rollout_prefix(url.rstrip("/"), current_rollout_id())
    env[names.ENV_MODEL_SERVER_NAME] = model_server_name
    env[names.ENV_MODEL_SERVER_BASE_URL] = url
    return env
