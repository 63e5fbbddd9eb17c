"""Pre-aggregated instruments: histograms and sums kept in-process, read by the SDK's readers.

Why: the SDK's ``Histogram.record`` / ``Counter.add`` cost several microseconds per point (a measurement
object, the attributes hashed into a frozenset once per reader, a lock per storage, the exemplar filter and
reservoir); every HTTP hop records one or two points and a model call four to six. These instruments keep
one small state per attribute set (bucket counts, sum, min, max) and cost a dict lookup, a bisect, a lock
and, when the point is eligible, an exemplar slot per measurement. A caller that records several
points under one span to fixed label combinations binds them once (:meth:`_Instrument.bind`) and decides
the exemplar once (:meth:`PreAggregation.exemplar`).

What they keep of the SDK path:

- the registry's explicit bucket boundaries (upper-inclusive, as Prometheus' ``le``);
- every reader of the meter provider (the periodic OTLP/file reader, the Prometheus pull reader, the
  in-memory reader of tests) gets them as ordinary SDK metric data, next to the SDK's own metrics, under the
  same resource and instrumentation scope, cumulative or delta as that reader prefers per instrument kind;
- exemplars: the provider's exemplar filter decides which measurements are eligible
  (:func:`gym_obs.telemetry._exemplars.exemplar_sampler`); a histogram keeps the last eligible measurement
  per bucket, as the SDK's aligned reservoir does, a sum the last one per series (the SDK's keeps a random
  one), and each reader gets those made since its own previous collection, as from the SDK's;
- views: none apply to a pre-aggregated instrument, so one that a configured view could select is not
  pre-aggregated at all (:meth:`PreAggregation.covers`; the caller creates the SDK's instrument).

A delta reader's sum is the difference of two running sums (equal to the SDK's up to rounding), and the
window's min and max are shared by delta readers: gym_obs has one periodic reader (``_fanout``).

Attribute dicts should come from a :class:`gym_obs.telemetry.metrics.AttributeCache` (one shared dict per
label combination): series are found by the dict's identity first and by its contents otherwise, so fresh
dicts work too, only slower.

:func:`attach` installs them on an SDK meter by wrapping each reader's collect callback (``_collect``, the
one SDK-internal hook used); a meter that is not the SDK's gets None and callers use SDK instruments.
"""

from __future__ import annotations

import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, ClassVar, Final, TypeVar

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Exemplar as SdkExemplar
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import UpDownCounter as SdkUpDownCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.trace import SpanContext
from opentelemetry.util.types import Attributes

from gym_obs.telemetry._exemplars import (
    SPAN_KEY,
    ExemplarSampler,
    current_context,
    exemplar_sampler,
    span_answer,
)

__all__ = [
    "Measurement",
    "PreAggregatedCounter",
    "PreAggregatedHistogram",
    "PreAggregatedUpDownCounter",
    "PreAggregation",
    "attach",
    "bound_series",
]

#: Attribute-dict identities remembered per instrument before the map is rebuilt (series themselves stay).
_MAX_IDENTITIES: Final = 4096
#: Distinct attribute sets per instrument; beyond this a measurement is dropped (labels must be bounded).
MAX_SERIES: Final = 2048

_INF: Final = float("inf")
_LOWEST: Final = -sys.float_info.max
_time_ns: Final = time.time_ns
_CUMULATIVE: Final = AggregationTemporality.CUMULATIVE
_DELTA: Final = AggregationTemporality.DELTA

#: An exemplar decision: the span context the exemplar points to and the measurement's time in ns.
Exemplar = tuple[SpanContext, int]
#: One kept exemplar: (value, its decision, the collection generation it was made in).
_Kept = tuple[float, Exemplar, int]


class _Series:
    """One attribute set's running totals (and, for delta readers, the window since the last export).

    A histogram's series has its instrument's ``boundaries`` (and ``search``, the same as its bucket search
    compares them); a sum's has None and a ``floor`` (the smallest value it takes), so
    :meth:`PreAggregation.add_all` adds to either without asking the instrument.
    """

    __slots__ = (
        "attributes",
        "boundaries",
        "count",
        "counts",
        "floor",
        "kept",
        "max",
        "min",
        "search",
        "start_ns",
        "sum",
        "window_max",
        "window_min",
    )

    def __init__(
        self, attributes: Mapping[str, Any] | None, boundaries: tuple[float, ...] | None, floor: float
    ) -> None:
        self.attributes = dict(attributes) if attributes else {}
        self.boundaries = boundaries
        self.search = _search_keys(boundaries)
        self.floor = floor
        self.counts = [0] * (len(boundaries) + 1 if boundaries is not None else 0)
        self.count = 0
        self.sum: float = 0
        self.min = _INF
        self.max = -_INF
        self.window_min = _INF
        self.window_max = -_INF
        self.start_ns = time.time_ns()
        self.kept: list[_Kept | None] | None = None  # exemplar slots, made for the first exemplar


