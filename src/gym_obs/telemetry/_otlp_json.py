"""OTLP/JSON lines built directly from the SDK's span and metric objects, for the file sink.

Why: the official path (SDK objects -> protobuf messages -> ``MessageToDict`` -> JSON, then hex ids patched
in) costs 70-130 µs per span on the batch processor's thread, which a saturated process pays out of its
request budget. Here each SDK object becomes the dict ``MessageToDict(..., use_integers_for_enums=True)``
would have produced for it -- the collector file exporter's format: lowerCamelCase keys in field-number
order, hex trace/span ids, 64-bit integers as strings, enums as integers, non-finite doubles as ``"NaN"`` /
``"Infinity"``, default values left out -- and one ``orjson.dumps`` writes the line.

It mirrors ``opentelemetry-exporter-otlp-proto-common``'s encoders field by field (spans grouped by resource
then scope; an attribute whose value cannot be encoded is skipped); ``tests/unit/test_otlp_json.py`` holds
it to the official encoder's output. Any other failure raises, and the caller falls back to that encoder.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar

import orjson
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    Gauge,
    Histogram,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind

__all__ = [
    "KIND",
    "FragmentCache",
    "Unencodable",
    "bounded_items",
    "group_spans",
    "metrics_json_line",
    "plain_attributes",
    "span_attributes",
    "span_events",
    "span_links",
    "spans_json_line",
]

Json = dict[str, Any]
_T = TypeVar("_T")
_CACHED_STR_CHARS: Final = 256  # longer strings are hardly ever repeated: not worth a cache entry

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_INF: Final = float("inf")
KIND: Final = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
# SpanFlags: the parent's (or a link's) is_remote is known; plus "is remote" when it is.
_FLAGS_LOCAL: Final = 0x100
_FLAGS_REMOTE: Final = 0x300


class Unencodable(ValueError):
    """A value the official OTLP encoders would refuse (its attribute is skipped, as they skip it)."""


def _double(value: float) -> float | str:
    """A double as proto3 JSON writes it: a number, or ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"``."""
    value = float(value)
    if -_INF < value < _INF:
        return value
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _int64(value: int) -> str:
    if _I64_MIN <= value <= _I64_MAX:
        return str(value)
    raise Unencodable(f"{value} does not fit an int64")


def _any_value(value: object) -> Json:
    """An ``AnyValue``: the fast exact-type checks first, then the SDK encoder's isinstance order."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        return {"intValue": _int64(value)}  # type: ignore[arg-type]
    if kind is float:
        return {"doubleValue": _double(value)}  # type: ignore[arg-type]
    return _any_value_slow(value)


def _any_value_slow(value: object) -> Json:
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": bool(value)}
    if isinstance(value, str):
        return {"stringValue": str(value)}
    if isinstance(value, int):
        return {"intValue": _int64(int(value))}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        values = [_any_value(item) for item in value]
        return {"arrayValue": {"values": values} if values else {}}
    if isinstance(value, Mapping):
        pairs = [_key_value(str(key), item) for key, item in value.items()]
        return {"kvlistValue": {"values": pairs} if pairs else {}}
    raise Unencodable(f"invalid type {type(value).__name__}")


def _key_value(key: str, value: object) -> Json:
    return {"key": key, "value": _any_value(value)} if key else {"value": _any_value(value)}


def plain_attributes(attributes: object) -> Mapping[str, object] | None:
    """The SDK's ``BoundedAttributes`` keeps a plain dict: iterating it directly skips a Python-level
    ``__getitem__`` (and ``__iter__``) per attribute, which was the largest part of a span's cost. Anything
    else is used as it is."""
    inner = getattr(attributes, "_dict", None)
    if isinstance(inner, dict):
        return inner
    return attributes if isinstance(attributes, Mapping) else None


def span_attributes(span: ReadableSpan) -> Mapping[str, object] | None:
    """A span's attributes without the read-only proxy ``ReadableSpan.attributes`` wraps them in."""
    raw = getattr(span, "_attributes", None)
    return plain_attributes(raw) if raw is not None else plain_attributes(span.attributes)


