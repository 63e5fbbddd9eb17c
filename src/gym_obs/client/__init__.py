"""The gym_obs client: ``request()``, the process-wide pools, failure replies and the servers by name.

The package is one downward pipeline; each module imports only the modules above it in this list:

``_options`` (RequestOptions: every request knob) < ``model_calls`` (the agent's view of a model call: the
GenAI attributes of its span, GenAI client metrics, the SSE reader) < ``errors`` (response errors) <
``_retry`` (pure retry policy) < ``_fair_connector`` (arrival-ordered connector) < ``pool`` (connector
factory, limits, capacity report) < ``_pool_metrics`` (pool-wait trace callbacks, connections gauge) <
``_sessions`` (per-loop pools and process config: the only module with state) < ``_observe``
(RequestObserver: span, per-attempt metrics and events) < ``_redirects`` (redirects hop by hop) < ``_send``
(the attempt loop) < ``boundary`` (raise_boundary_failure) < ``_request`` (request()) < ``servers``
(ServerClient, server URLs) < ``concurrency`` (TimedSemaphore) < this module (the API; the only module
that re-exports) < ``http_client`` (the module NeMo Gym users import, re-exporting from here).
"""

from __future__ import annotations

from gym_obs.client._options import TransportFailure, TransportFailureHook
from gym_obs.client._pool_metrics import pool_trace_config
from gym_obs.client._request import observe_transport_failures, request
from gym_obs.client._retry import (
    MAX_NUM_TRIES,
    MIN_RETRY_DELAY_S,
    RetriesExhaustedError,
    transport_failure_kind,
)
from gym_obs.client._sessions import (
    close_global_aiohttp_client,
    configure_global_aiohttp_client,
    get_global_aiohttp_client,
    get_global_aiohttp_control_client,
    is_global_aiohttp_client_request_debug_enabled,
    is_global_aiohttp_client_setup,
    set_global_aiohttp_client,
    sync_pool_connections,
)
from gym_obs.client.boundary import raise_boundary_failure, report_from_reply_body
from gym_obs.client.concurrency import TimedSemaphore
from gym_obs.client.errors import (
    MAX_ERROR_BODY_BYTES,
    UNREADABLE_HEAD_STATUS,
    ResponseError,
    ResponseHeadError,
    ResponseJSONError,
    format_exception_with_response_body,
    get_response_json,
    raise_for_status,
)
from gym_obs.client.model_calls import NOT_A_MODEL_CALL, ModelCallTarget, SseEventTooLarge, iter_sse_data
from gym_obs.client.pool import CapacityReport, capacity_report, make_connector
from gym_obs.client.servers import (
    HeadServerUnavailableError,
    PollStatus,
    ServerClient,
    connectable_host,
    fetch_global_config,
    get_server_url,
    global_config_from_environment,
    head_server_from_environment,
    model_server_url_from_env,
    server_base_url,
    subprocess_agent_env,
)
from gym_obs.config import GlobalAIOHTTPAsyncClientConfig

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "MAX_NUM_TRIES",
    "MIN_RETRY_DELAY_S",
    "NOT_A_MODEL_CALL",
    "UNREADABLE_HEAD_STATUS",
    "CapacityReport",
    "GlobalAIOHTTPAsyncClientConfig",
    "HeadServerUnavailableError",
    "ModelCallTarget",
    "PollStatus",
    "ResponseError",
    "ResponseHeadError",
    "ResponseJSONError",
    "RetriesExhaustedError",
    "ServerClient",
    "SseEventTooLarge",
    "TimedSemaphore",
    "TransportFailure",
    "TransportFailureHook",
    "capacity_report",
    "close_global_aiohttp_client",
    "configure_global_aiohttp_client",
    "connectable_host",
    "fetch_global_config",
    "format_exception_with_response_body",
    "get_global_aiohttp_client",
    "get_global_aiohttp_control_client",
    "get_response_json",
    "get_server_url",
    "global_config_from_environment",
    "head_server_from_environment",
    "is_global_aiohttp_client_request_debug_enabled",
    "is_global_aiohttp_client_setup",
    "iter_sse_data",
    "make_connector",
    "model_server_url_from_env",
    "observe_transport_failures",
    "pool_trace_config",
    "raise_boundary_failure",
    "raise_for_status",
    "report_from_reply_body",
    "request",
    "server_base_url",
    "set_global_aiohttp_client",
    "subprocess_agent_env",
    "sync_pool_connections",
    "transport_failure_kind",
]
