"""The OpenTelemetry -> Prometheus name mapping the dashboards use, checked against the real exporter.

If ``prometheus_metric_name`` and opentelemetry-exporter-prometheus ever disagree, every panel built on
the mapping would silently show "No data"; here the exporter is the oracle.
"""

from __future__ import annotations

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gym_obs import dashboards
from gym_obs.dashboards import GYM_METRICS, MetricKind, prometheus_label, prometheus_metric_name
from gym_obs.telemetry import names
from gym_obs.telemetry.metrics import instruments_for

_SUFFIXES = {
    "histogram": ("_bucket", "_sum", "_count"),
    "counter": ("",),
    "updowncounter": ("",),
    "gauge": ("",),
}
_ATTRIBUTES = {names.ATTR_SERVER_NAME: "model", names.ATTR_HTTP_RESPONSE_STATUS_CODE: 200}


def _exported_series(cases: list[tuple[str, str, MetricKind]]) -> dict[tuple[str, str, MetricKind], set[str]]:
    """Record one value per instrument (each alone in a fresh registry) and collect the sample names."""
    exported = {}
    for name, unit, kind in cases:
        registry = CollectorRegistry()
        provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
        meter = provider.get_meter(names.INSTRUMENTATION_SCOPE)
        if kind == "histogram":
            meter.create_histogram(name, unit=unit).record(0.25, _ATTRIBUTES)
        elif kind == "counter":
            meter.create_counter(name, unit=unit).add(2, _ATTRIBUTES)
        elif kind == "updowncounter":
            meter.create_up_down_counter(name, unit=unit).add(-1, _ATTRIBUTES)
        else:
            meter.create_gauge(name, unit=unit).set(3, _ATTRIBUTES)
        text = generate_latest(registry).decode()
        provider.shutdown()
        samples = {
            sample.name
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if family.name != "target_info"
        }
        exported[(name, unit, kind)] = samples
    return exported


_EXTRA_CASES: list[tuple[str, str, MetricKind]] = [
    ("gym.example.latency", "ms", "histogram"),
    ("gym.example.payload", "By", "updowncounter"),
    ("gym.example.ratio", "1", "gauge"),
    ("gym.example.duration.seconds", "s", "histogram"),  # unit word already present: not doubled
    ("gym.example.requests.total", "{request}", "counter"),  # _total already present: not doubled
    ("gym.example.speed", "m/s", "gauge"),
    ("gym.example-dashed.count", "{thing}", "counter"),
]


def test_mapping_matches_the_prometheus_exporter_for_every_gym_metric_and_edge_case() -> None:
    cases = [(spec.name, spec.unit, spec.kind) for spec in GYM_METRICS] + _EXTRA_CASES
    for (name, unit, kind), samples in _exported_series(cases).items():
        expected = {prometheus_metric_name(name, unit, kind) + suffix for suffix in _SUFFIXES[kind]}
        assert samples == expected, (name, unit, kind)


def test_gym_metric_names_as_exported() -> None:
    assert (
        dashboards.CLIENT_REQUEST_DURATION.series("_bucket") == "http_client_request_duration_seconds_bucket"
    )
    assert dashboards.CLIENT_RETRIES.series() == "gym_client_retries_total"
    assert dashboards.POOL_PENDING_REQUESTS.series() == "gym_client_pool_pending_requests"
    assert dashboards.POOL_CONNECTIONS.series() == "gym_client_pool_connections"
    assert dashboards.FAILURE_EVENTS.series() == "gym_failure_events_total"


def test_gym_metrics_covers_every_metric_name_in_the_registry() -> None:
    registry = {value for key, value in vars(names).items() if key.startswith("METRIC_")}
    assert {spec.name for spec in GYM_METRICS} == registry


def test_labels_follow_the_exporter() -> None:
    assert prometheus_label(names.ATTR_SERVER_NAME) == "gym_server_name"
    assert prometheus_label(names.ATTR_HTTP_RESPONSE_STATUS_CODE) == "http_response_status_code"
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    attributes = {
        names.ATTR_RETRY_REASON: "timeout",
        names.ATTR_HTTP_CONNECTION_STATE: "idle",
        names.ATTR_FAILURE_STAGE: "seed",
    }
    provider.get_meter("t").create_counter(names.METRIC_CLIENT_RETRIES).add(1, attributes)
    (sample,) = [
        sample
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if family.name != "target_info"
    ]
    provider.shutdown()
    assert {prometheus_label(key) for key in attributes} <= set(sample.labels)


def test_instruments_export_the_names_the_dashboards_query() -> None:
    """The real instruments (telemetry.metrics) against the specs' names and kinds."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    instruments = instruments_for(provider.get_meter(names.INSTRUMENTATION_SCOPE))
    for attribute in (
        "client_request_duration",
        "client_retries",
        "pool_wait_duration",
        "pool_pending_requests",
        "pool_connections",
        "pool_connects",
        "client_timeouts",
        "failure_events",
        "rollout_duration",
        "rollouts",
        "gen_ai_server_duration",
        "gen_ai_server_ttft",
        "gen_ai_server_tokens",
        "gen_ai_server_finishes",
        "gen_ai_server_unparsable",
        "gen_ai_client_duration",
        "gen_ai_client_tokens",
        "gen_ai_client_ttfc",
        "gen_ai_client_unparsable",
    ):
        instrument = getattr(instruments, attribute)
        if hasattr(instrument, "record"):
            instrument.record(0.5, _ATTRIBUTES)
        elif hasattr(instrument, "add"):
            instrument.add(1, _ATTRIBUTES)
    text = generate_latest(registry).decode()
    provider.shutdown()
    exported = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    for spec in GYM_METRICS:
        if spec.name == names.METRIC_HTTP_SERVER_REQUEST_DURATION:
            continue  # recorded by the FastAPI instrumentation, not by gym instruments
        if spec.name == names.METRIC_POOL_CONNECTIONS and spec.series() not in exported:
            continue  # may be an observable gauge whose callback has no pools to report here
        if spec.name.startswith(("gym.concurrency.", "process.", "gym.process.", "hw.gpu.")):
            continue  # TimedSemaphore and process gauges: tests/unit/test_resources_prometheus.py
        if spec.name.startswith(("gym.server.startup.", "gym.server.process_tree.")):
            continue  # the launcher's startup histogram and tree gauges: tests/unit/test_process_tree.py
        for suffix in _SUFFIXES[spec.kind]:
            assert spec.series(suffix) in exported, spec