def _search_keys(boundaries: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """``boundaries`` as the bucket search compares them: as ints when every one is a whole number (a token
    count, an int, then compares int to int, a third cheaper than int to float; the same order, so the same
    bucket), else as they are."""
    if boundaries is not None and all(bound.is_integer() for bound in boundaries):
        return tuple(int(bound) for bound in boundaries)
    return boundaries


#: A measurement for :meth:`PreAggregation.add_all`: (bound series, value, exemplar decision or None).
Measurement = tuple[_Series, float, "Exemplar | None"]


class _Instrument:
    """The measurement path shared by every kind: find the series, decide the exemplar, add."""

    __slots__ = (
        "_add_all",
        "_by_id",
        "_by_value",
        "_lock",
        "_owner",
        "_sample",
        "description",
        "name",
        "unit",
    )

    #: The SDK instrument class whose temporality a reader asks for (and whose views would select this).
    sdk_kind: ClassVar[type]
    #: The smallest value taken (the SDK drops negative histogram values and counter increments).
    _floor: ClassVar[float] = 0
    boundaries: tuple[float, ...] | None = None

    def __init__(self, owner: PreAggregation, name: str, unit: str, description: str) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self._owner = owner
        self._lock = owner.lock
        self._add_all = owner.add_all
        self._sample: ExemplarSampler | None = owner.sampler
        # id(attributes dict) -> (the dict, kept alive so the id stays its own, series)
        self._by_id: dict[int, tuple[Attributes, _Series]] = {}
        self._by_value: dict[frozenset[tuple[str, Any]], _Series] = {}

    def _measure(self, amount: float, attributes: Attributes = None, context: Context | None = None) -> None:
        """``record`` / ``add``: the SDK's signature; values it would drop are dropped."""
        if not self._floor <= amount < _INF:
            return
        entry = self._by_id.get(id(attributes))
        series = entry[1] if entry is not None and entry[0] is attributes else self._series(attributes)
        if series is None:
            return
        sample = self._sample
        span_context = None if sample is None else sample(amount, attributes, context)
        self._add_all(((series, amount, None if span_context is None else (span_context, _time_ns())),))

    def bind(self, attributes: Attributes) -> _Series | None:
        """The series of ``attributes``, for a caller that records several points at once, each to a fixed
        label combination (:meth:`PreAggregation.add_all`); None: no series can be made for them. A series
        is exported from its first measurement on, as the SDK's are."""
        return self._series(attributes)

    def _series(self, attributes: Attributes) -> _Series | None:
        """The series of ``attributes`` (created on first use), or None: too many series, or unhashable."""
        try:
            key = frozenset(attributes.items()) if attributes else frozenset()
        except (TypeError, AttributeError):
            return None
        with self._lock:
            series = self._by_value.get(key)
            if series is None:
                if len(self._by_value) >= MAX_SERIES:
                    return None
                series = self._by_value[key] = _Series(attributes, self.boundaries, self._floor)
            if len(self._by_id) >= _MAX_IDENTITIES:
                self._by_id.clear()
            self._by_id[id(attributes)] = (attributes, series)
            return series

    def snapshot(self) -> list[_Series]:
        return list(self._by_value.values())


class PreAggregatedHistogram(_Instrument):
    """A histogram with explicit bucket boundaries, aggregated in-process (``record`` like the SDK's)."""

    __slots__ = ("boundaries",)
    sdk_kind: ClassVar[type] = SdkHistogram

    def __init__(
        self, owner: PreAggregation, name: str, unit: str, description: str, boundaries: Sequence[float]
    ) -> None:
        super().__init__(owner, name, unit, description)
        self.boundaries = tuple(float(b) for b in boundaries)

    record = _Instrument._measure


class PreAggregatedCounter(_Instrument):
    """A monotonic counter aggregated in-process (``add`` like the SDK's)."""

    __slots__ = ()
    sdk_kind: ClassVar[type] = SdkCounter

    add = _Instrument._measure


class PreAggregatedUpDownCounter(PreAggregatedCounter):
    """An up-down counter (a non-monotonic sum) aggregated in-process."""

    __slots__ = ()
    sdk_kind = SdkUpDownCounter
    _floor = _LOWEST  # any finite value


_AnyInstrument = PreAggregatedHistogram | PreAggregatedCounter
_SumT = TypeVar("_SumT", bound=PreAggregatedCounter)


class _ReaderView:
    """What one reader was last given, so a delta reader gets only what happened since, and every reader
    only the exemplars made since its previous collection."""

    __slots__ = ("generation", "last", "last_ns")

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, float, list[int]]] = {}
        self.last_ns = time.time_ns()
        self.generation = 0


