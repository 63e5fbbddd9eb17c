"""HTTP error replies as exceptions that are safe to log, pickle and send to another process.

aiohttp's ``ClientResponseError`` drops the body (the part that says what went wrong), keeps request headers
(``Authorization`` included) and cannot be pickled (multidict proxies, live responses in ``history``).
:class:`ResponseError` is a ``ClientResponseError`` subclass that keeps at most ``MAX_ERROR_BODY_BYTES`` of
the body on ``response_content``, a redacted URL, request and response headers without the sensitive ones,
and pickles to exactly that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeGuard

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from gym_obs.client.model_calls import json_reply_read
from gym_obs.failures._base import MAX_DEPTH
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.redaction import SENSITIVE_HEADERS, redact_url, scrub_text

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "UNREADABLE_HEAD_STATUS",
    "ResponseError",
    "ResponseHeadError",
    "ResponseJSONError",
    "format_exception_with_response_body",
    "get_response_json",
    "is_response_head_error",
    "raise_for_status",
    "read_error_body",
    "response_error",
    "response_head_error",
]

MAX_ERROR_BODY_BYTES: Final = 64 * 1024
"""At most this much of an error body is read and kept: enough for a traceback, bounded for a flood."""

_FORMAT_BODY_CHARS: Final = 2000
_MESSAGE_CHARS: Final = 2000
_JSON_EXCERPT_CHARS: Final = 500
_HEAD_MESSAGE_CHARS: Final = 300


class ResponseError(aiohttp.ClientResponseError):
    """``aiohttp.ClientResponseError`` with the bounded body (``response_content``) and nothing secret.

    Request info keeps the method, the redacted URL and the non-sensitive headers; ``history`` is dropped
    when pickled (it holds live responses).
    """

    def __init__(
        self,
        request_info: aiohttp.RequestInfo,
        history: tuple[aiohttp.ClientResponse, ...] = (),
        *,
        status: int | None = None,
        message: str = "",
        headers: Mapping[str, str] | None = None,
        response_content: bytes | None = None,
    ) -> None:
        super().__init__(
            _safe_request_info(request_info.method, request_info.url, request_info.headers.items()),
            history,
            status=status,
            message=message,
            headers=None if headers is None else _safe_headers(headers.items()),
        )
        self.response_content = response_content

    def __reduce__(self) -> tuple[Any, ...]:
        info = self.request_info
        headers = None if self.headers is None else list(self.headers.items())
        return (
            _restore_response_error,
            (type(self), info.method, str(info.url), list(info.headers.items()), self.status, self.message,
             headers, self.response_content),
        )


UNREADABLE_HEAD_STATUS: Final = 502
"""The status of :class:`ResponseHeadError`: the upstream's reply could not be read, as a proxy would say."""


class ResponseHeadError(ResponseError):
    """The upstream's reply head could not be parsed (a header over the read limit, a malformed line), so
    no real status exists. aiohttp raises an unpicklable ``ClientResponseError`` with a made-up 400 that
    looks like the upstream's answer; this says what happened instead, with status 502, and pickles."""


def response_head_error(error: aiohttp.ClientResponseError, method: str, url: object) -> ResponseHeadError:
    """``error`` (aiohttp's reply-head parse failure) as a picklable, scrubbed :class:`ResponseHeadError`."""
    what = bounded_excerpt(scrub_text(str(error.message)), _HEAD_MESSAGE_CHARS)
    return ResponseHeadError(
        _safe_request_info(method, URL(redact_url(str(url)), encoded=True), ()),
        status=UNREADABLE_HEAD_STATUS,
        message=f"the upstream's reply head could not be read: {what}",
    )


def is_response_head_error(error: BaseException) -> TypeGuard[aiohttp.ClientResponseError]:
    """Whether ``error`` is aiohttp's failure to parse a reply head (not a reply the upstream chose)."""
    from aiohttp.http_exceptions import HttpProcessingError

    return (
        isinstance(error, aiohttp.ClientResponseError)
        and not isinstance(error, ResponseError)
        and isinstance(error.__cause__, HttpProcessingError)
    )


class ResponseJSONError(ValueError):
    """A reply body that should have been JSON was not; carries the status and a bounded excerpt."""

    def __init__(self, status: int, excerpt: str) -> None:
        super().__init__(f"response ({status}) is not valid JSON: {excerpt}")
        self.status = status
        self.excerpt = excerpt


async def raise_for_status(response: aiohttp.ClientResponse, content: bytes | str | None = None) -> None:
    """Raise :class:`ResponseError` for a reply with status >= 400 (body bounded and kept); else return.

    ``content`` is the body if the caller already read it; otherwise at most ``MAX_ERROR_BODY_BYTES`` are
    read from the reply. Like aiohttp, the reply is released unless it is used as a context manager.
    """
    if response.status < 400:
        return
    body = await read_error_body(response, content)
    raise response_error(response, body)


