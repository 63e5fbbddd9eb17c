"""Redirects followed by ``request()`` itself, one hop at a time, so the propagation rule holds per target.

aiohttp follows a redirect with the same headers: the target of a ``Location`` (any host the first server
names) would receive ``traceparent``, ``tracestate``, ``baggage``, ``X-NG-Session`` and
``X-NG-Rollout-Id``. Here each hop gets them only when it may: the original destination's own origin (a gym
server called as one, or an allow-listed host) or a host on the allow-list. Credentials
(``Authorization``, ``Cookie``, ``Proxy-Authorization``) are dropped once a hop leaves the origin, as aiohttp
does. Method and body follow aiohttp's rules (303, and 301/302 after POST, become a GET without body).
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import should_propagate

__all__ = ["REDIRECT_STATUSES", "follow_redirects"]

REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})

_PROPAGATION_HEADERS: Final = (
    names.TRACEPARENT_HEADER, "tracestate", "baggage", names.SESSION_HEADER, names.ROLLOUT_ID_HEADER
)
_CREDENTIAL_HEADERS: Final = ("Authorization", "Cookie", "Proxy-Authorization")
_REPLAYABLE_BODIES: Final = (bytes, bytearray, memoryview, str, dict, list, tuple)


def _origin(url: URL) -> URL | None:
    try:
        return url.origin()
    except ValueError:
        return None


def _may_propagate(target: URL, first_origin: URL | None) -> bool:
    """The first destination got what the caller decided; any other origin only if allow-listed."""
    origin = _origin(target)
    if origin is not None and origin == first_origin:
        return True
    return should_propagate(str(target), internal=False)


def _next_url(current: URL, response: aiohttp.ClientResponse) -> URL | None:
    location = response.headers.get("Location") or response.headers.get("URI")
    if location is None:
        return None
    try:
        target = URL(location)
    except ValueError as exc:
        raise aiohttp.InvalidUrlRedirectClientError(
            location, "Server attempted redirecting to a location that does not look like a URL"
        ) from exc
    if target.scheme not in ("", "http", "https"):
        raise aiohttp.NonHttpUrlRedirectClientError(location)
    if not target.is_absolute() or not target.host:
        target = current.join(target)
    if _origin(target) is None:
        raise aiohttp.InvalidUrlRedirectClientError(target, "Invalid redirect URL origin")
    return target


async def follow_redirects(
    session: aiohttp.ClientSession,
    method: str,
    url: Any,
    kwargs: dict[str, Any],
    response: aiohttp.ClientResponse,
    max_redirects: int,
) -> aiohttp.ClientResponse:
    """Follow ``response``'s redirect chain (``kwargs`` are the first hop's, never mutated); the last reply
    is returned with the earlier ones in ``history``, as aiohttp would."""
    current = URL(str(url))
    first_origin = _origin(current)
    base_headers: CIMultiDict[str] = CIMultiDict(kwargs.get("headers") or {})
    hop_kwargs = {k: v for k, v in kwargs.items() if k not in ("upload_tracker", "params")}
    history: list[aiohttp.ClientResponse] = []
    left_origin = False
    while response.status in REDIRECT_STATUSES:
        try:
            target = _next_url(current, response)
        except BaseException:
            response.release()
            raise
        if target is None:
            break  # a redirect status without a Location is the answer
        history.append(response)
        response.release()
        if max_redirects and len(history) >= max_redirects:
            raise aiohttp.TooManyRedirects(history[0].request_info, tuple(history))
        status = response.status
        if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
            method = "GET"
            hop_kwargs.pop("data", None)
            base_headers.popall("Content-Length", None)
        elif hop_kwargs.get("data") is not None and not isinstance(hop_kwargs["data"], _REPLAYABLE_BODIES):
            raise aiohttp.ClientPayloadError(
                "Cannot follow redirect with a streamed request body; pass bytes or allow_redirects=False"
            )
        if _origin(target) != _origin(current):
            left_origin = True
        headers = CIMultiDict(base_headers)
        if left_origin:
            for name in _CREDENTIAL_HEADERS:
                headers.popall(name, None)
            hop_kwargs.pop("auth", None)
        if not _may_propagate(target, first_origin):
            for name in _PROPAGATION_HEADERS:
                headers.popall(name, None)
        hop_kwargs["headers"] = headers
        current = target
        response = await session.request(method, target, **hop_kwargs)
    if history:
        # aiohttp fills ``history`` only when it follows redirects itself; there is no public setter.
        with contextlib.suppress(AttributeError):
            response._history = tuple(history)
    return response