class PreAggregation:
    """The pre-aggregated instruments of one meter and the readers they are exported to."""

    def __init__(
        self,
        scope: Any,
        resource: Any,
        views: Sequence[View] = (),
        exemplar_filter: Any = None,
    ) -> None:
        self.lock = threading.Lock()
        #: Bumped by every collection; a kept exemplar remembers the generation it was made in.
        self.generation = 0
        #: The exemplar decision per measurement (None: exemplars are off).
        self.sampler = exemplar_sampler(exemplar_filter)
        #: The filter's answer for a given current span, where that is all it depends on (else None).
        self._answer = span_answer(exemplar_filter) if self.sampler is not None else None
        self._scope = scope
        self._resource = resource
        self._views = tuple(views)
        self._instruments: dict[str, _AnyInstrument] = {}
        self._readers: dict[int, _ReaderView] = {}

    def covers(self, name: str, unit: str, kind: type) -> bool:
        """Whether an instrument may be pre-aggregated: no configured view could select it (a view's
        selection is checked conservatively: whatever it cannot be shown not to match, it matches)."""
        return not any(_may_select(view, name, unit, kind, self._scope) for view in self._views)

    def histogram(
        self, name: str, unit: str, description: str, boundaries: Sequence[float]
    ) -> PreAggregatedHistogram:
        """The histogram ``name`` (the same object when asked twice)."""
        found = self._instruments.get(name)
        if isinstance(found, PreAggregatedHistogram):
            return found
        created = PreAggregatedHistogram(self, name, unit, description, boundaries)
        self._instruments[name] = created
        return created

    def counter(self, name: str, unit: str, description: str) -> PreAggregatedCounter:
        return self._sum(PreAggregatedCounter, name, unit, description)

    def up_down_counter(self, name: str, unit: str, description: str) -> PreAggregatedUpDownCounter:
        return self._sum(PreAggregatedUpDownCounter, name, unit, description)

    def _sum(self, kind: type[_SumT], name: str, unit: str, description: str) -> _SumT:
        found = self._instruments.get(name)
        if isinstance(found, kind) and type(found) is kind:
            return found
        created = kind(self, name, unit, description)
        self._instruments[name] = created
        return created

    def add_all(self, measurements: Iterable[Measurement]) -> None:
        """Add measurements to their bound series under one lock acquisition: the one place a value meets
        its totals (``record`` / ``add`` come here with one). Values must be ones the instrument takes
        (finite; not negative, except for an up-down counter): the SDK drops others, and ``record`` / ``add``
        do before they get here. An exemplar is kept as the last of its slot, as in the SDK's reservoirs (a
        histogram has a slot per bucket, a sum one)."""
        lock = self.lock
        lock.acquire()  # not ``with``: that looks up and binds __enter__ and __exit__ each time
        try:
            generation = self.generation
            for series, value, exemplar in measurements:
                search = series.search
                if search is None:  # a sum
                    series.count += 1
                    slot = 0
                else:  # a histogram (its count is the sum of its buckets')
                    slot = bisect_left(search, value)  # upper-inclusive buckets, as the SDK's
                    series.counts[slot] += 1
                    # only the window's extremes here; they are folded into the running ones at export
                    if value < series.window_min:
                        series.window_min = value
                    if value > series.window_max:
                        series.window_max = value
                series.sum += value
                if exemplar is not None:
                    kept = series.kept
                    if kept is None:
                        kept = series.kept = [None] * max(1, len(series.counts))
                    kept[slot] = (value, exemplar, generation)
        finally:
            lock.release()

    def exemplar(self, context: Context | None = None) -> Exemplar | None:
        """The exemplar decision for measurements made now (for :meth:`add_all`): the span context they
        point to and the time, or None. Exact for the SDK's filters and gym's (none looks
        at the value); a custom filter is asked with the value 0."""
        sample = self.sampler
        span_context = None if sample is None else sample(0, None, context)
        return None if span_context is None else (span_context, _time_ns())

    def exemplar_for(self, span: object) -> Exemplar | None:
        """:meth:`exemplar`, for a caller that holds the span it expects to be current (a request's own, at
        its end): one lookup confirms it, and the filter is asked about it directly (no per-span cache to
        consult: the span is new each request). Any other current span gets :meth:`exemplar`'s answer."""
        answer = self._answer
        if answer is None or current_context().get(SPAN_KEY) is not span:  # span_in(), without its call
            return self.exemplar()
        span_context = answer(span)
        return None if span_context is None else (span_context, _time_ns())

    def metrics_for(self, reader: Any) -> list[Metric]:
        """Metric data for ``reader`` in the temporality it prefers (per instrument kind)."""
        temporalities = getattr(reader, "_instrument_class_temporality", {})
        view = self._readers.setdefault(id(reader), _ReaderView())
        metrics: list[Metric] = []
        with self.lock:
            now = time.time_ns()
            instruments = [(instrument, instrument.snapshot()) for instrument in self._instruments.values()]
            since = view.generation
            self.generation += 1
            view.generation = self.generation
            for instrument, series in instruments:
                temporality = _temporality(temporalities, instrument.sdk_kind)
                metric = _metric(instrument, series, temporality, view, since, now)
                if metric is not None:
                    metrics.append(metric)
        view.last_ns = now
        return metrics

    def merge_into(self, data: MetricsData | None, reader: Any) -> MetricsData | None:
        """``data`` (what the SDK collected for ``reader``) with these instruments' metrics added."""
        metrics = self.metrics_for(reader)
        if not metrics:
            return data
        scope = ScopeMetrics(scope=self._scope, metrics=metrics, schema_url="")
        if data is None or not data.resource_metrics:
            return MetricsData(resource_metrics=[ResourceMetrics(self._resource, [scope], "")])
        first, *rest = data.resource_metrics
        merged: list[ScopeMetrics] = []
        added = False
        for existing in first.scope_metrics:
            if not added and existing.scope == self._scope:
                existing = ScopeMetrics(existing.scope, [*existing.metrics, *metrics], existing.schema_url)
                added = True
            merged.append(existing)
        if not added:
            merged.append(scope)
        return MetricsData(
            resource_metrics=[ResourceMetrics(first.resource, merged, first.schema_url), *rest]
        )


