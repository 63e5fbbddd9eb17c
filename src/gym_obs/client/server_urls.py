"""Server URLs for code that is not a gym client: third-party SDKs and subprocess agents.

A subprocess agent (a harness in a sandbox, a CLI tool) cannot read the global config or carry a context
variable across ``exec``; its parent gives it two environment variables instead:
``GYM_OBS_MODEL_SERVER_NAME`` and ``GYM_OBS_MODEL_SERVER_BASE_URL``, the latter already carrying the
parent's ``/ng-rollout/<id>`` (and ``/ng-trace/<traceparent>``) segments. :func:`get_server_url` prefers
that URL over any config look-up, so the child's calls land in the parent's rollout and trace without
the child knowing about either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import apply_rollout_prefix, current_rollout_id

if TYPE_CHECKING:
    from gym_obs.client.server_client import ServerClient

__all__ = ["get_server_url", "model_server_url_from_env", "subprocess_agent_env"]

_LOCK = threading.Lock()
_loaded: ServerClient | None = None


def model_server_url_from_env(server_name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``GYM_OBS_MODEL_SERVER_BASE_URL`` (no trailing slash) when ``GYM_OBS_MODEL_SERVER_NAME`` names
    ``server_name``, else ``None``: the one rule both :func:`get_server_url` and ``ServerClient`` follow."""
    if environ is None:
        environ = os.environ
    if environ.get(names.ENV_MODEL_SERVER_NAME) != server_name:
        return None
    url = environ.get(names.ENV_MODEL_SERVER_BASE_URL, "").strip()
    return url.rstrip("/") or None


def _default_server_client() -> ServerClient:
    """Loaded once per process (launcher env, else the head server; blocking)."""
    global _loaded
    from gym_obs.client.server_client import ServerClient

    with _LOCK:
        if _loaded is None:
            _loaded = ServerClient.load_from_global_config()
        return _loaded


def get_server_url(
    server_name: str, *, server_client: ServerClient | None = None, rollout_prefix: bool = True
) -> str:
    """The base URL (no trailing slash) a non-gym client should use for ``server_name``.

    ``GYM_OBS_MODEL_SERVER_BASE_URL`` wins when ``GYM_OBS_MODEL_SERVER_NAME`` names this server (it is
    returned as given: already prefixed by the parent). Otherwise the URL comes from the global config
    (``server_client``, else one loaded from the launcher's environment or the head server, which blocks
    on first use) and, with ``rollout_prefix`` and a current rollout, gets the rollout and trace segments.
    A URL with a trace segment belongs to the current span: build it per rollout, don't cache it.
    """
    env_url = model_server_url_from_env(server_name)
    if env_url is not None:
        return env_url
    client = server_client if server_client is not None else _default_server_client()
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
