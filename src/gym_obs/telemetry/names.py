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
ATTR_POOL_CONSTRAINT: Final = "gym.pool.constraint"  # which limit a pool wait queued behind
ATTR_DESTINATION: Final = "gym.destination"  # internal (a gym server) | external
ATTR_ROLLOUT_OUTCOME: Final = "gym.rollout.outcome"
ATTR_ROLLOUT_INPUT_TOKENS: Final = "gym.rollout.input_tokens"  # spans only: the rollout's model-call totals
ATTR_ROLLOUT_OUTPUT_TOKENS: Final = "gym.rollout.output_tokens"
ATTR_ROLLOUT_MODEL_CALLS: Final = "gym.rollout.model_calls"
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

POOL_CONSTRAINT_TOTAL: Final = "total"  # the pool's total limit was reached
POOL_CONSTRAINT_PER_HOST: Final = "per_host"  # only the destination's per-host limit was
POOL_CONSTRAINTS: Final = (POOL_CONSTRAINT_TOTAL, POOL_CONSTRAINT_PER_HOST)

DESTINATION_INTERNAL: Final = "internal"
DESTINATION_EXTERNAL: Final = "external"
DESTINATIONS: Final = (DESTINATION_INTERNAL, DESTINATION_EXTERNAL)

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

ROLLOUT_OUTCOME_COMPLETED: Final = "completed"
ROLLOUT_OUTCOME_FAILED: Final = "failed"  # with the root gym.failure.kind on the span and the row
ROLLOUT_OUTCOME_OMITTED: Final = "omitted"  # no result by decision: admission refused, budget, cancelled
ROLLOUT_OUTCOMES: Final = (ROLLOUT_OUTCOME_COMPLETED, ROLLOUT_OUTCOME_FAILED, ROLLOUT_OUTCOME_OMITTED)

ERROR_TYPE_OTHER: Final = "_OTHER"

# --- span names and events -------------------------------------------------------------------------------
SPAN_EVENT_ATTEMPT_FAILED: Final = "gym.http.attempt_failed"
SPAN_EVENT_EXCEPTION: Final = "exception"
SPAN_ROLLOUT: Final = "gym.rollout"  # agent side (server.rollouts): parent of the rollout's hops
SPAN_HARNESS_ROLLOUT: Final = "gym.harness.rollout"  # the harness driver's root span of one rollout

# --- units -----------------------------------------------------------------------------------------------
UNIT_SECONDS: Final = "s"
UNIT_RETRY: Final = "{retry}"
UNIT_REQUEST: Final = "{request}"
UNIT_CONNECTION: Final = "{connection}"
UNIT_TIMEOUT: Final = "{timeout}"
UNIT_EVENT: Final = "{event}"
UNIT_ROLLOUT: Final = "{rollout}"

# --- metrics ---------------------------------------------------------------------------------------------
METRIC_HTTP_CLIENT_REQUEST_DURATION: Final = "http.client.request.duration"
METRIC_HTTP_SERVER_REQUEST_DURATION: Final = "http.server.request.duration"
METRIC_CLIENT_RETRIES: Final = "gym.client.retries"
METRIC_POOL_WAIT_DURATION: Final = "gym.client.pool.wait.duration"
METRIC_POOL_PENDING_REQUESTS: Final = "gym.client.pool.pending_requests"
METRIC_POOL_CONNECTIONS: Final = "gym.client.pool.connections"
METRIC_POOL_CONNECTS: Final = "gym.client.pool.connects"
METRIC_CLIENT_TIMEOUTS: Final = "gym.client.timeouts"
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
TRACESTATE_HEADER: Final = "tracestate"  # W3C vendor trace state, sent beside traceparent when a span has one
SESSION_COOKIE: Final = "gym_obs_session"  # signed session token (issue 8)
SESSION_HEADER: Final = "X-NG-Session"  # the same token for callers without a cookie jar
SESSION_FORWARDED_HEADER: Final = "X-NG-Session-Forwarded"  # set by a worker proxying to the session owner
INFLIGHT_ROUTE: Final = "/_gym/inflight"  # control route: the agent's in-flight rollouts (issue 18)

