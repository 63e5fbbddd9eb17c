"""The registry of every telemetry name gym_obs emits.

Nothing else in the package spells a span, metric or attribute name as a string literal: dashboards, tests
and instrumentation all import from here, so a rename is one edit and a typo is an ImportError.
Names follow the stable OpenTelemetry HTTP semantic conventions; gym-specific names live under ``gym.``.
"""

from __future__ import annotations

from typing import Final

# --- instrumentation scope -------------------------------------------------------------------------------
INSTRUMENTATION_SCOPE: Final = "gym_obs"

# --- resource attributes ---------------------------------------------------------------------------------
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
SERVICE_NAME_PREFIX: Final = "gym/"
ATTR_SERVER_NAME: Final = "gym.server.name"
ATTR_SERVER_TYPE: Final = "gym.server.type"
ATTR_RUN_ID: Final = "gym.run.id"

# --- semantic-convention attributes ----------------------------------------------------------------------
ATTR_HTTP_REQUEST_METHOD: Final = "http.request.method"
ATTR_HTTP_REQUEST_METHOD_ORIGINAL: Final = "http.request.method_original"  # spans only, when not canonical
ATTR_HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
ATTR_HTTP_REQUEST_RESEND_COUNT: Final = "http.request.resend_count"
ATTR_HTTP_ROUTE: Final = "http.route"
ATTR_URL_FULL: Final = "url.full"
ATTR_URL_SCHEME: Final = "url.scheme"
ATTR_SERVER_ADDRESS: Final = "server.address"
ATTR_SERVER_PORT: Final = "server.port"
ATTR_ERROR_TYPE: Final = "error.type"
ATTR_HTTP_CONNECTION_STATE: Final = "http.connection.state"
ATTR_EXCEPTION_TYPE: Final = "exception.type"
ATTR_EXCEPTION_MESSAGE: Final = "exception.message"
ATTR_EXCEPTION_STACKTRACE: Final = "exception.stacktrace"

# --- gym attributes --------------------------------------------------------------------------------------
ATTR_ROLLOUT_ID: Final = "gym.rollout.id"
ATTR_SESSION_ID: Final = "gym.session.id"
ATTR_RETRY_REASON: Final = "gym.retry.reason"
ATTR_POOL: Final = "gym.pool"
ATTR_POOL_OUTCOME: Final = "gym.pool.outcome"
ATTR_ROLLOUT_OUTCOME: Final = "gym.rollout.outcome"
ATTR_FAILURE_KIND: Final = "gym.failure.kind"
ATTR_FAILURE_BOUNDARY: Final = "gym.failure.boundary"
ATTR_FAILURE_STAGE: Final = "gym.failure.stage"
ATTR_FAILURE_EVENT_ID: Final = "gym.failure.event_id"
ATTR_FAILURE_REASON: Final = "gym.failure.reason"
ATTR_FAILURE_HTTP_STATUS: Final = "gym.failure.http_status"
ATTR_ATTEMPT: Final = "gym.http.attempt"
ATTR_BACKOFF_SECONDS: Final = "gym.http.backoff_seconds"
ATTR_BODY_UPLOADED: Final = "gym.http.body_uploaded"

# --- attribute values (each metric attribute has a small fixed set) --------------------------------------
EXTERNAL_SERVER_NAME: Final = "external"

POOL_DATA: Final = "data"
POOL_CONTROL: Final = "control"
POOLS: Final = (POOL_DATA, POOL_CONTROL)

POOL_OUTCOME_OK: Final = "ok"
POOL_OUTCOME_ABANDONED: Final = "abandoned"

CONNECTION_STATE_ACTIVE: Final = "active"
CONNECTION_STATE_IDLE: Final = "idle"

RETRY_REASON_SERVER_DISCONNECTED: Final = "server_disconnected"
RETRY_REASON_CLIENT_OS_ERROR: Final = "client_os_error"
RETRY_REASON_TIMEOUT: Final = "timeout"
RETRY_REASON_CONNECTION_REFUSED: Final = "connection_refused"
RETRY_REASON_OTHER: Final = "other"
RETRY_REASONS: Final = (
    RETRY_REASON_SERVER_DISCONNECTED,
    RETRY_REASON_CLIENT_OS_ERROR,
    RETRY_REASON_TIMEOUT,
    RETRY_REASON_CONNECTION_REFUSED,
    RETRY_REASON_OTHER,
)

ROLLOUT_OUTCOME_SUCCESS: Final = "success"
ROLLOUT_OUTCOME_FAILURE: Final = "failure"
ROLLOUT_OUTCOMES: Final = (ROLLOUT_OUTCOME_SUCCESS, ROLLOUT_OUTCOME_FAILURE)

ERROR_TYPE_OTHER: Final = "_OTHER"

# --- span names and events -------------------------------------------------------------------------------
SPAN_EVENT_ATTEMPT_FAILED: Final = "gym.http.attempt_failed"
SPAN_EVENT_EXCEPTION: Final = "exception"
SPAN_ROLLOUT: Final = "gym.rollout"

# --- units -----------------------------------------------------------------------------------------------
UNIT_SECONDS: Final = "s"
UNIT_RETRY: Final = "{retry}"
UNIT_REQUEST: Final = "{request}"
UNIT_CONNECTION: Final = "{connection}"
UNIT_EVENT: Final = "{event}"
UNIT_ROLLOUT: Final = "{rollout}"

