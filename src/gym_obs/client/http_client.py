"""The module NeMo Gym users import: ``request()`` and the process-wide sessions, by their NeMo Gym names.

Kept for compatibility: code ported from NeMo Gym imports ``gym_obs.client.http_client``; every name here
is re-exported from :mod:`gym_obs.client` (which new code should import) and defined further down the
client pipeline (``_request``, ``_sessions``, ``boundary``, ``errors``, ``_retry``, ``model_calls``).

``request()`` owns retries (bounded by attempts and a time budget, exponential backoff with full jitter,
the first retry logged at once), trace propagation (``traceparent`` only to gym servers and the allow-list)
and the connection pools (``data`` for payload traffic, ``control`` for health checks and the head server,
so a saturated data pool never starves them). With telemetry on, a logical request is one CLIENT span,
retries included; with it off, the request path costs one flag check over bare aiohttp.
"""

from __future__ import annotations

from gym_obs.client import (
    MAX_NUM_TRIES,
    CapacityReport,
    GlobalAIOHTTPAsyncClientConfig,
    RetriesExhaustedError,
    TransportFailure,
    TransportFailureHook,
    close_global_aiohttp_client,
    configure_global_aiohttp_client,
    format_exception_with_response_body,
    get_global_aiohttp_client,
    get_global_aiohttp_control_client,
    get_response_json,
    is_global_aiohttp_client_request_debug_enabled,
    is_global_aiohttp_client_setup,
    iter_sse_data,
    observe_transport_failures,
    raise_boundary_failure,
    raise_for_status,
    request,
    set_global_aiohttp_client,
    transport_failure_kind,
)

__all__ = [
    "MAX_NUM_TRIES",
    "CapacityReport",
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
    "iter_sse_data",
    "observe_transport_failures",
    "raise_boundary_failure",
    "raise_for_status",
    "request",
    "set_global_aiohttp_client",
    "transport_failure_kind",
]