# --- environment -----------------------------------------------------------------------------------------
ENV_TELEMETRY: Final = "GYM_OBS_TELEMETRY"
ENV_TRACE_PROPAGATION_TARGETS: Final = "GYM_OBS_TRACE_PROPAGATION_TARGETS"
ENV_RUN_ID: Final = "GYM_OBS_RUN_ID"
ENV_LOG_JSON: Final = "GYM_OBS_LOG_JSON"
ENV_TELEMETRY_DIR: Final = "GYM_OBS_TELEMETRY_DIR"  # where the `file` exporter writes OTLP JSON lines
ENV_SPAN_GROUPS: Final = "GYM_OBS_SPAN_GROUPS"  # span groups and presets (telemetry/groups.py)
ENV_GLOBAL_CONFIG: Final = "GYM_OBS_GLOBAL_CONFIG"  # resolved global config (JSON) for launched servers
ENV_SERVER_NAME: Final = "GYM_OBS_SERVER_NAME"  # which server of the global config this process runs
ENV_HEAD_SERVER: Final = "GYM_OBS_HEAD_SERVER"  # host:port of the head server, for a driver outside launch
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

# --- launched children die with their launcher (issue 11) -------------------------------------------------
ENV_LAUNCHER_PID: Final = "GYM_OBS_LAUNCHER_PID"  # the launcher a child must not outlive
ENV_LAUNCHER_PIPE_FD: Final = "GYM_OBS_LAUNCHER_PIPE_FD"  # read end of a pipe only the launcher writes to
ENV_LAUNCHER_DEATH_SIGNAL: Final = "GYM_OBS_LAUNCHER_DEATH_SIGNAL"  # "1": set PR_SET_PDEATHSIG in the child

# --- export cadence and run identity (issue 11) -----------------------------------------------------------
#: gym processes export metrics every 10 s unless OTEL_METRIC_EXPORT_INTERVAL or the config says otherwise;
#: every dashboard rate window is at least RATE_WINDOW_EXPORTS export intervals.
DEFAULT_EXPORT_INTERVAL_S: Final = 10
RATE_WINDOW_EXPORTS: Final = 4
ENV_SERVICE_VERSION: Final = "OTEL_SERVICE_VERSION"
SERVICE_VERSION: Final = "service.version"
#: Batch schedulers' job ids, in the order tried when no run id is configured (Slurm, PBS, LSF, SGE).
SCHEDULER_JOB_ID_ENVS: Final = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")
MAX_RUN_ID_CHARS: Final = 128

# --- GenAI model calls (issue 15) --------------------------------------------------------------------------
# OpenTelemetry GenAI semantic conventions where one exists; gym additions under ``gym.gen_ai.``. The
# conventions define no server-side token metric (only ``gen_ai.client.token.usage``), so the model server's
# token histogram is gym's, with the same unit, attributes and buckets as the client one.
ATTR_GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
ATTR_GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
ATTR_GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
ATTR_GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
ATTR_GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
ATTR_GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ATTR_GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
ATTR_GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"  # includes cached input (semconv)
ATTR_GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
ATTR_GEN_AI_USAGE_REASONING_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
ATTR_GEN_AI_USAGE_CACHED_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
ATTR_GEN_AI_OUTCOME: Final = "gym.gen_ai.outcome"
ATTR_GEN_AI_STREAMED: Final = "gym.gen_ai.streamed"  # spans only
ATTR_GEN_AI_UNPARSABLE_REASON: Final = "gym.gen_ai.unparsable.reason"
ATTR_GEN_AI_TIME_TO_FIRST_TOKEN: Final = "gym.gen_ai.time_to_first_token"  # on the first-token span event

SPAN_EVENT_GEN_AI_FIRST_TOKEN: Final = "gym.gen_ai.first_token"

GEN_AI_OPERATION_CHAT: Final = "chat"
GEN_AI_OPERATION_RESPONSES: Final = "responses"
GEN_AI_OPERATION_MESSAGES: Final = "messages"
GEN_AI_OPERATIONS: Final = (GEN_AI_OPERATION_CHAT, GEN_AI_OPERATION_RESPONSES, GEN_AI_OPERATION_MESSAGES)