# --- metrics ---------------------------------------------------------------------------------------------
METRIC_HTTP_CLIENT_REQUEST_DURATION: Final = "http.client.request.duration"
METRIC_HTTP_SERVER_REQUEST_DURATION: Final = "http.server.request.duration"
METRIC_CLIENT_RETRIES: Final = "gym.client.retries"
METRIC_POOL_WAIT_DURATION: Final = "gym.client.pool.wait.duration"
METRIC_POOL_PENDING_REQUESTS: Final = "gym.client.pool.pending_requests"
METRIC_POOL_CONNECTIONS: Final = "gym.client.pool.connections"
METRIC_FAILURE_EVENTS: Final = "gym.failure.events"
METRIC_ROLLOUT_DURATION: Final = "gym.rollout.duration"
METRIC_ROLLOUTS: Final = "gym.rollouts"

# --- histogram bucket boundaries (seconds; the SDK's defaults are for milliseconds) ----------------------
HTTP_DURATION_BUCKETS_S: Final = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
)
POOL_WAIT_BUCKETS_S: Final = (
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
ROLLOUT_DURATION_BUCKETS_S: Final = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
)

HISTOGRAM_BUCKETS_S: Final = {
    METRIC_HTTP_CLIENT_REQUEST_DURATION: HTTP_DURATION_BUCKETS_S,
    METRIC_HTTP_SERVER_REQUEST_DURATION: HTTP_DURATION_BUCKETS_S,
    METRIC_POOL_WAIT_DURATION: POOL_WAIT_BUCKETS_S,
    METRIC_ROLLOUT_DURATION: ROLLOUT_DURATION_BUCKETS_S,
}

# --- wire names ------------------------------------------------------------------------------------------
FAILURE_REPORT_HEADER: Final = "X-NG-Failure-Report"
ROLLOUT_ID_HEADER: Final = "X-NG-Rollout-Id"
TRACE_PATH_SEGMENT: Final = "ng-trace"
ROLLOUT_PATH_SEGMENT: Final = "ng-rollout"
TOKEN_CAPTURE_PATH_SEGMENT: Final = "ng-token-capture"
TRACEPARENT_HEADER: Final = "traceparent"
TRACEPARENT_PATTERN: Final = r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}"
SESSION_COOKIE: Final = "gym_obs_session"  # signed session token (issue 8)
SESSION_HEADER: Final = "X-NG-Session"  # the same token for callers without a cookie jar
SESSION_FORWARDED_HEADER: Final = "X-NG-Session-Forwarded"  # set by a worker proxying to the session owner

# --- environment -----------------------------------------------------------------------------------------
ENV_TELEMETRY: Final = "GYM_OBS_TELEMETRY"
ENV_TRACE_PROPAGATION_TARGETS: Final = "GYM_OBS_TRACE_PROPAGATION_TARGETS"
ENV_RUN_ID: Final = "GYM_OBS_RUN_ID"
ENV_LOG_JSON: Final = "GYM_OBS_LOG_JSON"
ENV_TELEMETRY_DIR: Final = "GYM_OBS_TELEMETRY_DIR"  # where the `file` exporter writes OTLP JSON lines
ENV_GLOBAL_CONFIG: Final = "GYM_OBS_GLOBAL_CONFIG"  # resolved global config (JSON) for launched servers
ENV_SERVER_NAME: Final = "GYM_OBS_SERVER_NAME"  # which server of the global config this process runs
# Subprocess agents (issue 8): a child process reaches its model server through this already-prefixed URL.
ENV_MODEL_SERVER_NAME: Final = "GYM_OBS_MODEL_SERVER_NAME"
ENV_MODEL_SERVER_BASE_URL: Final = "GYM_OBS_MODEL_SERVER_BASE_URL"
# Sessions (issue 8): the secret session keys are derived from (shared by a server's workers), and the
# directory where a multi-worker server's workers register their private loopback ports.
ENV_SESSION_SECRET: Final = "GYM_OBS_SESSION_SECRET"
ENV_SESSION_ROUTING_DIR: Final = "GYM_OBS_SESSION_ROUTING_DIR"

# --- failure reports (issue 4) ---------------------------------------------------------------------------
ATTR_FAILURE_CAUSE_ID: Final = "gym.failure.cause_id"
FAILURE_REPORT_BODY_KEY: Final = "ng_failure_report"
"""Key of the failure report (payload object or encoded string) in a JSON error-reply body."""

# --- keys the export-time scrubber cleans (issue 12.2; telemetry/export_scrub.py) -----------------------
# Old and new HTTP semconv keys that can carry a query, fragment or userinfo; instrumentations we do not
# control (contrib FastAPI/ASGI, aiohttp-client) set them.
SCRUB_URL_KEYS: Final = frozenset({"url.full", "http.url"})
SCRUB_TARGET_KEYS: Final = frozenset({"http.target"})
SCRUB_DROPPED_KEYS: Final = frozenset({"url.query", "url.fragment"})
SCRUB_TEXT_KEYS: Final = frozenset({"exception.message", "exception.stacktrace"})