def _may_select(view: View, name: str, unit: str, kind: type, scope: Any) -> bool:
    """Whether ``view`` could select the instrument (its criteria read as ``View._match`` reads them)."""
    try:
        wanted_type = view._instrument_type
        if wanted_type is not None and not (issubclass(kind, wanted_type) or issubclass(wanted_type, kind)):
            return False
        pattern = view._instrument_name
        if pattern is not None and not fnmatchcase(name.lower(), pattern.lower()):
            return False
        wanted_unit = view._instrument_unit
        if wanted_unit is not None and not fnmatchcase(unit, wanted_unit):
            return False
        for attribute, value in (
            ("_meter_name", getattr(scope, "name", None)),
            ("_meter_version", getattr(scope, "version", None)),
            ("_meter_schema_url", getattr(scope, "schema_url", None)),
        ):
            wanted = getattr(view, attribute)
            if wanted is not None and wanted != value:
                return False
    except Exception:  # a view we cannot read: assume it applies and leave the instrument to the SDK
        return True
    return True


def _temporality(temporalities: Mapping[type, AggregationTemporality], kind: type) -> AggregationTemporality:
    """The reader's temporality for ``kind`` (its keys are private SDK subclasses of the public ones)."""
    for cls, temporality in temporalities.items():
        if isinstance(cls, type) and issubclass(cls, kind):
            return temporality
    return _CUMULATIVE


def _metric(
    instrument: _AnyInstrument,
    found: list[_Series],
    temporality: AggregationTemporality,
    view: _ReaderView,
    since: int,
    now: int,
) -> Metric | None:
    """One instrument's metric for one reader (None: no point to report); called under the lock."""
    histogram = isinstance(instrument, PreAggregatedHistogram)
    points: list[Any] = []
    for series in found:
        if histogram:
            series.min = min(series.min, series.window_min)
            series.max = max(series.max, series.window_max)
        point = _point(instrument, series, temporality, view, since, now)
        if point is not None:
            points.append(point)
        if histogram and temporality == _DELTA:
            series.window_min, series.window_max = _INF, -_INF
    if not points:
        return None
    data: Any = (
        Histogram(data_points=points, aggregation_temporality=temporality)
        if histogram
        else Sum(
            data_points=points,
            aggregation_temporality=temporality,
            is_monotonic=not isinstance(instrument, PreAggregatedUpDownCounter),
        )
    )
    return Metric(name=instrument.name, description=instrument.description, unit=instrument.unit, data=data)