GEN_AI_TOKEN_INPUT: Final = "input"
GEN_AI_TOKEN_OUTPUT: Final = "output"
GEN_AI_TOKEN_REASONING: Final = "reasoning"
GEN_AI_TOKEN_CACHED_INPUT: Final = "cached_input"
GEN_AI_TOKEN_TYPES: Final = (
    GEN_AI_TOKEN_INPUT, GEN_AI_TOKEN_OUTPUT, GEN_AI_TOKEN_REASONING, GEN_AI_TOKEN_CACHED_INPUT,
)

# Finish reasons: the semconv output-message enum, plus ``other`` for anything a dialect adds.
GEN_AI_FINISH_STOP: Final = "stop"
GEN_AI_FINISH_LENGTH: Final = "length"
GEN_AI_FINISH_TOOL_CALL: Final = "tool_call"
GEN_AI_FINISH_CONTENT_FILTER: Final = "content_filter"
GEN_AI_FINISH_ERROR: Final = "error"
GEN_AI_FINISH_OTHER: Final = "other"
GEN_AI_FINISH_REASONS: Final = (
    GEN_AI_FINISH_STOP, GEN_AI_FINISH_LENGTH, GEN_AI_FINISH_TOOL_CALL, GEN_AI_FINISH_CONTENT_FILTER,
    GEN_AI_FINISH_ERROR, GEN_AI_FINISH_OTHER,
)

GEN_AI_OUTCOME_OK: Final = "ok"
GEN_AI_OUTCOME_UPSTREAM_ERROR: Final = "upstream_error"  # the model server answered 4xx/5xx
GEN_AI_OUTCOME_EXCEPTION: Final = "exception"
GEN_AI_OUTCOME_CANCELLED: Final = "cancelled"  # the caller went away before the reply was complete
GEN_AI_OUTCOMES: Final = (
    GEN_AI_OUTCOME_OK, GEN_AI_OUTCOME_UPSTREAM_ERROR, GEN_AI_OUTCOME_EXCEPTION, GEN_AI_OUTCOME_CANCELLED,
)

GEN_AI_MODEL_OTHER: Final = "other"  # a model name outside the configured allow-list, on metrics

GEN_AI_UNPARSABLE_MALFORMED: Final = "malformed"  # not JSON / not SSE of the dialect
GEN_AI_UNPARSABLE_TRUNCATED: Final = "truncated"  # the stream ended inside an event
GEN_AI_UNPARSABLE_MISSING_USAGE: Final = "missing_usage"
GEN_AI_UNPARSABLE_INVALID_USAGE: Final = "invalid_usage"  # negative, non-integer or absurd counts
GEN_AI_UNPARSABLE_TOO_LARGE: Final = "too_large"
GEN_AI_UNPARSABLE_CONTENT_TYPE: Final = "content_type"  # neither JSON nor an event stream
GEN_AI_UNPARSABLE_REASONS: Final = (
    GEN_AI_UNPARSABLE_MALFORMED, GEN_AI_UNPARSABLE_TRUNCATED, GEN_AI_UNPARSABLE_MISSING_USAGE,
    GEN_AI_UNPARSABLE_INVALID_USAGE, GEN_AI_UNPARSABLE_TOO_LARGE, GEN_AI_UNPARSABLE_CONTENT_TYPE,
)

GEN_AI_ROUTE_CHAT: Final = "/v1/chat/completions"
GEN_AI_ROUTE_RESPONSES: Final = "/v1/responses"
GEN_AI_ROUTE_MESSAGES: Final = "/v1/messages"

UNIT_TOKEN: Final = "{token}"
UNIT_REPLY: Final = "{reply}"
UNIT_FINISH: Final = "{finish}"

METRIC_GEN_AI_SERVER_REQUEST_DURATION: Final = "gen_ai.server.request.duration"
METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: Final = "gen_ai.server.time_to_first_token"
METRIC_GEN_AI_SERVER_TOKEN_USAGE: Final = "gym.gen_ai.server.token.usage"
METRIC_GEN_AI_SERVER_FINISHES: Final = "gym.gen_ai.server.finishes"
METRIC_GEN_AI_SERVER_UNPARSABLE: Final = "gym.gen_ai.server.unparsable_replies"

