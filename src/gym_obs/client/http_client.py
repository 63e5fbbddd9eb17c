"""The one way a gym_obs process talks HTTP to another server: ``request()`` and the process-wide sessions.

``request()`` owns retries (bounded by attempts and a time budget, exponential backoff with full jitter,
the first retry logged at once), trace propagation (``traceparent`` only to gym servers and the allow-list)
and the connection pools (``data`` for payload traffic, ``control`` for health checks and the head server,
so a saturated data pool never starves them). With telemetry on, a logical request is one CLIENT span,
retries included; with it off, the request path costs one flag check over bare aiohttp.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import aiohttp
import orjson
from multidict import CIMultiDict

from gym_obs.client import _sessions
from gym_obs.client._attempts import TransportFailureHook, send_with_retries
from gym_obs.client._retry import (
    MAX_NUM_TRIES,
    RetriesExhaustedError,
    TransportFailure,
    transport_failure_kind,
)
from gym_obs.client._telemetry import _KNOWN_METHODS, traced_request
from gym_obs.client.boundary import raise_boundary_failure
from gym_obs.client.errors import format_exception_with_response_body, get_response_json, raise_for_status
from gym_obs.client.pool import CapacityReport, GlobalAIOHTTPAsyncClientConfig
from gym_obs.failures.kinds import Boundary, Stage
from gym_obs.telemetry._state import STATE

__all__ = [
    "MAX_NUM_TRIES",
    "GlobalAIOHTTPAsyncClientConfig",
    "RetriesExhaustedError",
    "TransportFailure",
    "TransportFailureHook",
    "close_global_aiohttp_client",
    "configure_global_aiohttp_client",
    "format_exception_with_response_body",
    "get_global_aiohttp_client",
    "get_global_aiohttp_control_client",
    "get_response_json",
    "is_global_aiohttp_client_request_debug_enabled",
    "is_global_aiohttp_client_setup",
    "observe_transport_failures",
    "raise_boundary_failure",
    "raise_for_status",
    "request",
    "set_global_aiohttp_client",
    "transport_failure_kind",
]

_JSON_CONTENT_TYPE: Final = "application/json"
# An HTTP method is a token (RFC 9110 section 9.1); aiohttp would put anything, even "", on the wire.
_METHOD_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


# --- sessions --------------------------------------------------------------------------------------------


def _validated(cfg: object, workers: object) -> GlobalAIOHTTPAsyncClientConfig:
    """``cfg`` checked before anything is stored: a bad config must fail here, at the call that set it,
    never later in every request. A mapping is validated into the model; a model is re-validated (one
    built with ``model_construct`` skipped its checks); the retry budget must be finite."""
    if isinstance(cfg, GlobalAIOHTTPAsyncClientConfig):
        cfg = GlobalAIOHTTPAsyncClientConfig.model_validate(cfg.model_dump())
    elif isinstance(cfg, Mapping):
        cfg = GlobalAIOHTTPAsyncClientConfig.model_validate(dict(cfg))
    else:
        raise TypeError(
            "cfg must be a GlobalAIOHTTPAsyncClientConfig (or a mapping of its fields), "
            f"not {type(cfg).__name__}"
        )
    assert isinstance(cfg, GlobalAIOHTTPAsyncClientConfig)
    if not math.isfinite(cfg.global_aiohttp_max_retry_seconds):
        raise ValueError("global_aiohttp_max_retry_seconds must be finite: every retry path must end")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int or None, not {workers!r}")
    return cfg


def configure_global_aiohttp_client(
    cfg: GlobalAIOHTTPAsyncClientConfig, *, workers: int | None = None
) -> CapacityReport:
    """Set the pool config for sessions created from now on (no event loop needed); logs the capacity
    report and returns it. ``workers`` defaults to ``WEB_CONCURRENCY``. Raises ``TypeError`` or
    ``ValueError`` (pydantic's ``ValidationError``) for a bad config, which is then not used."""
    return _sessions.configure(_validated(cfg, workers), workers)


def set_global_aiohttp_client(
    cfg: GlobalAIOHTTPAsyncClientConfig, *, workers: int | None = None
) -> aiohttp.ClientSession:
    """Configure the pools and create this loop's data session now (call from the running loop).

    Raises RuntimeError when this loop already has sessions: ``await close_global_aiohttp_client()``
    first, so that two configurations never silently coexist; ``TypeError``/``ValueError`` for a bad
    config (nothing is changed then).
    """
    cfg = _validated(cfg, workers)
    asyncio.get_running_loop()
    if _sessions.is_setup():
        raise RuntimeError(
            "the global aiohttp client is already set up on this event loop; "
            "await close_global_aiohttp_client() before setting a new one"
        )
    _sessions.configure(cfg, workers)
    return _sessions.session_for(control=False)


def get_global_aiohttp_client() -> aiohttp.ClientSession:
    """The running loop's data-pool session (created on first use with the configured or default config).

    It is the traced session while telemetry is on and the plain one while it is off; both share one
    connector. Prefer ``request()``, which adds retries, spans and propagation.
    """
    return _sessions.session_for(control=False)


def get_global_aiohttp_control_client() -> aiohttp.ClientSession:
    """The running loop's control-pool session (health checks, head server; finite default timeout)."""
    return _sessions.session_for(control=True)


def is_global_aiohttp_client_setup() -> bool:
    """Whether the running loop (outside a loop: any live loop) has an open global data session."""
    return _sessions.is_setup()


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """Whether ``global_aiohttp_client_request_debug`` is set: every HTTP exchange of the global sessions
    is then logged (``client_request_debug``: method, redacted URL, scrubbed headers, status or error)."""
    return _sessions.current_config().global_aiohttp_client_request_debug


async def close_global_aiohttp_client() -> None:
    """Close the running loop's sessions, on this loop (other live loops keep theirs: each closes its
    own). Sessions left behind by loops that have ended are forgotten.

    The config is kept: the next ``get_global_aiohttp_client()`` creates fresh sessions with it.
    """
    _sessions.forget_dead_loops()
    await _sessions.close_loop_sessions()


# --- request ---------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)  # pydantic models, without importing pydantic here
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _encode_json(kwargs: dict[str, Any]) -> None:
    """Replace ``json=`` with orjson-encoded ``data=`` and a JSON content type (headers copied, never
    mutated in place)."""
    payload = kwargs.pop("json")
    if payload is None:
        return
    if kwargs.get("data") is not None:
        raise ValueError("data and json parameters can not be used at the same time")
    try:
        kwargs["data"] = orjson.dumps(payload, default=_json_default)
    except TypeError as exc:  # orjson.JSONEncodeError: a non-str dict key, an unknown type, a cycle
        raise TypeError(f"request(json=...) cannot be encoded as JSON: {exc}") from exc
    headers = kwargs.get("headers")
    if not headers:
        kwargs["headers"] = {"Content-Type": _JSON_CONTENT_TYPE}
        return
    copied: CIMultiDict[str] = CIMultiDict(headers)
    if "Content-Type" not in copied:
        copied["Content-Type"] = _JSON_CONTENT_TYPE
    kwargs["headers"] = copied


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
    ``json=`` is encoded with orjson (a value it cannot encode, e.g. a non-str dict key, is a
    ``TypeError`` naming ``json=``, raised before anything is sent); ``_max_num_tries`` must be >= 1 and
    ``_max_connection_retries`` >= 0 (``ValueError``). The caller owns the response: read it, or release it.
    """
    if method not in _KNOWN_METHODS:
        _check_method(method)
    if _max_num_tries is not None or _max_connection_retries is not None:
        _check_limits(_max_num_tries, _max_connection_retries)
    if "json" in aiohttp_kwargs:
        _encode_json(aiohttp_kwargs)
    pool = _sessions.pool_for(_control)
    retry_args = (
        _internal, _max_connection_retries, _max_num_tries, _resend_after_disconnect, _retry_other_errors
    )
    if STATE.enabled:
        return await traced_request(
            pool, method, url, aiohttp_kwargs, retry_args, _read_body, _on_transport_failure,
            _server_name, _route,
        )
    return await send_with_retries(
        pool, method, url, aiohttp_kwargs, retry_args, _read_body, _on_transport_failure, None
    )


# --- recovered transport failures as failure events --------------------------------------------------------


def observe_transport_failures(
    boundary: Boundary, stage: Stage | None = None
) -> Callable[[TransportFailure], None]:
    """A ``_on_transport_failure`` hook that records each retried attempt as a failure event.

    A retry may still recover the request; the event is observed (counted once, added to the current
    request's failure log) so the server's reply reports it, e.g. a model call that needed a second
    connection. The final failure is not observed here: it is raised to the caller, whose boundary
    decides what it becomes.
    """
    from gym_obs.failures.event import NgFailureEvent
    from gym_obs.failures.transport import observe_failure

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

