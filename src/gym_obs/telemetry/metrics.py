"""The gym_obs metric instruments, created once per meter.

Instruments are cheap to use and expensive to create (the SDK looks them up by name and unit under a lock),
so they are built once per meter and cached; hot paths reach them through ``STATE.instruments``. Every
histogram carries explicit bucket boundaries in seconds from :mod:`gym_obs.telemetry.names`: the SDK's
defaults are meant for milliseconds and would put every request into the first bucket.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from opentelemetry.metrics import Counter, Histogram, Meter, UpDownCounter

from gym_obs.telemetry import names
from gym_obs.telemetry.preaggregated import (
    PreAggregatedCounter,
    PreAggregatedHistogram,
    PreAggregation,
    attach,
)

__all__ = ["AttributeCache", "CounterLike", "HistogramLike", "Instruments", "instruments_for"]

#: An SDK instrument, or its pre-aggregated twin (same ``record`` / ``add`` call).
HistogramLike = Histogram | PreAggregatedHistogram
CounterLike = Counter | PreAggregatedCounter


def _histogram(meter: Meter, name: str, description: str) -> Histogram:
    return meter.create_histogram(
        name,
        unit=names.UNIT_SECONDS,
        description=description,
        explicit_bucket_boundaries_advisory=list(names.HISTOGRAM_BUCKETS_S[name]),
    )


def _gen_ai_histogram(
    meter: Meter, pre: PreAggregation | None, name: str, unit: str, description: str
) -> HistogramLike:
    boundaries = names.GEN_AI_HISTOGRAM_BUCKETS[name]
    if pre is not None:
        return pre.histogram(name, unit, description, boundaries)
    return meter.create_histogram(
        name, unit=unit, description=description, explicit_bucket_boundaries_advisory=list(boundaries)
    )


def _counter(meter: Meter, pre: PreAggregation | None, name: str, unit: str, description: str) -> CounterLike:
    if pre is not None:
        return pre.counter(name, unit, description)
    return meter.create_counter(name, unit=unit, description=description)


class Instruments:
    """Every instrument gym_obs records to, bound to one meter. Build with :func:`instruments_for`."""

    __slots__ = (
        "client_request_duration",
        "client_retries",
        "client_timeouts",
        "failure_events",
        "gen_ai_client_duration",
        "gen_ai_client_tokens",
        "gen_ai_client_ttfc",
        "gen_ai_client_unparsable",
        "gen_ai_server_duration",
        "gen_ai_server_finishes",
        "gen_ai_server_tokens",
        "gen_ai_server_ttft",
        "gen_ai_server_unparsable",
        "meter",
        "pool_connections",
        "pool_connects",
        "pool_pending_requests",
        "pool_wait_duration",
        "rollout_duration",
        "rollouts",
        "server_request_duration",
    )

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.client_request_duration: Histogram = _histogram(
            meter, names.METRIC_HTTP_CLIENT_REQUEST_DURATION, "Duration of each HTTP client request attempt."
        )
        self.server_request_duration: Histogram = _histogram(
            meter, names.METRIC_HTTP_SERVER_REQUEST_DURATION, "Duration of HTTP server requests."
        )
        self.client_retries: Counter = meter.create_counter(
            names.METRIC_CLIENT_RETRIES, unit=names.UNIT_RETRY, description="HTTP client retries, by reason."
        )
        self.pool_wait_duration: Histogram = _histogram(
            meter, names.METRIC_POOL_WAIT_DURATION, "Time a request waited for a pooled connection."
        )
        self.pool_pending_requests: UpDownCounter = meter.create_up_down_counter(
            names.METRIC_POOL_PENDING_REQUESTS,
            unit=names.UNIT_REQUEST,
            description="Requests currently waiting for a pooled connection.",
        )
        self.pool_connections: UpDownCounter = meter.create_up_down_counter(
            names.METRIC_POOL_CONNECTIONS,
            unit=names.UNIT_CONNECTION,
            description="Pooled connections, by state (active or idle).",
        )
        self.pool_connects: Counter = meter.create_counter(
            names.METRIC_POOL_CONNECTS,
            unit=names.UNIT_CONNECTION,
            description="Connections opened, by destination and pool.",
        )
        self.client_timeouts: Counter = meter.create_counter(
            names.METRIC_CLIENT_TIMEOUTS,
            unit=names.UNIT_TIMEOUT,
            description="Request attempts that timed out, by destination (internal gym server or external).",
        )
        self.failure_events: Counter = meter.create_counter(
            names.METRIC_FAILURE_EVENTS,
            unit=names.UNIT_EVENT,
            description="Failure events, counted once where first observed.",
        )
        self.rollout_duration: Histogram = _histogram(
            meter, names.METRIC_ROLLOUT_DURATION, "Duration of one rollout, end to end."
        )
        self.rollouts: Counter = meter.create_counter(
            names.METRIC_ROLLOUTS, unit=names.UNIT_ROLLOUT, description="Finished rollouts, by outcome."
        )
        # GenAI model calls (issue 15): recorded by the model servers' model-call layer, several measurements
        # per call, so pre-aggregated in-process where the meter is the SDK's (see preaggregated.py).
        pre = attach(meter)
        self.gen_ai_server_duration: HistogramLike = _gen_ai_histogram(
            meter,
            pre,
            names.METRIC_GEN_AI_SERVER_REQUEST_DURATION,
            names.UNIT_SECONDS,
            "Model call duration on the model server, to the last byte of the reply.",
        )
        self.gen_ai_server_ttft: HistogramLike = _gen_ai_histogram(
            meter,
            pre,
            names.METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
            names.UNIT_SECONDS,
            "Time from the request's arrival to the first content chunk of a streamed reply.",
        )
        self.gen_ai_server_tokens: HistogramLike = _gen_ai_histogram(
            meter,
            pre,
            names.METRIC_GEN_AI_SERVER_TOKEN_USAGE,
            names.UNIT_TOKEN,
            "Tokens a model call used, by token type, as the reply reported them.",
        )
        self.gen_ai_server_finishes: CounterLike = _counter(
            meter,
            pre,
            names.METRIC_GEN_AI_SERVER_FINISHES,
            names.UNIT_FINISH,
            "Finished generations, by finish reason.",
        )
        self.gen_ai_server_unparsable: CounterLike = _counter(
            meter,
            pre,
            names.METRIC_GEN_AI_SERVER_UNPARSABLE,
            names.UNIT_REPLY,
            "Successful model replies whose usage could not be read, counted once, by reason.",
        )
        self._gen_ai_client(meter, pre)

    def _gen_ai_client(self, meter: Meter, pre: PreAggregation | None) -> None:
        """The agent's view of its model calls (client/model_calls.py), pre-aggregated like the server's."""
        self.gen_ai_client_duration: HistogramLike = _gen_ai_histogram(
            meter,
            pre,
            names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION,
            names.UNIT_SECONDS,
            "Model call duration as the caller saw it, from the request to the reply's last byte.",
        )
        self.gen_ai_client_tokens: HistogramLike = _gen_ai_histogram(
            meter,
            pre,
            names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE,
            names.UNIT_TOKEN,
            "Tokens a model call used, by token type, as the reply read by the caller reported them.",
        )
        self.gen_ai_client_ttfc: HistogramLike = _gen_ai_histogram(
            meter,
            pre,
            names.METRIC_GEN_AI_CLIENT_TIME_TO_FIRST_CHUNK,
            names.UNIT_SECONDS,
            "Time from the request to the first content chunk of a streamed reply, as the caller read it.",
        )
        self.gen_ai_client_unparsable: CounterLike = _counter(
            meter,
            pre,
            names.METRIC_GEN_AI_CLIENT_UNPARSABLE,
            names.UNIT_REPLY,
            "Successful model replies whose usage the caller's side could not read, counted once, by reason.",
        )


_LOCK: Final = threading.Lock()
# Keyed by id(meter); the meter itself is kept alive by Instruments.meter so the id cannot be reused.
_CACHE: dict[int, Instruments] = {}


def instruments_for(meter: Meter) -> Instruments:
    """Return the instruments for ``meter``, creating them on first use (thread-safe)."""
    cached = _CACHE.get(id(meter))
    if cached is not None and cached.meter is meter:
        return cached
    with _LOCK:
        cached = _CACHE.get(id(meter))
        if cached is None or cached.meter is not meter:
            cached = Instruments(meter)
            _CACHE[id(meter)] = cached
        return cached


class AttributeCache:
    """One shared attribute dict per label combination, so a hot path builds no dict per measurement.

    Labels have small fixed value sets (DESIGN.md), so the cache stays small; it is cleared if it ever
    outgrows ``max_entries`` (a caller passing unbounded values) rather than growing without limit.
    A value may be an int (a port, a status code) or ``None``, which leaves its key out of the dict
    (semconv attributes that only some points carry). The dicts are shared: never mutate one.
    """

    __slots__ = ("_cache", "_keys", "_max_entries")

    def __init__(self, *keys: str, max_entries: int = 1024) -> None:
        self._keys = keys
        self._max_entries = max_entries
        self._cache: dict[tuple[str | int | None, ...], dict[str, Any]] = {}

    def get(self, *values: str | int | None) -> dict[str, Any]:
        attrs = self._cache.get(values)
        if attrs is None:
            if len(self._cache) > self._max_entries:
                self._cache.clear()
            attrs = self._cache[values] = {
                key: value for key, value in zip(self._keys, values, strict=True) if value is not None
            }
        return attrs
