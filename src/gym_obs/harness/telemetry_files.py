"""Read back what the processes wrote with the file sink: the summary shows what the telemetry saw.

Each process appends cumulative metric snapshots to its own ``*.metrics.jsonl``; the last complete line of
each file is that process's final state, and the run's totals are the sum over processes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_obs.harness.stats import bucket_quantile
from gym_obs.telemetry import names
from gym_obs.telemetry.file_export import METRICS_SUFFIX, TRACES_SUFFIX

__all__ = [
    "HistogramTotal",
    "MetricTotals",
    "any_value",
    "attributes_of",
    "iter_spans",
    "read_metric_totals",
]

Attrs = tuple[tuple[str, str], ...]


def any_value(value: dict[str, Any]) -> Any:
    """Decode an OTLP/JSON ``AnyValue``."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(item) for item in value["arrayValue"].get("values", ())]
    if "kvlistValue" in value:
        return attributes_of(value["kvlistValue"].get("values", ()))
    return None


def attributes_of(items: Any) -> dict[str, Any]:
    return {item["key"]: any_value(item.get("value", {})) for item in items or ()}


@dataclass
class HistogramTotal:
    """Explicit-bucket histogram summed over processes (bounds are fixed by names.py, so they agree)."""

    bounds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0
    max: float | None = None

    def add(self, point: dict[str, Any]) -> None:
        bounds = [float(b) for b in point.get("explicitBounds", ())]
        counts = [int(c) for c in point.get("bucketCounts", ())]
        if not self.counts:
            self.bounds, self.counts = bounds, [0] * len(counts)
        if bounds == self.bounds and len(counts) == len(self.counts):
            self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]
        self.count += int(point.get("count", 0))
        self.total += float(point.get("sum", 0.0))
        if "max" in point:
            point_max = float(point["max"])
            self.max = point_max if self.max is None else max(self.max, point_max)

    def summary(self) -> dict[str, float | int | None]:
        def q(value: float) -> float | None:
            return bucket_quantile(self.bounds, self.counts, value, high=self.max)

        return {"count": self.count, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": self.max}


@dataclass
class MetricTotals:
    """Final values of every metric stream, summed over the processes whose files were read."""

    sums: dict[tuple[str, Attrs], float] = field(default_factory=dict)
    histograms: dict[tuple[str, Attrs], HistogramTotal] = field(default_factory=dict)
    processes: int = 0

    def sum_by(self, metric: str, key: Callable[[dict[str, str]], str | None]) -> dict[str, float]:
        out: dict[str, float] = {}
        for (name, attrs), value in self.sums.items():
            if name != metric:
                continue
            group = key(dict(attrs))
            if group is not None:
                out[group] = out.get(group, 0.0) + value
        return out

    def histogram_by(
        self, metric: str, key: Callable[[dict[str, str]], str | None]
    ) -> dict[str, HistogramTotal]:
        out: dict[str, HistogramTotal] = {}
        for (name, attrs), hist in self.histograms.items():
            if name != metric:
                continue
            group = key(dict(attrs))
            if group is None:
                continue
            merged = out.setdefault(group, HistogramTotal())
            merged.add(
                {
                    "explicitBounds": hist.bounds,
                    "bucketCounts": hist.counts,
                    "count": hist.count,
                    "sum": hist.total,
                    **({"max": hist.max} if hist.max is not None else {}),
                }
            )
        return out


def _last_document(path: Path) -> dict[str, Any] | None:
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash; the one before it is complete
        if isinstance(doc, dict):
            return doc
    return None


def _attrs_key(point: dict[str, Any]) -> Attrs:
    return tuple(sorted((k, str(v)) for k, v in attributes_of(point.get("attributes")).items()))


def read_metric_totals(directory: str | Path, *, run_id: str | None = None) -> MetricTotals:
    """Sum the final cumulative state of every ``*.metrics.jsonl`` under ``directory``.

    With ``run_id``, only processes of that run (resource ``gym.run.id``) count: an output directory reused
    across runs keeps the older runs' files.
    """
    totals = MetricTotals()
    for path in sorted(Path(directory).glob(f"*{METRICS_SUFFIX}")):
        doc = _last_document(path)
        if doc is None:
            continue
        counted = False
        for resource_metrics in doc.get("resourceMetrics", ()):
            resource = attributes_of(resource_metrics.get("resource", {}).get("attributes"))
            if run_id is not None and resource.get(names.ATTR_RUN_ID) != run_id:
                continue
            counted = True
            for scope_metrics in resource_metrics.get("scopeMetrics", ()):
                for metric in scope_metrics.get("metrics", ()):
                    _add_metric(totals, metric)
        totals.processes += counted
    return totals


def _add_metric(totals: MetricTotals, metric: dict[str, Any]) -> None:
    name = metric.get("name", "")
    if "sum" in metric:
        for point in metric["sum"].get("dataPoints", ()):
            value = float(point.get("asDouble", point.get("asInt", 0)))
            key = (name, _attrs_key(point))
            totals.sums[key] = totals.sums.get(key, 0.0) + value
    elif "histogram" in metric:
        for point in metric["histogram"].get("dataPoints", ()):
            totals.histograms.setdefault((name, _attrs_key(point)), HistogramTotal()).add(point)


def iter_spans(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Every span in ``*.traces.jsonl`` under ``directory``, flattened with its resource attributes."""
    for path in sorted(Path(directory).glob(f"*{TRACES_SUFFIX}")):
        try:
            lines = path.read_bytes().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            for resource_spans in doc.get("resourceSpans", ()):
                resource = attributes_of(resource_spans.get("resource", {}).get("attributes"))
                for scope_spans in resource_spans.get("scopeSpans", ()):
                    for span in scope_spans.get("spans", ()):
                        yield {
                            "resource": resource,
                            "service": resource.get(names.SERVICE_NAME),
                            "name": span.get("name"),
                            "kind": int(span.get("kind", 0)),
                            "trace_id": span.get("traceId", ""),
                            "span_id": span.get("spanId", ""),
                            "parent_span_id": span.get("parentSpanId", ""),
                            "attributes": attributes_of(span.get("attributes")),
                            "events": [
                                {"name": e.get("name"), "attributes": attributes_of(e.get("attributes"))}
                                for e in span.get("events", ())
                            ],
                            "status": span.get("status", {}),
                        }
