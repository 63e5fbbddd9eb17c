"""Semaphore and process instruments as the real Prometheus exporter names them (what dashboards query)."""

from __future__ import annotations

import asyncio
import time

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gym_obs.client import concurrency
from gym_obs.dashboards import MetricKind, prometheus_label, prometheus_metric_name
from gym_obs.telemetry import names, resources

_SUFFIXES: dict[MetricKind, tuple[str, ...]] = {
    "histogram": ("_bucket", "_sum", "_count"),
    "counter": ("",),
    "updowncounter": ("",),
    "gauge": ("",),
}

SPECS: list[tuple[str, str, MetricKind]] = [
    (names.METRIC_CONCURRENCY_WAIT_DURATION, names.UNIT_SECONDS, "histogram"),
    (names.METRIC_CONCURRENCY_ACTIVE, names.UNIT_PERMIT, "updowncounter"),
    (names.METRIC_CONCURRENCY_LIMIT, names.UNIT_PERMIT, "updowncounter"),
    (names.METRIC_CONCURRENCY_CANCELLED_WAITS, names.UNIT_WAIT, "counter"),
    (names.METRIC_PROCESS_MEMORY_USAGE, names.UNIT_BYTES, "updowncounter"),
    (names.METRIC_PROCESS_CPU_UTILIZATION, names.UNIT_RATIO, "gauge"),
    (names.METRIC_PROCESS_FILE_DESCRIPTORS, names.UNIT_FILE_DESCRIPTOR, "updowncounter"),
    (names.METRIC_PROCESS_THREADS, names.UNIT_THREAD, "updowncounter"),
    (names.METRIC_EVENT_LOOP_LAG, names.UNIT_SECONDS, "histogram"),
]


def test_exported_series_and_labels() -> None:
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    meter = provider.get_meter(names.INSTRUMENTATION_SCOPE)
    site = {names.ATTR_CONCURRENCY_SITE: "prom.test"}
    inst = concurrency._instruments_for(meter)
    inst.wait_duration.record(0.5, site)
    inst.cancelled.add(1, site)
    sem = concurrency.TimedSemaphore(2, site="prom.test")
    gauges = resources._ProcessGauges(meter, gpu=False)
    gauges.lag.record(0.01)
    asyncio.run(sem.acquire())
    time.sleep(0.15)  # CPU utilisation needs a window longer than its minimum (0.1 s) since creation
    text = generate_latest(registry).decode()
    provider.shutdown()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    exported = {s.name for s in samples}
    for name, unit, kind in SPECS:
        for suffix in _SUFFIXES[kind]:
            assert prometheus_metric_name(name, unit, kind) + suffix in exported, (name, suffix)
    active_name = prometheus_metric_name(names.METRIC_CONCURRENCY_ACTIVE, names.UNIT_PERMIT, "updowncounter")
    site_label = prometheus_label(names.ATTR_CONCURRENCY_SITE)
    (active,) = [s for s in samples if s.name == active_name and s.labels.get(site_label) == "prom.test"]
    assert active.value == 1
    memory_types = {
        s.labels.get(prometheus_label(names.ATTR_MEMORY_TYPE))
        for s in samples
        if s.name
        == prometheus_metric_name(names.METRIC_PROCESS_MEMORY_USAGE, names.UNIT_BYTES, "updowncounter")
    }
    assert memory_types == {names.MEMORY_TYPE_RSS, names.MEMORY_TYPE_PSS}
    sem.release()