def _exemplars(series: _Series, since: int) -> list[Any]:
    """The exemplars kept since the reader's previous collection, in bucket order (as the SDK gives them)."""
    found = []
    for kept in series.kept or ():
        if kept is not None and kept[2] >= since:
            value, (span_context, time_ns), _ = kept
            ids = span_context.is_valid
            found.append(
                SdkExemplar(
                    {},  # the point's attributes are the measurement's: nothing was filtered out
                    value,
                    time_ns,
                    span_context.span_id if ids else None,
                    span_context.trace_id if ids else None,
                )
            )
    return found


def _point(
    instrument: _AnyInstrument,
    series: _Series,
    temporality: AggregationTemporality,
    view: _ReaderView,
    since: int,
    now: int,
) -> Any:
    counts = list(series.counts)  # a copy: the point must not change with later measurements
    count = sum(counts) if series.boundaries is not None else series.count
    total = series.sum
    if not count:
        return None  # bound, never measured: not a series yet
    key = id(series)
    delta = temporality == _DELTA
    start = max(view.last_ns, series.start_ns) if delta else series.start_ns
    if isinstance(instrument, PreAggregatedCounter):
        if delta:
            previous = view.last.get(key, (0, 0, []))
            view.last[key] = (count, total, [])
            if count == previous[0]:
                return None
            total -= previous[1]
        return NumberDataPoint(
            attributes=series.attributes,
            start_time_unix_nano=start,
            time_unix_nano=now,
            value=total,
            exemplars=_exemplars(series, since),
        )
    low, high = series.min, series.max
    if delta:
        previous = view.last.get(key, (0, 0, [0] * len(counts)))
        view.last[key] = (count, total, counts)
        if count == previous[0]:
            return None
        count -= previous[0]
        total -= previous[1]
        counts = [a - b for a, b in zip(counts, previous[2], strict=True)]
        low, high = series.window_min, series.window_max
    return HistogramDataPoint(
        attributes=series.attributes,
        start_time_unix_nano=start,
        time_unix_nano=now,
        count=count,
        sum=total,
        bucket_counts=counts,
        explicit_bounds=series.boundaries or (),
        min=low,
        max=high,
        exemplars=_exemplars(series, since),
    )


_ATTACHED_LOCK: Final = threading.Lock()


def bound_series(instrument: object, attributes: Attributes) -> _Series | None:
    """``instrument``'s series for ``attributes`` (for :meth:`PreAggregation.add_all`) when it is
    pre-aggregated; None for an SDK instrument (a configured view selects it, or the meter is not the
    SDK's), which records on its own, or when no series can be made."""
    bind = getattr(instrument, "bind", None)
    return bind(attributes) if bind is not None else None


def attach(meter: Any) -> PreAggregation | None:
    """A :class:`PreAggregation` exported through ``meter``'s provider's readers, with the provider's views
    and exemplar filter; None if ``meter`` is not an SDK meter (the caller then uses ordinary instruments)."""
    consumer = getattr(meter, "_measurement_consumer", None)
    storages = getattr(consumer, "_reader_storages", None)
    config = getattr(consumer, "_sdk_config", None)
    scope = getattr(meter, "_instrumentation_scope", None)
    if not isinstance(storages, Mapping) or config is None or scope is None:
        return None
    readers = list(storages)
    if not all(callable(getattr(reader, "_collect", None)) for reader in readers):
        return None
    aggregation = PreAggregation(
        scope,
        config.resource,
        views=tuple(getattr(config, "views", ()) or ()),
        exemplar_filter=getattr(config, "exemplar_filter", None),
    )
    with _ATTACHED_LOCK:
        for reader in readers:
            reader._collect = _wrapped(reader._collect, aggregation)
    return aggregation


def _wrapped(
    inner: Callable[..., MetricsData | None], aggregation: PreAggregation
) -> Callable[..., MetricsData | None]:
    def collect(reader: Any, timeout_millis: float = 10_000) -> MetricsData | None:
        data = inner(reader, timeout_millis=timeout_millis)
        try:
            return aggregation.merge_into(data, reader)
        except Exception:  # telemetry never stops the program; the SDK's own metrics still go out
            return data

    return collect