# Buckets: the GenAI semantic conventions' advisory boundaries.
GEN_AI_DURATION_BUCKETS_S: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
GEN_AI_TTFT_BUCKETS_S: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)
GEN_AI_TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)
GEN_AI_HISTOGRAM_BUCKETS: Final = {
    METRIC_GEN_AI_SERVER_REQUEST_DURATION: GEN_AI_DURATION_BUCKETS_S,
    METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: GEN_AI_TTFT_BUCKETS_S,
    METRIC_GEN_AI_SERVER_TOKEN_USAGE: GEN_AI_TOKEN_BUCKETS,
}

# The agent's view of a model call (issue 15 §2; client/model_calls.py): the semconv client metrics, on the
# CLIENT span's request. Duration and token buckets are the semconv advisories; the conventions give no
# advisory for time to first chunk, so it shares the server's TTFT buckets (same question, other side).
# Time to first chunk counts the first chunk that carries generated content, as the server's TTFT does (a
# Responses stream's first chunk is ``response.created``, which says nothing about generation).
METRIC_GEN_AI_CLIENT_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_GEN_AI_CLIENT_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_GEN_AI_CLIENT_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
METRIC_GEN_AI_CLIENT_UNPARSABLE: Final = "gym.gen_ai.client.unparsable_replies"
# A reply the caller read some other way than gym_obs's helpers (or released unread): its usage is unknown.
GEN_AI_UNPARSABLE_UNREAD: Final = "unread"
GEN_AI_CLIENT_UNPARSABLE_REASONS: Final = (*GEN_AI_UNPARSABLE_REASONS, GEN_AI_UNPARSABLE_UNREAD)
GEN_AI_HISTOGRAM_BUCKETS.update(
    {
        METRIC_GEN_AI_CLIENT_OPERATION_DURATION: GEN_AI_DURATION_BUCKETS_S,
        METRIC_GEN_AI_CLIENT_TOKEN_USAGE: GEN_AI_TOKEN_BUCKETS,
        METRIC_GEN_AI_CLIENT_TIME_TO_FIRST_CHUNK: GEN_AI_TTFT_BUCKETS_S,
    }
)

# --- Admission concurrency and process resources (issue 16) ----------------------------------------------
# TimedSemaphore (client/concurrency.py): the site is a code-chosen label, validated against this pattern.
ATTR_CONCURRENCY_SITE: Final = "gym.concurrency.site"
CONCURRENCY_SITE_PATTERN: Final = r"[a-z][a-z0-9_.\-]{0,47}"
CONCURRENCY_SITE_HARNESS_ROLLOUTS: Final = "harness.rollouts"  # the harness's in-flight rollout limit
CONCURRENCY_SITE_AGENT_ROLLOUTS: Final = "agent.rollouts"  # an agent server's in-flight rollout limit
METRIC_CONCURRENCY_WAIT_DURATION: Final = "gym.concurrency.wait.duration"
METRIC_CONCURRENCY_ACTIVE: Final = "gym.concurrency.active"
METRIC_CONCURRENCY_LIMIT: Final = "gym.concurrency.limit"
METRIC_CONCURRENCY_CANCELLED_WAITS: Final = "gym.concurrency.wait.cancelled"
UNIT_PERMIT: Final = "{permit}"
UNIT_WAIT: Final = "{wait}"
CONCURRENCY_WAIT_BUCKETS_S: Final = (
    0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)
