"""A stand-in gym process for the PromQL checker test: serves ``/metrics`` with every gym metric.

Uses the real OpenTelemetry SDK and ``opentelemetry-exporter-prometheus`` (so names are translated exactly
as a gym process exports them) with instrument names, units, attributes and buckets from
``gym_obs.telemetry.names``, and keeps recording until terminated so every rate window has increments.
Run: ``python -m tests.e2e._metrics_emitter --port 23101 --service-name gym/agent``.
"""

from __future__ import annotations

import argparse
import itertools
import random
import signal
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import start_http_server

from gym_obs.dashboards import GYM_METRICS
from gym_obs.telemetry import names as n

# Illustrative label values (a small fixed set, like the real vocabularies).
_SERVERS = ("model", "resources", n.EXTERNAL_SERVER_NAME)
_FAILURES = (("upstream_http_error", "model", "agent"), ("timeout", "resources_server", "verification"))
_ROUTES = ("/v1/responses", "/seed_session", "/verify")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service-name", required=True)
    parser.add_argument("--tick", type=float, default=0.05)
    args = parser.parse_args()

    resource = Resource.create({n.SERVICE_NAME: args.service_name, n.ATTR_RUN_ID: "promql-check"})
    provider = MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()])
    meter = provider.get_meter(n.INSTRUMENTATION_SCOPE)
    buckets = n.HISTOGRAM_BUCKETS_S

    def histogram(name: str) -> Histogram:
        return meter.create_histogram(
            name, unit=n.UNIT_SECONDS, explicit_bucket_boundaries_advisory=list(buckets[name])
        )

    client_duration = histogram(n.METRIC_HTTP_CLIENT_REQUEST_DURATION)
    server_duration = histogram(n.METRIC_HTTP_SERVER_REQUEST_DURATION)
    pool_wait = histogram(n.METRIC_POOL_WAIT_DURATION)
    rollout_duration = histogram(n.METRIC_ROLLOUT_DURATION)
    retries = meter.create_counter(n.METRIC_CLIENT_RETRIES, unit=n.UNIT_RETRY)
    failures = meter.create_counter(n.METRIC_FAILURE_EVENTS, unit=n.UNIT_EVENT)
    rollouts = meter.create_counter(n.METRIC_ROLLOUTS, unit=n.UNIT_ROLLOUT)
    pending = meter.create_up_down_counter(n.METRIC_POOL_PENDING_REQUESTS, unit=n.UNIT_REQUEST)
    connections = meter.create_up_down_counter(n.METRIC_POOL_CONNECTIONS, unit=n.UNIT_CONNECTION)

    for pool in n.POOLS:
        for state, count in ((n.CONNECTION_STATE_ACTIVE, 3), (n.CONNECTION_STATE_IDLE, 5)):
            connections.add(count, {n.ATTR_POOL: pool, n.ATTR_HTTP_CONNECTION_STATE: state})
    # Every other instrument of the registry (model calls, process and process-tree gauges, startup...),
    # recorded as its kind with the unit and buckets a gym process uses, so every panel has data.
    handwritten = {
        n.METRIC_HTTP_CLIENT_REQUEST_DURATION, n.METRIC_HTTP_SERVER_REQUEST_DURATION,
        n.METRIC_POOL_WAIT_DURATION, n.METRIC_ROLLOUT_DURATION, n.METRIC_CLIENT_RETRIES,
        n.METRIC_FAILURE_EVENTS, n.METRIC_ROLLOUTS, n.METRIC_POOL_PENDING_REQUESTS, n.METRIC_POOL_CONNECTIONS,
    }  # fmt: skip
    recorders = [
        _recorder(meter, spec.name, spec.unit, spec.kind, buckets.get(spec.name))
        for spec in GYM_METRICS
        if spec.name not in handwritten
    ]

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    start_http_server(args.port, addr="127.0.0.1")
    rng = random.Random(args.port)

    for tick in itertools.count():
        if stop.wait(args.tick):
            break
        for server in _SERVERS:
            status = 500 if tick % 7 == 0 else 200
            client_duration.record(
                rng.uniform(0.005, 0.8),
                {
                    n.ATTR_SERVER_NAME: server,
                    n.ATTR_HTTP_REQUEST_METHOD: "POST",
                    n.ATTR_HTTP_RESPONSE_STATUS_CODE: status,
                },
            )
            retries.add(
                1,
                {
                    n.ATTR_SERVER_NAME: server,
                    n.ATTR_RETRY_REASON: n.RETRY_REASONS[tick % len(n.RETRY_REASONS)],
                },
            )
            for pool in n.POOLS:
                outcome = n.POOL_OUTCOME_ABANDONED if tick % 11 == 0 else n.POOL_OUTCOME_OK
                pool_wait.record(
                    rng.uniform(0.0001, 0.2),
                    {n.ATTR_SERVER_NAME: server, n.ATTR_POOL: pool, n.ATTR_POOL_OUTCOME: outcome},
                )
                attributes = {n.ATTR_SERVER_NAME: server, n.ATTR_POOL: pool}
                pending.add(1 if tick % 2 == 0 else -1, attributes)
        for route in _ROUTES:
            status = 500 if tick % 5 == 0 else 200
            server_duration.record(
                rng.uniform(0.001, 0.5),
                {
                    n.ATTR_HTTP_ROUTE: route,
                    n.ATTR_HTTP_REQUEST_METHOD: "POST",
                    n.ATTR_HTTP_RESPONSE_STATUS_CODE: status,
                },
            )
        outcome = n.ROLLOUT_OUTCOME_FAILED if tick % 4 == 0 else n.ROLLOUT_OUTCOME_COMPLETED
        rollouts.add(1, {n.ATTR_ROLLOUT_OUTCOME: outcome})
        rollout_duration.record(rng.uniform(0.05, 20.0), {n.ATTR_ROLLOUT_OUTCOME: outcome})
        for record in recorders:
            record(rng)
        kind, boundary, stage = _FAILURES[tick % len(_FAILURES)]
        failures.add(
            1, {n.ATTR_FAILURE_KIND: kind, n.ATTR_FAILURE_BOUNDARY: boundary, n.ATTR_FAILURE_STAGE: stage}
        )
    provider.shutdown()


# Label values the generic panels filter or group on: one fixed, realistic set for every instrument.
_GENERIC_ATTRIBUTES = (
    {n.ATTR_MEMORY_TYPE: n.MEMORY_TYPE_RSS},
    {n.ATTR_MEMORY_TYPE: "pss"},
)


def _recorder(meter: Any, name: str, unit: str, kind: str, bounds: Any) -> Callable[[random.Random], None]:
    """A function recording one plausible value of instrument ``name`` per call."""
    if kind == "histogram":
        advisory = {"explicit_bucket_boundaries_advisory": list(bounds)} if bounds else {}
        instrument = meter.create_histogram(name, unit=unit, **advisory)
        write = instrument.record
    elif kind == "counter":
        write = meter.create_counter(name, unit=unit).add
    elif kind == "gauge":
        write = meter.create_gauge(name, unit=unit).set
    else:
        write = meter.create_up_down_counter(name, unit=unit).add

    def record(rng: random.Random) -> None:
        for attributes in _GENERIC_ATTRIBUTES:
            write(rng.uniform(0.01, 0.9) if kind in ("histogram", "gauge") else 1, attributes)

    return record


if __name__ == "__main__":
    main()
