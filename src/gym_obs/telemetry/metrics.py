"""The gym_obs metric instruments, created once per meter.

Instruments are cheap to use and expensive to create (the SDK looks them up by name and unit under a lock),
so they are built once per meter and cached; hot paths reach them through ``STATE.instruments``. Every
histogram carries explicit bucket boundaries from :mod:`gym_obs.telemetry.names` (seconds for durations):
the SDK's defaults are meant for milliseconds and would put every request into the first bucket.

Where the meter is the SDK's, the histograms and counters are pre-aggregated in-process
(:mod:`gym_obs.telemetry.preaggregated`): a point costs well under a microsecond instead of the SDK's
several, with the same buckets, readers, temporalities and exemplars. An instrument a configured view could
select, and every instrument of a meter that is not the SDK's, is the SDK's own. Call sites use the same
``record(value, attributes)`` / ``add(value, attributes)`` either way.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from opentelemetry.metrics import Counter, Histogram, Meter, UpDownCounter
from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import UpDownCounter as SdkUpDownCounter

from gym_obs.telemetry import names
from gym_obs.telemetry.preaggregated import (
    PreAggregatedCounter,
    PreAggregatedHistogram,
    PreAggregatedUpDownCounter,
    PreAggregation,
    attach,
)

__all__ = [
    "AttributeCache",
    "CounterLike",
    "HistogramLike",
    "Instruments",
    "UpDownCounterLike",
    "instruments_for",
]

#: An SDK instrument, or its pre-aggregated twin (same ``record`` / ``add`` call).
HistogramLike = Histogram | PreAggregatedHistogram
CounterLike = Counter | PreAggregatedCounter
UpDownCounterLike = UpDownCounter | PreAggregatedUpDownCounter


def _boundaries(name: str) -> tuple[float, ...]:
    """The registry's bucket boundaries for histogram ``name`` (every gym histogram has them)."""
    found = names.HISTOGRAM_BUCKETS_S.get(name)
    if found is None:
        found = names.GEN_AI_HISTOGRAM_BUCKETS[name]
    return tuple(float(b) for b in found)


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
        "pre",
        "rollout_duration",
        "rollouts",
        "server_request_duration",
    )

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        #: The meter's pre-aggregated instruments (None: not an SDK meter; every instrument is the SDK's).
        self.pre: PreAggregation | None = attach(meter)
        seconds = names.UNIT_SECONDS
        self.client_request_duration = self.histogram(
            names.METRIC_HTTP_CLIENT_REQUEST_DURATION,
            seconds,
            "Duration of each HTTP client request attempt.",
        )
        self.server_request_duration = self.histogram(
            names.METRIC_HTTP_SERVER_REQUEST_DURATION, seconds, "Duration of HTTP server requests."
        )
        self.client_retries = self.counter(
            names.METRIC_CLIENT_RETRIES, names.UNIT_RETRY, "HTTP client retries, by reason."
        )
        self.pool_wait_duration = self.histogram(
            names.METRIC_POOL_WAIT_DURATION, seconds, "Time a request waited for a pooled connection."
        )
        self.pool_pending_requests = self.up_down_counter(
            names.METRIC_POOL_PENDING_REQUESTS,
            names.UNIT_REQUEST,
            "Requests currently waiting for a pooled connection.",
        )
        self.pool_connections = self.up_down_counter(
            names.METRIC_POOL_CONNECTIONS,
            names.UNIT_CONNECTION,
            "Pooled connections, by state (active or idle).",
        )
        self.pool_connects = self.counter(
            names.METRIC_POOL_CONNECTS, names.UNIT_CONNECTION, "Connections opened, by destination and pool."
        )
        self.client_timeouts = self.counter(
            names.METRIC_CLIENT_TIMEOUTS,
            names.UNIT_TIMEOUT,
            "Request attempts that timed out, by destination (internal gym server or external).",
        )
        self.failure_events = self.counter(
            names.METRIC_FAILURE_EVENTS,
            names.UNIT_EVENT,
            "Failure events, counted once where first observed.",
        )
        self.rollout_duration = self.histogram(
            names.METRIC_ROLLOUT_DURATION, seconds, "Duration of one rollout, end to end."
        )
        self.rollouts = self.counter(
            names.METRIC_ROLLOUTS, names.UNIT_ROLLOUT, "Finished rollouts, by outcome."
        )
        # GenAI model calls (issue 15): recorded by the model servers' model-call layer.
        self.gen_ai_server_duration = self.histogram(
            names.METRIC_GEN_AI_SERVER_REQUEST_DURATION,
            seconds,
            "Model call duration on the model server, to the last byte of the reply.",
        )
        self.gen_ai_server_ttft = self.histogram(
            names.METRIC_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
            seconds,
            "Time from the request's arrival to the first content chunk of a streamed reply.",
        )
        self.gen_ai_server_tokens = self.histogram(
            names.METRIC_GEN_AI_SERVER_TOKEN_USAGE,
            names.UNIT_TOKEN,
            "Tokens a model call used, by token type, as the reply reported them.",
        )
        self.gen_ai_server_finishes = self.counter(
            names.METRIC_GEN_AI_SERVER_FINISHES, names.UNIT_FINISH, "Finished generations, by finish reason."
        )
        self.gen_ai_server_unparsable = self.counter(
            names.METRIC_GEN_AI_SERVER_UNPARSABLE,
            names.UNIT_REPLY,
            "Successful model replies whose usage could not be read, counted once, by reason.",
        )
        # The agent's view of its model calls (client/model_calls.py).
        self.gen_ai_client_duration = self.histogram(
            names.METRIC_GEN_AI_CLIENT_OPERATION_DURATION,
            seconds,
            "Model call duration as the caller saw it, from the request to the reply's last byte.",
        )
        self.gen_ai_client_tokens = self.histogram(
            names.METRIC_GEN_AI_CLIENT_TOKEN_USAGE,
            names.UNIT_TOKEN,
            "Tokens a model call used, by token type, as the reply read by the caller reported them.",
        )
        self.gen_ai_client_ttfc = self.histogram(
            names.METRIC_GEN_AI_CLIENT_TIME_TO_FIRST_CHUNK,
            seconds,
            "Time from the request to the first content chunk of a streamed reply, as the caller read it.",
        )
        self.gen_ai_client_unparsable = self.counter(
            names.METRIC_GEN_AI_CLIENT_UNPARSABLE,
            names.UNIT_REPLY,
            "Successful model replies whose usage the caller's side could not read, counted once, by reason.",
        )

    # The factories below are also for instruments other modules keep (one call per meter, at set-up).

    def histogram(self, name: str, unit: str, description: str) -> HistogramLike:
        """Histogram ``name`` with the registry's bucket boundaries: pre-aggregated where it can be."""
        bounds, pre = _boundaries(name), self._pre(name, unit, SdkHistogram)
        if pre is not None:
            return pre.histogram(name, unit, description, bounds)
        return self.meter.create_histogram(
            name, unit=unit, description=description, explicit_bucket_boundaries_advisory=list(bounds)
        )

    def counter(self, name: str, unit: str, description: str) -> CounterLike:
        """Monotonic counter ``name``: pre-aggregated where it can be."""
        pre = self._pre(name, unit, SdkCounter)
        made = pre.counter if pre is not None else self.meter.create_counter
        return made(name, unit, description)

    def up_down_counter(self, name: str, unit: str, description: str) -> UpDownCounterLike:
        """Up-down counter ``name``: pre-aggregated where it can be."""
        pre = self._pre(name, unit, SdkUpDownCounter)
        made = pre.up_down_counter if pre is not None else self.meter.create_up_down_counter
        return made(name, unit, description)

    def _pre(self, name: str, unit: str, kind: type) -> PreAggregation | None:
        """The pre-aggregation to create ``name`` in, or None: the SDK's instrument (no SDK meter, or a
        configured view could select it)."""
        pre = self.pre
        return pre if pre is not None and pre.covers(name, unit, kind) else None


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