# Process gauges (telemetry/resources.py); OS process semantic conventions (v1.2x+) where one exists.
ENV_PROCESS_GAUGES: Final = "GYM_OBS_PROCESS_GAUGES"  # opt-in switch (1/0); explicit config beats it
ATTR_MEMORY_TYPE: Final = "memory.type"
MEMORY_TYPE_RSS: Final = "rss"
MEMORY_TYPE_PSS: Final = "pss"
ATTR_CPU_MODE: Final = "cpu.mode"
CPU_MODE_USER: Final = "user"
CPU_MODE_SYSTEM: Final = "system"
ATTR_HW_ID: Final = "hw.id"  # GPU index as "gpu<N>": bounded by the devices on the host
METRIC_PROCESS_MEMORY_USAGE: Final = "process.memory.usage"
METRIC_PROCESS_CPU_UTILIZATION: Final = "process.cpu.utilization"
METRIC_PROCESS_FILE_DESCRIPTORS: Final = "process.unix.file_descriptor.count"
METRIC_PROCESS_THREADS: Final = "process.thread.count"
METRIC_EVENT_LOOP_LAG: Final = "gym.process.event_loop.lag"
METRIC_GPU_UTILIZATION: Final = "hw.gpu.utilization"
METRIC_GPU_MEMORY_USAGE: Final = "hw.gpu.memory.usage"
UNIT_BYTES: Final = "By"
# A dimensionless ratio (0..1). Not semconv's "1": the collector's Prometheus exporter appends "_ratio" to
# a gauge with unit "1" while the SDK's Prometheus exporter does not, so one dashboard query could not see
# both paths. An annotation unit gives the same name on every path (no suffix).
UNIT_RATIO: Final = "{ratio}"
UNIT_FILE_DESCRIPTOR: Final = "{file_descriptor}"
UNIT_THREAD: Final = "{thread}"
EVENT_LOOP_LAG_BUCKETS_S: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
HISTOGRAM_BUCKETS_S.update(
    {
        METRIC_CONCURRENCY_WAIT_DURATION: CONCURRENCY_WAIT_BUCKETS_S,
        METRIC_EVENT_LOOP_LAG: EVENT_LOOP_LAG_BUCKETS_S,
    }
)

# --- keys the export-time scrubber cleans (issue 12.2; telemetry/export_scrub.py) -----------------------
# Old and new HTTP semconv keys that can carry a query, fragment or userinfo; instrumentations we do not
# control (contrib FastAPI/ASGI, aiohttp-client) set them.
SCRUB_URL_KEYS: Final = frozenset({"url.full", "http.url"})
SCRUB_TARGET_KEYS: Final = frozenset({"http.target"})
SCRUB_DROPPED_KEYS: Final = frozenset({"url.query", "url.fragment"})
SCRUB_TEXT_KEYS: Final = frozenset({"exception.message", "exception.stacktrace"})

# --- The startup trace (issue 16.2; server/startup.py) ---------------------------------------------------
# One ``gym.startup`` trace per launch: the launcher's root span, one span per launcher stage, one
# ``gym.startup.server`` span per launched process (spawn -> first healthy probe) and, in each server
# process (every uvicorn worker included), a ``gym.startup.process`` span with one span per process stage.
SPAN_STARTUP: Final = "gym.startup"
SPAN_STARTUP_SERVER: Final = "gym.startup.server"
SPAN_STARTUP_PROCESS: Final = "gym.startup.process"
SPAN_STARTUP_STAGE_PREFIX: Final = "gym.startup."  # + one of the stage names below
ATTR_STARTUP_STAGE: Final = "gym.startup.stage"
STARTUP_STAGE_LOAD_CONFIG: Final = "load_config"
STARTUP_STAGE_START_HEAD: Final = "start_head_server"
STARTUP_STAGE_SPAWN_SERVERS: Final = "spawn_servers"
STARTUP_STAGE_WAIT_READY: Final = "wait_for_readiness"
STARTUP_STAGE_INTERPRETER: Final = "interpreter_start"  # spawn -> gym_obs code runs in the new process
STARTUP_STAGE_APP_BUILD: Final = "app_build"  # telemetry set-up, setup_webserver(), the gym layers
STARTUP_STAGE_UVICORN: Final = "uvicorn_start"  # app built -> lifespan startup complete (serving)
STARTUP_LAUNCHER_STAGES: Final = (
    STARTUP_STAGE_LOAD_CONFIG, STARTUP_STAGE_START_HEAD, STARTUP_STAGE_SPAWN_SERVERS,
    STARTUP_STAGE_WAIT_READY,
)
STARTUP_PROCESS_STAGES: Final = (STARTUP_STAGE_INTERPRETER, STARTUP_STAGE_APP_BUILD, STARTUP_STAGE_UVICORN)
ATTR_PROCESS_PID: Final = "process.pid"  # spans only
ATTR_PROCESS_EXIT_CODE: Final = "process.exit.code"  # spans only: a server that died before ready
ATTR_STARTUP_LAST_LOG_LINE: Final = "gym.startup.last_log_line"  # spans only: scrubbed, bounded
ATTR_STARTUP_TIMEOUT_S: Final = "gym.startup.timeout_s"
STARTUP_ERROR_EXITED: Final = "process_exited"  # error.type of a gym.startup.server span
STARTUP_ERROR_TIMEOUT: Final = "startup_timeout"
STARTUP_ERROR_LAUNCH_FAILED: Final = "launch_failed"  # error.type of the root span
# The launcher hands each child its gym.startup.server span and the wall-clock time (ns) it spawned it.
ENV_STARTUP_TRACEPARENT: Final = "GYM_OBS_STARTUP_TRACEPARENT"
ENV_STARTUP_SPAWNED_NS: Final = "GYM_OBS_STARTUP_SPAWNED_NS"
LAUNCHER_SERVICE_NAME: Final = "launcher"  # service gym/launcher: `gym-obs serve` when it owns telemetry
METRIC_SERVER_STARTUP_DURATION: Final = "gym.server.startup.duration"  # by gym.server.type
SERVER_STARTUP_BUCKETS_S: Final = (
    0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)
