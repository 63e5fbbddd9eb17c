"""``request()``: the one way a gym_obs process talks HTTP to another server.

It validates its arguments, freezes them into one :class:`RequestOptions`, picks the pool and then takes
one of two paths: telemetry off, the attempt loop alone (one flag check over bare aiohttp; inside a rollout
a model call also feeds the rollout's tally); telemetry on, a :class:`RequestObserver` around the same loop
(one CLIENT span per logical request, retries included).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Final

import aiohttp
import orjson
from multidict import CIMultiDict
from opentelemetry.trace import INVALID_SPAN

from gym_obs.client._observe import RequestObserver
from gym_obs.client._options import (
    DEFAULT_MAX_REDIRECTS,
    KNOWN_METHODS,
    RequestOptions,
    TransportFailure,
    TransportFailureHook,
)
from gym_obs.client._send import send
from gym_obs.client._sessions import Pool, pool_for
from gym_obs.client.model_calls import ModelCallTarget, observe_model_call
from gym_obs.failures.event import NgFailureEvent
from gym_obs.failures.kinds import Boundary, Stage
from gym_obs.failures.transport import observe_failure
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.tally import current_rollout

__all__ = ["observe_transport_failures", "request"]

_JSON_CONTENT_TYPE: Final = "application/json"
# An HTTP method is a token (RFC 9110 section 9.1); aiohttp would put anything, even "", on the wire.
_METHOD_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SHARED_OPTIONS: Final = 1024


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)  # pydantic models, without importing pydantic here
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _encode_json(kwargs: dict[str, Any]) -> Any:
    """Replace ``json=`` with orjson-encoded ``data=`` and a JSON content type (headers copied, never
    mutated in place); returns the payload (a model call's request model is read from it)."""
    payload = kwargs.pop("json")
    if payload is None:
        return None
    if kwargs.get("data") is not None:
        raise ValueError("data and json parameters can not be used at the same time")
    try:
        kwargs["data"] = orjson.dumps(payload, default=_json_default)
    except TypeError as exc:  # orjson.JSONEncodeError: a non-str dict key, an unknown type, a cycle
        raise TypeError(f"request(json=...) cannot be encoded as JSON: {exc}") from exc
    headers = kwargs.get("headers")
    if not headers:
        kwargs["headers"] = {"Content-Type": _JSON_CONTENT_TYPE}
        return payload
    copied: CIMultiDict[str] = CIMultiDict(headers)
    if "Content-Type" not in copied:
        copied["Content-Type"] = _JSON_CONTENT_TYPE
    kwargs["headers"] = copied
    return payload


def _check_method(method: object) -> None:
    if not isinstance(method, str) or not _METHOD_TOKEN.fullmatch(method):
        raise ValueError(f"method must be an HTTP method token such as 'GET', not {method!r}")


def _check_limits(max_num_tries: object, max_connection_retries: object) -> None:
    for name, value, least in (
        ("_max_num_tries", max_num_tries, 1),
        ("_max_connection_retries", max_connection_retries, 0),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int or None, not {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name} must be >= {least} (or None), not {value}")


def _options(
    internal: bool,
    server_name: str | None,
    control: bool,
    max_connection_retries: int | None,
    max_num_tries: int | None,
    resend_after_disconnect: bool,
    retry_other_errors: bool,
    read_body: bool,
    route: str | None,
    allow_redirects: bool,
    max_redirects: int,
    on_transport_failure: TransportFailureHook | None,
) -> RequestOptions:
    return RequestOptions(
        internal=internal,
        server_name=server_name,
        control=control,
        max_connection_retries=max_connection_retries,
        max_num_tries=max_num_tries,
        resend_after_disconnect=resend_after_disconnect,
        retry_other_errors=retry_other_errors,
        read_body=read_body,
        route=route,
        on_transport_failure=on_transport_failure,
        allow_redirects=allow_redirects,
        max_redirects=max_redirects,
    )


_shared_options: Final = functools.lru_cache(maxsize=_SHARED_OPTIONS)(_options)
"""The one (immutable, so shareable) RequestOptions of a knob combination without a hook. Building a
frozen dataclass costs twice the rest of the telemetry-off path (measured: ~2 µs against ~1 µs), and
callers repeat the same few combinations (external calls, one per gym server and route)."""


async def request(
    method: str,
    url: str,
    _internal: bool = False,
    _max_connection_retries: int | None = None,
    _server_name: str | None = None,
    _max_num_tries: int | None = None,
    _control: bool = False,
    _resend_after_disconnect: bool = True,
    _on_transport_failure: TransportFailureHook | None = None,
    _read_body: bool = False,
    _retry_other_errors: bool = True,
    _route: str | None = None,
    _model_call: ModelCallTarget | None = None,
    **aiohttp_kwargs: Any,
) -> aiohttp.ClientResponse:
    """Send one logical HTTP request through the global pools, retrying transport failures.

    Retried: a connection never made (refused, connect timeout, DNS) and a connection dropped
    (``server_disconnected``, ``client_os_error``) until ``_max_connection_retries`` re-sends (default:
    no count limit) or ``global_aiohttp_max_retry_seconds`` of elapsed time; other errors (read
    timeouts, broken payloads) up to ``MAX_NUM_TRIES`` attempts on external calls (``_internal=False``),
    until the budget on internal ones. ``_max_num_tries`` caps the attempts of every path. An HTTP reply,
    whatever its status, is returned, never retried. When a limit ends the retries after at least one
    re-send, ``RetriesExhaustedError`` (an ``aiohttp.ClientError``) says how many attempts over how long,
    chained to the last error; otherwise (a single attempt, or an error no retry can fix, or a request
    that must not be replayed) the attempt's own error is raised as is.

    ``_resend_after_disconnect=False``: never re-send a request the server may have received in full
    (upload completed before the failure); a connection never made is still retried.
    ``_retry_other_errors=False``: re-send only after refused or dropped connections.
    ``_read_body=True``: read a success (< 400) body inside the retry loop, so a connection reset
    mid-body is retried too. ``_control=True``: use the control pool. ``_server_name``: the destination's
    gym server name (the bounded ``gym.server.name`` label; ``external`` otherwise). ``_route``: a route
    template for the span name (``POST /v1/responses``), never a raw path with ids.
    ``_on_transport_failure``: called with a ``TransportFailure`` for every failed attempt.
    ``_model_call``: what is known about a model endpoint (provider, model allow-list; ``NOT_A_MODEL_CALL``
    opts out); a request to a dialect route is a model call anyway (``gym_obs.client.model_calls``).
    ``json=`` is encoded with orjson (a value it cannot encode, e.g. a non-str dict key, is a
    ``TypeError`` naming ``json=``, raised before anything is sent); ``_max_num_tries`` must be >= 1 and
    ``_max_connection_retries`` >= 0 (``ValueError``). The caller owns the response: read it, or release it.
    """
    if method not in KNOWN_METHODS:
        _check_method(method)
    if _max_num_tries is not None or _max_connection_retries is not None:
        _check_limits(_max_num_tries, _max_connection_retries)
    payload = _encode_json(aiohttp_kwargs) if "json" in aiohttp_kwargs else None
    allow_redirects = aiohttp_kwargs.pop("allow_redirects", True)
    max_redirects = aiohttp_kwargs.pop("max_redirects", DEFAULT_MAX_REDIRECTS)
    knobs = (
        _internal, _server_name, _control, _max_connection_retries, _max_num_tries,
        _resend_after_disconnect, _retry_other_errors, _read_body, _route, allow_redirects, max_redirects,
    )
    if _on_transport_failure is None:
        try:
            options = _shared_options(*knobs, None)
        except TypeError:  # an unhashable value (a caller's odd route or limit): no sharing
            options = _options(*knobs, None)
    else:  # hooks are often made per request: sharing their options would only churn the cache
        options = _options(*knobs, _on_transport_failure)
    pool = pool_for(_control)
    if not STATE.enabled:
        if current_rollout() is None:
            return await send(pool, method, url, aiohttp_kwargs, options, None)
        return await _send_tallied(pool, method, url, aiohttp_kwargs, options, _model_call, payload)
    observer = RequestObserver(method, url, options, _model_call, payload)
    try:
        observer.prepare(aiohttp_kwargs, options)
        response = await send(pool, method, url, aiohttp_kwargs, options, observer)
    except BaseException as exc:
        observer.end_failed(exc)
        raise
    observer.end_reply(response)
    return response


async def _send_tallied(
    pool: Pool,
    method: str,
    url: Any,
    kwargs: dict[str, Any],
    options: RequestOptions,
    target: ModelCallTarget | None,
    payload: object,
) -> aiohttp.ClientResponse:
    """Telemetry off, inside a rollout: a model call still feeds the rollout's tally (its tokens, time to
    first token and time in flight are what the rollout reports); nothing is recorded or exported."""
    text = url if isinstance(url, str) else str(url)
    call = observe_model_call(text, target, payload, "", None, options.server_name or "")
    if call is None:
        return await send(pool, method, url, kwargs, options, None)
    try:
        response = await send(pool, method, url, kwargs, options, None)
    except BaseException as exc:
        call.request_failed(exc, INVALID_SPAN)
        raise
    call.replied(response, INVALID_SPAN)
    return response


def observe_transport_failures(
    boundary: Boundary, stage: Stage | None = None
) -> Callable[[TransportFailure], None]:
    """A ``_on_transport_failure`` hook that records each retried attempt as a failure event.

    A retry may still recover the request; the event is observed (counted once, added to the current
    request's failure log) so the server's reply reports it, e.g. a model call that needed a second
    connection. The final failure is not observed here: it is raised to the caller, whose boundary
    decides what it becomes.
    """

    def hook(failure: TransportFailure) -> None:
        if not failure.will_retry:
            return
        event = NgFailureEvent(
            failure.failure_kind,
            f"attempt {failure.attempt} to {failure.destination} failed ({failure.reason}); retrying",
            boundary=boundary,
            stage=stage,
        )
        event.__cause__ = failure.error
        observe_failure(event)

    return hook