class FragmentCache(Generic[_T]):
    """Encoded ``KeyValue``s (``encode(key, value)``: a dict, JSON text, protobuf bytes) of the short string
    and the integer attributes seen before (``http.request.method`` = ``POST``, ``server.port`` = 8000):
    most spans repeat the same few pairs, and one dict lookup is cheaper than encoding again. Exact types
    only (``True`` must not find the entry of ``1``). Bounded: cleared when full (unique values -- ids,
    URLs -- churn through it); kept across batches (a race of two exporting threads costs at most a
    repeated encoding). An attribute ``encode`` finds :class:`Unencodable` is skipped."""

    __slots__ = ("_encode", "_items", "_max")

    def __init__(self, encode: Callable[[str, object], _T], max_entries: int = 4096) -> None:
        self._encode = encode
        self._items: dict[tuple[str, object], _T] = {}
        self._max = max_entries

    def encode(self, attributes: Mapping[str, object]) -> list[_T]:
        out: list[_T] = []
        items, encode = self._items, self._encode
        for pair in attributes.items():
            value = pair[1]
            kind = type(value)
            if kind is str or kind is int:
                item = items.get(pair)
                if item is None:
                    try:
                        item = encode(pair[0], value)
                    except Unencodable:
                        continue
                    if kind is int or len(value) <= _CACHED_STR_CHARS:  # type: ignore[arg-type]
                        if len(items) >= self._max:
                            items.clear()
                        items[pair] = item
            else:
                try:
                    item = encode(pair[0], value)
                except Unencodable:
                    continue
            out.append(item)
        return out


def _attributes(attributes: object, pairs: FragmentCache[Json] | None = None) -> list[Json]:
    """``KeyValue`` list; an attribute the OTLP encoders would reject is skipped, as they skip it."""
    plain = plain_attributes(attributes)
    if not plain:
        return []
    return (pairs or FragmentCache(_key_value)).encode(plain)


def _resource(resource: Resource) -> Json:
    attributes = _attributes(resource.attributes)
    return {"attributes": attributes} if attributes else {}


def _scope(scope: InstrumentationScope | None) -> Json:
    if scope is None:
        return {}
    out: Json = {}
    if scope.name:
        out["name"] = scope.name
    if scope.version:
        out["version"] = scope.version
    attributes = _attributes(scope.attributes)
    if attributes:
        out["attributes"] = attributes
    return out


# -- spans ---------------------------------------------------------------------------------------------------


def _status(span: ReadableSpan) -> Json:
    status = span.status
    out: Json = {}
    if status.description:
        out["message"] = status.description
    code = status.status_code.value
    if code:
        out["code"] = code
    return out


def _events(events: Sequence[Event], pairs: FragmentCache[Json]) -> list[Json]:
    out: list[Json] = []
    for event in events:
        item: Json = {}
        if event.timestamp:
            item["timeUnixNano"] = str(event.timestamp)
        if event.name:
            item["name"] = event.name
        attributes = _attributes(event.attributes, pairs)
        if attributes:
            item["attributes"] = attributes
        if event.dropped_attributes:
            item["droppedAttributesCount"] = event.dropped_attributes
        out.append(item)
    return out


def _links(links: Sequence[Link], pairs: FragmentCache[Json]) -> list[Json]:
    out: list[Json] = []
    for link in links:
        context = link.context
        item: Json = {"traceId": format(context.trace_id, "032x"), "spanId": format(context.span_id, "016x")}
        attributes = _attributes(link.attributes, pairs)
        if attributes:
            item["attributes"] = attributes
        if link.dropped_attributes:
            item["droppedAttributesCount"] = link.dropped_attributes
        item["flags"] = _FLAGS_REMOTE if context.is_remote else _FLAGS_LOCAL
        out.append(item)
    return out


def span_events(span: ReadableSpan) -> tuple[Sequence[Event], int]:
    """A span's events and their dropped count (see :func:`bounded_items`)."""
    return bounded_items(getattr(span, "_events", None), lambda: (span.events, span.dropped_events))