HISTOGRAM_BUCKETS_S[METRIC_SERVER_STARTUP_DURATION] = SERVER_STARTUP_BUCKETS_S

# --- Process trees of launched servers (issue 16.4; telemetry/process_tree.py) ----------------------------
# Reported by the launcher for every server it started: the whole tree (the launched process, its uvicorn
# workers, their subprocesses), summed per (gym.server.name, gym.process.role). Pids are never labels; the
# process count says how many processes a point sums.
ATTR_PROCESS_ROLE: Final = "gym.process.role"
PROCESS_ROLE_MAIN: Final = "main"  # the process the launcher spawned
PROCESS_ROLE_WORKER: Final = "worker"  # a direct child of a multi-worker server (a uvicorn worker)
PROCESS_ROLE_CHILD: Final = "child"  # any other descendant (subprocess agents, tools, helpers)
PROCESS_ROLES: Final = (PROCESS_ROLE_MAIN, PROCESS_ROLE_WORKER, PROCESS_ROLE_CHILD)
METRIC_TREE_PROCESSES: Final = "gym.server.process_tree.processes"
METRIC_TREE_MEMORY_USAGE: Final = "gym.server.process_tree.memory.usage"  # memory.type rss | pss
METRIC_TREE_CPU_UTILIZATION: Final = "gym.server.process_tree.cpu.utilization"  # cpu.mode user | system
METRIC_TREE_FILE_DESCRIPTORS: Final = "gym.server.process_tree.file_descriptor.count"
METRIC_TREE_THREADS: Final = "gym.server.process_tree.thread.count"
METRIC_TREE_GPU_MEMORY_USAGE: Final = "gym.server.process_tree.gpu.memory.usage"  # only with nvidia-smi
UNIT_PROCESS: Final = "{process}"
# --- the native SERVER span (issue 13 §1; server/_span.py) ----------------------------------------------
ATTR_URL_PATH: Final = "url.path"
ATTR_URL_QUERY: Final = "url.query"  # never set by gym_obs: named so tests can assert it is absent
ATTR_NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
ATTR_CLIENT_ADDRESS: Final = "client.address"
ATTR_USER_AGENT_ORIGINAL: Final = "user_agent.original"
MAX_USER_AGENT_CHARS: Final = 256  # user_agent.original is cut here (after scrubbing)
# Request methods the semantic conventions name; any other is "_OTHER" (+ http.request.method_original).
KNOWN_HTTP_METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"}
)
HTTP_METHOD_OTHER: Final = "_OTHER"
ENV_SERVER_INSTRUMENTATION: Final = "GYM_OBS_SERVER_INSTRUMENTATION"  # native | contrib
SERVER_INSTRUMENTATION_NATIVE: Final = "native"  # gym_obs's own pure-ASGI SERVER span (the default)
SERVER_INSTRUMENTATION_CONTRIB: Final = "contrib"  # opentelemetry-instrumentation-fastapi
SERVER_INSTRUMENTATIONS: Final = (SERVER_INSTRUMENTATION_NATIVE, SERVER_INSTRUMENTATION_CONTRIB)
