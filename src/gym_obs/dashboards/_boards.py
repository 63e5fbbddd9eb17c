"""The five gym dashboards, each a list of the questions a person running rollouts asks.

Metric and label names come only from :mod:`gym_obs.dashboards.metrics` specs and
:mod:`gym_obs.telemetry.names`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gym_obs.dashboards import _panels as p
from gym_obs.dashboards._processes import processes
from gym_obs.dashboards.metrics import (
    CLIENT_REQUEST_DURATION,
    CLIENT_RETRIES,
    FAILURE_EVENTS,
    GEN_AI_SERVER_DURATION,
    GEN_AI_SERVER_FINISHES,
    GEN_AI_SERVER_TOKENS,
    GEN_AI_SERVER_TTFT,
    POOL_CONNECTIONS,
    POOL_PENDING_REQUESTS,
    POOL_WAIT_DURATION,
    ROLLOUT_DURATION,
    ROLLOUTS,
    SERVER_REQUEST_DURATION,
)
from gym_obs.dashboards.naming import JOB_LABEL
from gym_obs.telemetry import names

_QUANTILES: Final = (0.5, 0.9, 0.99)

_OUTCOME = p.label(names.ATTR_ROLLOUT_OUTCOME)
_KIND = p.label(names.ATTR_FAILURE_KIND)
_BOUNDARY = p.label(names.ATTR_FAILURE_BOUNDARY)
_STAGE = p.label(names.ATTR_FAILURE_STAGE)
_SERVER = p.label(names.ATTR_SERVER_NAME)
_STATUS = p.label(names.ATTR_HTTP_RESPONSE_STATUS_CODE)
_ERROR_TYPE = p.label(names.ATTR_ERROR_TYPE)
_RETRY_REASON = p.label(names.ATTR_RETRY_REASON)
_POOL = p.label(names.ATTR_POOL)
_POOL_OUTCOME = p.label(names.ATTR_POOL_OUTCOME)
_CONN_STATE = p.label(names.ATTR_HTTP_CONNECTION_STATE)
_ROUTE = p.label(names.ATTR_HTTP_ROUTE)

_SERVER_VAR = "server"
_SERVER_MATCH = f'{_SERVER}=~"${_SERVER_VAR}"'


def _legend(*labels: str) -> str:
    return " ".join("{{" + name + "}}" for name in labels)


def rollouts() -> dict[str, Any]:
    board = p.Board(
        "gym-rollouts",
        "gym / Rollouts overview",
        "How many rollouts finish, how many fail, how long they take, and which failures end them.",
    )
    board.query_variable(
        p.JOB_VAR, p.job_variable_query(ROLLOUTS, ROLLOUT_DURATION, FAILURE_EVENTS), "Service"
    )
    all_rollouts = p.selector(ROLLOUTS.series())
    board.timeseries(
        "Rollouts per second by outcome",
        "Finished rollouts per second, split by outcome.",
        [p.Target(p.sum_rate(all_rollouts, _OUTCOME), _legend(_OUTCOME))],
        unit="ops",
    )
    board.piechart(
        "Rollout outcomes in the time range",
        "Share of each outcome among the rollouts that finished in the selected time range.",
        p.Target(
            f"sum by ({_OUTCOME}) (increase({all_rollouts}[$__range]))", _legend(_OUTCOME), instant=True
        ),
    )
    failed = p.selector(ROLLOUTS.series(), f'{_OUTCOME}="{names.ROLLOUT_OUTCOME_FAILED}"')
    board.timeseries(
        "Rollout failure ratio",
        "Failed rollouts / all finished rollouts.",
        [p.Target(p.ratio_or_zero(p.sum_rate(failed), p.sum_rate(all_rollouts)), "failure ratio")],
        unit="percentunit",
    )
    board.timeseries(
        "Rollout duration quantiles",
        "p50 / p90 / p99 of rollout wall time. Exemplar dots open the slow rollout's trace.",
        [p.Target(p.quantile(q, ROLLOUT_DURATION), f"p{round(q * 100)}") for q in _QUANTILES],
        unit="s",
        histogram=True,
    )
    events = p.selector(FAILURE_EVENTS.series())
    board.timeseries(
        "Failures by kind",
        "Failure events per second where first observed, by failure kind (root causes, never re-counted).",
        [p.Target(p.sum_rate(events, _KIND), _legend(_KIND))],
        unit="ops",
    )
    board.timeseries(
        "Failures by boundary",
        "Failure events per second by the boundary that observed them (model, agent, resources server...).",
        [p.Target(p.sum_rate(events, _BOUNDARY), _legend(_BOUNDARY))],
        unit="ops",
    )
    return board.build()


def http_client() -> dict[str, Any]:
    board = p.Board(
        "gym-http-client",
        "gym / HTTP client and pools",
        "Latency per hop, retries, and how long requests queue for a pooled connection.",
    )
    board.query_variable(
        p.JOB_VAR,
        p.job_variable_query(CLIENT_REQUEST_DURATION, CLIENT_RETRIES, POOL_WAIT_DURATION),
        "Service",
    )
    board.query_variable(
        _SERVER_VAR,
        f"label_values({p.selector(CLIENT_REQUEST_DURATION.series('_count'))}, {_SERVER})",
        "Destination",
    )
    for q in (0.5, 0.99):
        board.timeseries(
            f"Request duration p{round(q * 100)} by destination",
            "Per-attempt client latency to each destination server (gym.server.name).",
            [
                p.Target(
                    p.quantile(q, CLIENT_REQUEST_DURATION, _SERVER, matchers=[_SERVER_MATCH]),
                    _legend(_SERVER),
                )
            ],
            unit="s",
            histogram=True,
        )
    attempts = p.selector(CLIENT_REQUEST_DURATION.series("_count"), _SERVER_MATCH)
    board.timeseries(
        "Attempts per second by destination and status",
        "Every attempt, retries included; attempts without a response show their error.type.",
        [
            p.Target(
                p.sum_rate(attempts, _SERVER, _STATUS, _ERROR_TYPE), _legend(_SERVER, _STATUS, _ERROR_TYPE)
            )
        ],
        unit="reqps",
    )
    board.timeseries(
        "Retries per second by reason",
        "Connection-level retries by reason and destination.",
        [
            p.Target(
                p.sum_rate(p.selector(CLIENT_RETRIES.series(), _SERVER_MATCH), _SERVER, _RETRY_REASON),
                _legend(_SERVER, _RETRY_REASON),
            )
        ],
        unit="ops",
    )
    board.timeseries(
        "Pool wait quantiles by pool",
        "Time a request waited for a pooled connection (p50 / p99); long waits mean the pool is too small.",
        [
            p.Target(
                p.quantile(q, POOL_WAIT_DURATION, _POOL, matchers=[_SERVER_MATCH]),
                _legend(_POOL) + f" p{round(q * 100)}",
            )
            for q in (0.5, 0.99)
        ],
        unit="s",
        histogram=True,
    )
    waits = p.selector(POOL_WAIT_DURATION.series("_count"), _SERVER_MATCH)
    board.timeseries(
        "Pool waits per second by outcome",
        "Waits that got a connection (ok) versus waits abandoned by cancellation or timeout.",
        [p.Target(p.sum_rate(waits, _POOL, _POOL_OUTCOME), _legend(_POOL, _POOL_OUTCOME))],
        unit="ops",
    )
    pending = p.selector(POOL_PENDING_REQUESTS.series(), _SERVER_MATCH)
    board.timeseries(
        "Pending requests",
        "Requests queued for a pooled connection right now, per destination and pool.",
        [p.Target(f"sum by ({p.by(_SERVER, _POOL)}) ({pending})", _legend(_SERVER, _POOL))],
        unit="short",
    )
    connections = p.selector(POOL_CONNECTIONS.series())
    board.timeseries(
        "Connections by state",
        "Pooled connections in use (active) and kept alive for reuse (idle).",
        [p.Target(f"sum by ({p.by(_POOL, _CONN_STATE)}) ({connections})", _legend(_POOL, _CONN_STATE))],
        unit="short",
    )
    return board.build()


def servers() -> dict[str, Any]:
    board = p.Board(
        "gym-servers",
        "gym / Servers",
        "What each gym server answers: request rate, latency by route and status, error ratio.",
    )
    board.query_variable(p.JOB_VAR, p.job_variable_query(SERVER_REQUEST_DURATION), "Service")
    requests = p.selector(SERVER_REQUEST_DURATION.series("_count"))
    board.timeseries(
        "Requests per second by route and status",
        "Server requests per second by route template and HTTP status code.",
        [p.Target(p.sum_rate(requests, _ROUTE, _STATUS), _legend(_ROUTE, _STATUS))],
        unit="reqps",
    )
    board.timeseries(
        "Requests per second by service",
        "Server requests per second by service (job = service.name).",
        [p.Target(p.sum_rate(requests, JOB_LABEL), _legend(JOB_LABEL))],
        unit="reqps",
    )
    for q in (0.5, 0.99):
        board.timeseries(
            f"Request duration p{round(q * 100)} by route and status",
            "Server-side latency by route template and status code.",
            [p.Target(p.quantile(q, SERVER_REQUEST_DURATION, _ROUTE, _STATUS), _legend(_ROUTE, _STATUS))],
            unit="s",
            histogram=True,
        )
    errors = p.selector(SERVER_REQUEST_DURATION.series("_count"), f'{_STATUS}=~"5.."')
    board.timeseries(
        "Error ratio (5xx) by route",
        "Share of requests answered with a 5xx status, per route template.",
        [
            p.Target(
                p.ratio_or_zero(p.sum_rate(errors, _ROUTE), p.sum_rate(requests, _ROUTE)), _legend(_ROUTE)
            )
        ],
        unit="percentunit",
        width=24,
    )
    return board.build()


def failures() -> dict[str, Any]:
    board = p.Board(
        "gym-failures",
        "gym / Failures",
        "Failure events where they were first observed, by kind, boundary and stage.",
    )
    board.query_variable(p.JOB_VAR, p.job_variable_query(FAILURE_EVENTS), "Service")
    events = p.selector(FAILURE_EVENTS.series())
    for title, attr in (("kind", _KIND), ("boundary", _BOUNDARY), ("stage", _STAGE)):
        board.timeseries(
            f"Failure events by {title}",
            f"Failure events per second by {title}.",
            [p.Target(p.sum_rate(events, attr), _legend(attr))],
            unit="ops",
        )
    board.timeseries(
        "Failure events by service",
        "Failure events per second by the service that first observed them.",
        [p.Target(p.sum_rate(events, JOB_LABEL), _legend(JOB_LABEL))],
        unit="ops",
    )
    board.table(
        "Failure events in the time range",
        "Count of failure events per kind, boundary and stage over the selected time range.",
        p.Target(
            f"sum by ({p.by(_KIND, _BOUNDARY, _STAGE)}) (increase({events}[$__range]))",
            _legend(_KIND, _BOUNDARY, _STAGE),
            instant=True,
            table=True,
        ),
    )
    return board.build()


def model_calls() -> dict[str, Any]:
    """gym / Model calls: what the model servers saw (the model-call layer's GenAI metrics), and how much of
    the rollouts' time went into them. Self-contained: its labels are local, its specs from dashboards."""
    operation = p.label(names.ATTR_GEN_AI_OPERATION_NAME)
    outcome = p.label(names.ATTR_GEN_AI_OUTCOME)
    token_type = p.label(names.ATTR_GEN_AI_TOKEN_TYPE)
    finish = p.label(names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS)
    board = p.Board(
        "gym-model-calls",
        "gym / Model calls",
        "Model calls as the model servers saw them: rate, latency, time to first token, tokens, finish "
        "reasons, and the share of rollout time spent in model calls.",
    )
    board.query_variable(
        p.JOB_VAR, p.job_variable_query(GEN_AI_SERVER_DURATION, GEN_AI_SERVER_TOKENS), "Service"
    )
    calls = p.selector(GEN_AI_SERVER_DURATION.series("_count"))
    board.timeseries(
        "Model calls per second by operation and outcome",
        "Finished model calls per second by dialect (chat, responses, messages) and outcome (ok, "
        "upstream_error, exception, cancelled).",
        [p.Target(p.sum_rate(calls, operation, outcome), _legend(operation, outcome))],
        unit="reqps",
    )
    board.timeseries(
        "Model-call duration quantiles",
        "p50 / p90 / p99 of the time from a model request's arrival to the last byte of its reply.",
        [p.Target(p.quantile(q, GEN_AI_SERVER_DURATION), f"p{round(q * 100)}") for q in _QUANTILES],
        unit="s",
        histogram=True,
    )
    board.timeseries(
        "Time to first token quantiles (streamed replies)",
        "p50 / p90 / p99 of the time from a streamed request's arrival to its first content chunk.",
        [p.Target(p.quantile(q, GEN_AI_SERVER_TTFT), f"p{round(q * 100)}") for q in _QUANTILES],
        unit="s",
        histogram=True,
    )
    tokens = p.selector(GEN_AI_SERVER_TOKENS.series("_sum"))
    board.timeseries(
        "Tokens per second by type",
        "Tokens the replies reported per second: input (cached included), output, reasoning, cached input.",
        [p.Target(p.sum_rate(tokens, token_type), _legend(token_type))],
        unit="short",
    )
    finishes = p.selector(GEN_AI_SERVER_FINISHES.series())
    board.timeseries(
        "Finish reasons per second",
        "Generations finished per second by normalised finish reason (unknown values are 'other').",
        [p.Target(p.sum_rate(finishes, finish), _legend(finish))],
        unit="ops",
    )
    model_seconds = p.selector(GEN_AI_SERVER_DURATION.series("_sum"))
    rollout_seconds = p.selector(ROLLOUT_DURATION.series("_sum"))
    board.timeseries(
        "Share of rollout time in model calls",
        "Model-call seconds per rollout second, over the selected services (select all: the model servers "
        "time the calls, the agents the rollouts; parallel calls of one rollout each count, so fan-out can "
        "exceed 100%). The rest is tools, verification and the agent's own work.",
        [p.Target(p.ratio_or_zero(p.sum_rate(model_seconds), p.sum_rate(rollout_seconds)), "model share")],
        unit="percentunit",
    )
    return board.build()


DASHBOARDS: Final[dict[str, Callable[[], dict[str, Any]]]] = {
    "gym-rollouts.json": rollouts,
    "gym-http-client.json": http_client,
    "gym-servers.json": servers,
    "gym-failures.json": failures,
    "gym-processes.json": processes,
    "gym-model-calls.json": model_calls,
}


def build_all() -> dict[str, dict[str, Any]]:
    return {file_name: build() for file_name, build in DASHBOARDS.items()}
