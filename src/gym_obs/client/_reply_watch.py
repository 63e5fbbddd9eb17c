"""Hearing when a response's body is read or the response let go, without holding the response.

aiohttp has no public per-response hook for either, and a model call's CLIENT span must end at the first
(``client/model_calls.py``). A watched response's class is swapped for a subclass of its own class
(one per aiohttp response class, made once) whose ``read``, ``release`` and ``close`` call the original and
then tell the watcher; aiohttp's own ``json()``, ``text()``, ``async with`` and ``wait_for_close`` go through
them too. These are ordinary methods, so ``(await session.post(...)).read()`` keeps the response alive
while it reads. The watcher is an attribute of the response (the response holds it, never the other way
round); unwatching restores the class. Only the responses of model calls are touched.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import aiohttp

__all__ = ["ReplyWatcher", "unwatch", "watch", "watcher_of"]

_WATCHER: Final = "_gym_obs_reply_watcher"


class ReplyWatcher(Protocol):
    def body_read(self, body: bytes, content_type: str) -> None:
        """The whole body was read (``read()`` and everything built on it)."""

    def let_go(self) -> None:
        """The caller released or closed the response."""


_watched_classes: dict[type[aiohttp.ClientResponse], type[aiohttp.ClientResponse]] = {}
_originals: dict[type[aiohttp.ClientResponse], type[aiohttp.ClientResponse]] = {}


def _watched_class(base: type[aiohttp.ClientResponse]) -> type[aiohttp.ClientResponse]:
    """``base`` with ``read``, ``release`` and ``close`` that tell the response's watcher (made once)."""
    cls = _watched_classes.get(base)
    if cls is not None:
        return cls

    async def read(self: aiohttp.ClientResponse) -> bytes:
        body: bytes = await base.read(self)
        watcher = self.__dict__.get(_WATCHER)
        if watcher is not None:
            watcher.body_read(body, self.content_type)
        return body

    def release(self: aiohttp.ClientResponse) -> Any:
        result = base.release(self)
        _let_go(self)
        return result

    def close(self: aiohttp.ClientResponse) -> None:
        base.close(self)
        _let_go(self)

    namespace = {"read": read, "release": release, "close": close, "__module__": base.__module__}
    cls = type(base.__name__, (base,), namespace)
    cls.__qualname__ = base.__qualname__  # reprs and error messages name aiohttp's class
    _watched_classes[base] = cls
    _originals[cls] = base
    return cls


def _let_go(response: aiohttp.ClientResponse) -> None:
    watcher = response.__dict__.get(_WATCHER)
    if watcher is not None:
        watcher.let_go()


def watch(response: aiohttp.ClientResponse, watcher: ReplyWatcher) -> bool:
    """Tell ``watcher`` when ``response`` is read or let go; False if this response cannot be watched."""
    try:
        base = type(response)
        cls = _watched_class(base)
        response.__dict__[_WATCHER] = watcher
        response.__class__ = cls
    except (AttributeError, TypeError):  # pragma: no cover - a future aiohttp with __slots__ or a final class
        response.__dict__.pop(_WATCHER, None)
        return False
    return True


def unwatch(response: aiohttp.ClientResponse) -> None:
    """Stop telling the watcher; the response is aiohttp's own again."""
    response.__dict__.pop(_WATCHER, None)
    original = _originals.get(type(response))
    if original is not None:
        response.__class__ = original


def watcher_of(response: aiohttp.ClientResponse) -> ReplyWatcher | None:
    """The watcher of a watched response."""
    own = getattr(response, "__dict__", None)
    return own.get(_WATCHER) if own is not None else None