def span_links(span: ReadableSpan) -> tuple[Sequence[Link], int]:
    """A span's links and their dropped count (see :func:`bounded_items`)."""
    return bounded_items(getattr(span, "_links", None), lambda: (span.links, span.dropped_links))


def bounded_items(
    raw: object, public: Callable[[], tuple[Sequence[Any], int]]
) -> tuple[Sequence[Any], int]:
    """A span's events or links and their dropped count, read from the SDK's ``BoundedList`` itself (or
    the plain sequence a hand-built span holds): the public properties copy the list under a lock on
    every access, so ``public`` is called only for anything else."""
    if isinstance(raw, BoundedList):
        items = getattr(raw, "_dq", None)  # its deque; absent in another SDK version: the public copy
        if items is not None:
            return items, raw.dropped
    elif isinstance(raw, tuple | list):
        return raw, 0
    return public()


SpanGroups = dict[Resource, dict[InstrumentationScope | None, list[_T]]]


def group_spans(spans: Sequence[ReadableSpan], encode: Callable[[ReadableSpan], _T]) -> SpanGroups[_T]:
    """Resource -> scope -> encoded spans, in first-seen order, as the official encoder groups them.
    Grouped by identity first: hashing a ``Resource`` serialises its attributes (and a scope's hash is
    Python code), so equal objects are merged once per distinct object, not once per span."""
    by_id: dict[tuple[int, int], tuple[Resource, InstrumentationScope | None, list[_T]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        entry = by_id.get((id(resource), id(scope)))
        if entry is None:
            entry = by_id[(id(resource), id(scope))] = (resource, scope, [])
        entry[2].append(encode(span))
    merged: SpanGroups[_T] = {}
    for resource, scope, encoded in by_id.values():
        merged.setdefault(resource, {}).setdefault(scope, []).extend(encoded)
    return merged


def _text(value: object) -> str:
    """A JSON value as text (orjson: a string that is not UTF-8 raises, and the caller falls back)."""
    return orjson.dumps(value).decode()


class _SpanWriter:
    """Writes each span's JSON object as text from cached fragments, instead of building a tree of dicts
    for one ``orjson.dumps``: a batch's dicts all live until the dump, and the garbage collector walked
    them again and again (in a saturated server that was most of the file sink's cost). The fragments are
    what ``orjson.dumps`` writes for the same dicts."""

    __slots__ = ("_names", "_pairs", "_tree_pairs")

    def __init__(self) -> None:
        self._pairs = FragmentCache(lambda key, value: _text(_key_value(key, value)))
        self._names: dict[str, str] = {}
        self._tree_pairs = FragmentCache(_key_value)  # for events and links (few): dicts, dumped per span

    def _name(self, name: str) -> str:
        text = self._names.get(name)
        if text is None:
            if len(self._names) >= 1024:
                self._names.clear()
            text = self._names[name] = _text(name)
        return text

    def span(self, span: ReadableSpan) -> str:
        context = span.context
        assert context is not None  # a finished SDK span always has one
        out = [f'{{"traceId":"{context.trace_id:032x}","spanId":"{context.span_id:016x}"']
        trace_state = context.trace_state
        if trace_state:
            state = ",".join(f"{key}={value}" for key, value in trace_state.items())
            out.append(',"traceState":' + _text(state))
        parent = span.parent
        if parent is not None:
            out.append(f',"parentSpanId":"{parent.span_id:016x}"')
        if span.name:
            out.append(',"name":' + self._name(span.name))
        out.append(f',"kind":{KIND[span.kind]}')
        if span.start_time:
            out.append(f',"startTimeUnixNano":"{span.start_time}"')
        if span.end_time:
            out.append(f',"endTimeUnixNano":"{span.end_time}"')
        attributes = span_attributes(span)
        encoded = ",".join(self._pairs.encode(attributes)) if attributes else ""
        if encoded:
            out.append(',"attributes":[' + encoded + "]")
        raw_attributes = getattr(span, "_attributes", None)
        dropped = raw_attributes.dropped if isinstance(raw_attributes, BoundedAttributes) else 0
        if dropped:
            out.append(f',"droppedAttributesCount":{dropped}')
        events, dropped = span_events(span)
        if events:
            out.append(',"events":' + _text(_events(events, self._tree_pairs)))
        if dropped:
            out.append(f',"droppedEventsCount":{dropped}')
        links, dropped = span_links(span)
        if links:
            out.append(',"links":' + _text(_links(links, self._tree_pairs)))
        if dropped:
            out.append(f',"droppedLinksCount":{dropped}')
        status = span.status
        if status.description or status.status_code.value:
            out.append(',"status":' + _text(_status(span)))
        else:
            out.append(',"status":{}')
        out.append(f',"flags":{_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL}}}')
        return "".join(out)


def spans_json_line(spans: Sequence[ReadableSpan]) -> bytes:
    """One ``ExportTraceServiceRequest`` as an OTLP/JSON line (newline included)."""
    resource_spans: list[str] = []
    for resource, scopes in group_spans(spans, _SpanWriter().span).items():
        scope_spans: list[str] = []
        for scope, encoded in scopes.items():
            url = scope.schema_url if scope is not None else ""
            schema = f',"schemaUrl":{_text(url)}' if url else ""
            scope_spans.append(f'{{"scope":{_text(_scope(scope))},"spans":[{",".join(encoded)}]{schema}}}')
        schema = f',"schemaUrl":{_text(resource.schema_url)}' if resource.schema_url else ""
        resource_spans.append(
            f'{{"resource":{_text(_resource(resource))},"scopeSpans":[{",".join(scope_spans)}]{schema}}}'
        )
    if not resource_spans:
        return b"{}\n"
    return f'{{"resourceSpans":[{",".join(resource_spans)}]}}\n'.encode()


# -- metrics -------------------------------------------------------------------------------------------------


def _exemplars(exemplars: Sequence[Any]) -> list[Json]:
    out: list[Json] = []
    for exemplar in exemplars:
        item: Json = {}
        if exemplar.time_unix_nano:
            item["timeUnixNano"] = str(exemplar.time_unix_nano)
        value = exemplar.value
        if isinstance(value, float):
            item["asDouble"] = _double(value)
        elif not isinstance(value, int):
            raise ValueError("Exemplar value must be an int or float")
        if exemplar.span_id is not None and exemplar.trace_id is not None:
            item["spanId"] = format(exemplar.span_id, "016x")
            item["traceId"] = format(exemplar.trace_id, "032x")
        if not isinstance(value, float):
            item["asInt"] = _int64(int(value))
        attributes = _attributes(exemplar.filtered_attributes)
        if attributes:
            item["filteredAttributes"] = attributes
        out.append(item)
    return out


def _number_point(point: Any, with_start: bool) -> Json:
    out: Json = {}
    if with_start and point.start_time_unix_nano:
        out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    if point.time_unix_nano:
        out["timeUnixNano"] = str(point.time_unix_nano)
    value = point.value
    is_int = isinstance(value, int)
    if not is_int:
        out["asDouble"] = _double(value)
    exemplars = _exemplars(point.exemplars)
    if exemplars:
        out["exemplars"] = exemplars
    if is_int:
        out["asInt"] = _int64(int(value))
    attributes = _attributes(point.attributes)
    if attributes:
        out["attributes"] = attributes
    return out


def _histogram_point(point: Any) -> Json:
    out: Json = {}
    if point.start_time_unix_nano:
        out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    if point.time_unix_nano:
        out["timeUnixNano"] = str(point.time_unix_nano)
    if point.count:
        out["count"] = str(point.count)
    if point.sum is not None:
        out["sum"] = _double(point.sum)
    if point.bucket_counts:
        out["bucketCounts"] = [str(count) for count in point.bucket_counts]
    if point.explicit_bounds:
        out["explicitBounds"] = [_double(bound) for bound in point.explicit_bounds]
    exemplars = _exemplars(point.exemplars)
    if exemplars:
        out["exemplars"] = exemplars
    attributes = _attributes(point.attributes)
    if attributes:
        out["attributes"] = attributes
    if point.min is not None:
        out["min"] = _double(point.min)
    if point.max is not None:
        out["max"] = _double(point.max)
    return out


def _buckets(buckets: Any) -> Json | None:
    if not buckets.bucket_counts:
        return None
    out: Json = {}
    if buckets.offset:
        out["offset"] = buckets.offset
    out["bucketCounts"] = [str(count) for count in buckets.bucket_counts]
    return out


def _exponential_point(point: Any) -> Json:
    out: Json = {}
    attributes = _attributes(point.attributes)
    if attributes:
        out["attributes"] = attributes
    if point.start_time_unix_nano:
        out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    if point.time_unix_nano:
        out["timeUnixNano"] = str(point.time_unix_nano)
    if point.count:
        out["count"] = str(point.count)
    if point.sum is not None:
        out["sum"] = _double(point.sum)
    if point.scale:
        out["scale"] = point.scale
    if point.zero_count:
        out["zeroCount"] = str(point.zero_count)
    for key, buckets in (("positive", point.positive), ("negative", point.negative)):
        encoded = _buckets(buckets)
        if encoded is not None:
            out[key] = encoded
    if point.flags:
        out["flags"] = point.flags
    exemplars = _exemplars(point.exemplars)
    if exemplars:
        out["exemplars"] = exemplars
    if point.min is not None:
        out["min"] = _double(point.min)
    if point.max is not None:
        out["max"] = _double(point.max)
    return out


def _temporal(points: list[Json], temporality: Any) -> Json:
    out: Json = {"dataPoints": points}
    if temporality.value:
        out["aggregationTemporality"] = temporality.value
    return out


def _metric(metric: Any) -> Json:
    out: Json = {}
    if metric.name:
        out["name"] = metric.name
    if metric.description:
        out["description"] = metric.description
    if metric.unit:
        out["unit"] = metric.unit
    data = metric.data
    if not getattr(data, "data_points", None):  # no points (or a type the OTLP encoders do not know)
        return out
    if isinstance(data, Gauge):
        out["gauge"] = {"dataPoints": [_number_point(point, False) for point in data.data_points]}
    elif isinstance(data, Histogram):
        points = [_histogram_point(point) for point in data.data_points]
        out["histogram"] = _temporal(points, data.aggregation_temporality)
    elif isinstance(data, Sum):
        encoded = _temporal(
            [_number_point(point, True) for point in data.data_points], data.aggregation_temporality
        )
        if data.is_monotonic:
            encoded["isMonotonic"] = True
        out["sum"] = encoded
    elif isinstance(data, ExponentialHistogram):
        points = [_exponential_point(point) for point in data.data_points]
        out["exponentialHistogram"] = _temporal(points, data.aggregation_temporality)
    return out


def metrics_json_line(data: MetricsData) -> bytes:
    """One ``ExportMetricsServiceRequest`` as an OTLP/JSON line (newline included)."""
    # Keyed like the official encoder: a repeated resource (or scope) replaces the earlier one's entries.
    by_resource: dict[Resource, dict[InstrumentationScope, Json]] = {}
    for resource_metrics in data.resource_metrics:
        scopes: dict[InstrumentationScope, Json] = {}
        by_resource[resource_metrics.resource] = scopes
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope
            item: Json = {"scope": _scope(scope)}
            metrics = [_metric(metric) for metric in scope_metrics.metrics]
            if metrics:
                item["metrics"] = metrics
            if scope.schema_url:
                item["schemaUrl"] = scope.schema_url
            scopes[scope] = item
    resource_metrics_out: list[Json] = []
    for resource, scope_items in by_resource.items():
        entry: Json = {"resource": _resource(resource)}
        if scope_items:
            entry["scopeMetrics"] = list(scope_items.values())
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_metrics_out.append(entry)
    doc: Json = {"resourceMetrics": resource_metrics_out} if resource_metrics_out else {}
    return orjson.dumps(doc) + b"\n"