async def read_error_body(
    response: aiohttp.ClientResponse, content: bytes | str | None = None
) -> bytes | None:
    """At most ``MAX_ERROR_BODY_BYTES`` of the body; a read error keeps what arrived. Never raises
    (except cancellation). Releases the reply unless it is used as a context manager.

    aiohttp has no public way to ask whether a body was already read (``read()`` would read it all,
    unbounded) or whether the reply is inside ``async with``: its private ``_body`` and ``_in_context``
    are read here, and only here, defensively."""
    try:
        if content is not None:
            data = content.encode("utf-8", "replace") if isinstance(content, str) else bytes(content)
            return data[:MAX_ERROR_BODY_BYTES]
        already = getattr(response, "_body", None)
        if isinstance(already, bytes):
            return already[:MAX_ERROR_BODY_BYTES]
        return await _read_some(response)
    except Exception:
        return None
    finally:
        if not getattr(response, "_in_context", False):
            with contextlib.suppress(Exception):
                response.release()


async def _read_some(response: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    remaining = MAX_ERROR_BODY_BYTES
    try:
        while remaining > 0:
            chunk = await response.content.read(remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except Exception:
        pass  # a reset or timeout mid-body: keep what arrived
    return b"".join(chunks)


def response_error(response: aiohttp.ClientResponse, body: bytes | None) -> ResponseError:
    """The :class:`ResponseError` for ``response`` with ``body``; never raises."""
    try:
        info = response.request_info
        return ResponseError(
            info,
            tuple(response.history),
            status=response.status,
            message=response.reason or "",
            headers=response.headers,
            response_content=body,
        )
    except Exception:
        status = getattr(response, "status", 0)
        fallback = _safe_request_info("GET", URL(), ())
        return ResponseError(
            fallback,
            status=status if isinstance(status, int) else 0,
            message="",
            response_content=body,
        )


def format_exception_with_response_body(error: BaseException) -> str:
    """One readable, secret-free text: the error, its explicit causes and a bounded excerpt of the body.

    The body is the error's own ``response_content`` or, for a rebuilt remote failure, that of its
    ``http_error``.
    """
    lines = [_describe(error)]
    seen = {id(error)}
    cause = error.__cause__
    while cause is not None and id(cause) not in seen and len(seen) <= MAX_DEPTH:
        seen.add(id(cause))
        lines.append(f"  caused by {_describe(cause)}")
        cause = cause.__cause__
    content = getattr(error, "response_content", None)
    if content is None:
        content = getattr(getattr(error, "http_error", None), "response_content", None)
    if isinstance(content, bytes | str) and content:
        lines.append("Response body: " + bounded_excerpt(content, _FORMAT_BODY_CHARS))
    return "\n".join(lines)


async def get_response_json(response: aiohttp.ClientResponse) -> Any:
    """The reply body parsed as JSON (orjson); :class:`ResponseJSONError` with an excerpt otherwise.

    A model call's reply read here also gives its CLIENT span, GenAI metrics and the current rollout's
    tally their usage (:mod:`gym_obs.client.model_calls`)."""
    body = await response.read()
    json_reply_read(response, body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ResponseJSONError(response.status, bounded_excerpt(body, _JSON_EXCERPT_CHARS)) from None


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:
        text = "<unprintable exception>"
    name = getattr(error, "exception_type", None) or type(error).__name__
    if getattr(error, "exception_type", None) is not None:  # a rebuilt foreign cause prints its own type
        return bounded_excerpt(text, _MESSAGE_CHARS)
    return f"{name}: {bounded_excerpt(scrub_text(text), _MESSAGE_CHARS)}"


def _safe_headers(items: Iterable[tuple[str, str]]) -> CIMultiDictProxy[str]:
    kept = CIMultiDict(
        (str(name), scrub_text(str(value)))
        for name, value in items
        if str(name).lower() not in SENSITIVE_HEADERS
    )
    return CIMultiDictProxy(kept)


def _safe_request_info(
    method: str, url: URL | str, headers: Iterable[tuple[str, str]]
) -> aiohttp.RequestInfo:
    safe_url = URL(redact_url(str(url)), encoded=True)
    return aiohttp.RequestInfo(safe_url, str(method), _safe_headers(headers), safe_url)


def _restore_response_error(
    cls: type[ResponseError],
    method: str,
    url: str,
    request_headers: list[tuple[str, str]],
    status: int,
    message: str,
    headers: list[tuple[str, str]] | None,
    response_content: bytes | None,
) -> ResponseError:
    return cls(
        _safe_request_info(method, url, request_headers),
        status=status,
        message=message,
        headers=None if headers is None else CIMultiDict(headers),
        response_content=response_content,
    )
