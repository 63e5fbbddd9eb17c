"""``GET /_gym/inflight``: the in-flight table of this process, for ``gym-obs top`` and scripts.

Served outside the server's telemetry layers (wrap the finished app, like the harness's ``/_gym/faults``):
reading it is not workload, so it makes no SERVER span and no request metric, and it answers with telemetry
off. Only loopback callers and the addresses in ``control_allow_ips`` may read it: rollout ids and the
deployment's shape are nobody else's business. The reply is bounded whatever the table holds: counts over
every rollout, at most ``limit`` (capped) rollouts per list.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from gym_obs.client import server_base_url
from gym_obs.config import GlobalConfig
from gym_obs.server._failure_reply import boundary_for_server_type
from gym_obs.telemetry import inflight, names

__all__ = ["InflightRoute", "inflight_route_for"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_MAX_QUERY_CHARS: Final = 512


def _networks(entries: Iterable[str]) -> tuple[_Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


class InflightRoute:
    """Answers ``/_gym/inflight`` before the wrapped app sees the request; passes everything else on."""

    #: the paths it answers (HTTP): an outer frame may ask it for these only (``PathContextMiddleware``)
    PATHS: Final = frozenset({names.INFLIGHT_ROUTE})

    def __init__(self, app: ASGIApp, *, server_name: str, allow: Iterable[str] = ()) -> None:
        self.app = app
        self.server_name = server_name
        self.allow = _networks(allow)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != names.INFLIGHT_ROUTE:
            await self.app(scope, receive, send)
            return
        if not self._allowed(scope.get("client")):
            await _send_json(send, 403, {"detail": f"{names.INFLIGHT_ROUTE} answers loopback callers only"})
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _send_json(send, 405, {"detail": f"only GET on {names.INFLIGHT_ROUTE}"})
            return
        try:
            limit, stall_after_s = _query(scope.get("query_string", b""))
        except ValueError as exc:
            await _send_json(send, 422, {"detail": str(exc)})
            return
        body = inflight.snapshot(limit=limit, stall_after_s=stall_after_s)
        body["server"] = self.server_name
        await _send_json(send, 200, body)

    def _allowed(self, client: Any) -> bool:
        if not client:
            return False  # a unix socket or an unknown peer: not loopback as far as we can tell
        try:
            address = ipaddress.ip_address(str(client[0]))
        except ValueError:
            return False
        if address.is_loopback:
            return True
        return any(address in network for network in self.allow)


def _query(raw: bytes) -> tuple[int, float]:
    """``limit`` (capped at ``MAX_LIMIT``) and ``stall_after`` seconds from the query string."""
    params = parse_qs(raw[:_MAX_QUERY_CHARS].decode("latin-1"))
    limit = inflight.DEFAULT_LIMIT
    stall = inflight.DEFAULT_STALL_AFTER_S
    if "limit" in params:
        text = params["limit"][0]
        if not text.isdigit():
            raise ValueError(f"limit must be a non-negative integer, got {text[:32]!r}")
        limit = min(int(text), inflight.MAX_LIMIT)
    if "stall_after" in params:
        text = params["stall_after"][0]
        try:
            stall = float(text)
        except ValueError:
            stall = math.nan
        if not (stall > 0 and math.isfinite(stall)):
            raise ValueError(f"stall_after must be a positive number of seconds, got {text[:32]!r}")
    return limit, stall


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _address(host: str, port: int) -> tuple[str, int | None]:
    parts = urlsplit(server_base_url(host, port))  # the address callers use (0.0.0.0 -> 127.0.0.1)
    return (parts.hostname or host, parts.port)


def inflight_route_for(app: ASGIApp, server_name: str, server_type: str, config: GlobalConfig) -> ASGIApp:
    """Wrap a server's finished app with the route; an agent server also starts tracking its rollouts,
    naming each hop by the gym server it goes to."""
    if boundary_for_server_type(server_type) == "agent":
        inflight.enable(servers={_address(s.host, s.port): name for name, s in config.servers.items()})
    return InflightRoute(app, server_name=server_name, allow=config.server(server_name).control_allow_ips)
