"""Cost per call of the telemetry core's hot helpers, and of an instrumented site with telemetry off.

Run: ``python3 benchmarks/telemetry_core.py [--runs N]``. Each case is timed in several runs (each run
loops enough calls to take a measurable time) and the median per-call cost is printed, next to an empty
function call measured in the same process as the baseline. Exit status 1 if the disabled instrumented site
costs 1 µs or more per call (the issue's budget).

A second table prices one metric point on the hot path (issue 13 §5): ``http.client.request.duration`` as
``RequestObserver`` records it (a cached 5-attribute dict) and a counter increment, through the SDK's own
instrument and through gym_obs's pre-aggregated one, on the same meter provider (one reader, gym_obs's
exemplar filter), inside a sampled span of this process (an exemplar is kept) and with no span (none is),
as a ratio pre-aggregated / SDK in the same run.

A third table prices the span groups (issue 16 §1) at their call sites: the same site with telemetry off,
on with every span group off (``none``: no span is created, metrics still flow), and on with the groups on
(``all``), as ratios against the telemetry-off run of the same site in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass

from gym_obs.client._observe import RequestObserver
from gym_obs.client._options import RequestOptions
from gym_obs.server.rollouts import rollout_scope
from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.groups import parse_span_groups
from gym_obs.telemetry.redaction import redact_url, scrub_text
from gym_obs.telemetry.spans import client_span
from gym_obs.telemetry.testing import capture_telemetry

DISABLED_SITE_BUDGET_S = 1e-6

URL = "https://user:pass@api.example.com:8443/v1/chat/completions?api_key=abc&stream=true#frag"
ERROR_TEXT = (
    "Traceback (most recent call last):\n"
    + '  File "/srv/app/handler.py", line 42, in handle\n    result = await call_model(payload)\n' * 20
    + "aiohttp.ClientResponseError: 401, message='Unauthorized', url='https://api.example.com/v1?key=x'\n"
    + "request headers: {'Authorization': 'Bearer sk-abcdefghijklmnopqrstuvwxyz', 'Content-Type': 'json'}\n"
)
BODY_10MB_BYTES = (b"<html><body>" + b"upstream error page line\n" * 419_430)[: 10 * 1024 * 1024] + (
    b"\nRuntimeError: the last line\n"
)
BODY_10MB_STR = BODY_10MB_BYTES.decode()


@dataclass(frozen=True)
class Result:
    name: str
    median_s: float
    runs: list[float]


def _per_call(fn: Callable[[], object], runs: int) -> list[float]:
    """Per-call seconds for ``runs`` runs; each run loops enough calls to take >= 0.2 s (autorange)."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return [t / number for t in timer.repeat(repeat=runs, number=number)]


def _baseline() -> None:
    return None


def _disabled_site() -> None:
    """The instrumented-site pattern every hot path uses: one flag check, nothing more when off."""
    if STATE.enabled:
        with client_span("GET", **{names.ATTR_URL_FULL: URL}):
            pass


def _client_span_unguarded() -> None:
    with client_span("GET", **{names.ATTR_URL_FULL: URL}):
        pass


OBSERVED_URL = "http://127.0.0.1:9/v1/responses"
OBSERVED_OPTIONS = RequestOptions(internal=True, server_name="model", route="/v1/responses")


def _group_flag_site() -> None:
    """A span group's guard as call sites write it (``model_call`` here)."""
    if STATE.enabled and STATE.groups.model_call:
        with client_span("POST", **{names.ATTR_URL_FULL: URL}):
            pass


def _observer_site() -> None:
    """``request()``'s telemetry around one request answered 200 (no I/O): the ``http_client`` group."""
    if STATE.enabled:
        RequestObserver("POST", OBSERVED_URL, OBSERVED_OPTIONS).end_ok(200)


def _rollout_site() -> None:
    """``rollout_scope()`` around an empty rollout: the ``rollout`` group (its metrics always flow)."""
    with rollout_scope("rollout-1"):
        pass


@dataclass(frozen=True)
class PointResult:
    case: str
    sdk_s: float
    pre_s: float


def measure_points(runs: int) -> list[PointResult]:
    """SDK instrument vs pre-aggregated instrument, the same point on the same meter provider."""
    from opentelemetry import context, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from gym_obs.telemetry._exemplars import RecordedSpanExemplarFilter
    from gym_obs.telemetry.metrics import AttributeCache, Instruments

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], exemplar_filter=RecordedSpanExemplarFilter())
    meter = provider.get_meter(names.INSTRUMENTATION_SCOPE)
    pre = Instruments(meter)
    name = names.METRIC_HTTP_CLIENT_REQUEST_DURATION
    sdk_histogram = meter.create_histogram(
        name + ".sdk", unit="s", explicit_bucket_boundaries_advisory=list(names.HISTOGRAM_BUCKETS_S[name])
    )
    sdk_counter = meter.create_counter(names.METRIC_CLIENT_RETRIES + ".sdk", unit=names.UNIT_RETRY)
    point = AttributeCache(
        names.ATTR_HTTP_REQUEST_METHOD,
        "server.address",
        names.ATTR_SERVER_NAME,
        "server.port",
        names.ATTR_HTTP_RESPONSE_STATUS_CODE,
    ).get("POST", "127.0.0.1", "model", 9000, 200)
    retry = AttributeCache(names.ATTR_SERVER_NAME, names.ATTR_RETRY_REASON).get("model", "timeout")
    span = TracerProvider().get_tracer("bench").start_span("POST /v1/responses")
    results = []
    places = (("in a sampled span", trace.set_span_in_context(span)), ("no span", context.Context()))
    for where, ctx in places:
        token = context.attach(ctx)
        try:
            for case, sdk_fn, pre_fn in (
                (
                    "histogram record",
                    lambda: sdk_histogram.record(0.012, point),
                    lambda: pre.client_request_duration.record(0.012, point),
                ),
                (
                    "counter add",
                    lambda: sdk_counter.add(1, retry),
                    lambda: pre.client_retries.add(1, retry),
                ),
            ):
                sdk_runs, pre_runs = [], []
                for _ in range(runs):  # interleaved, so both see the same machine
                    sdk_runs.extend(_per_call(sdk_fn, 1))
                    pre_runs.extend(_per_call(pre_fn, 1))
                results.append(
                    PointResult(f"{case}, {where}", statistics.median(sdk_runs), statistics.median(pre_runs))
                )
        finally:
            context.detach(token)
    data = reader.get_metrics_data()  # the pre-aggregated points reach the reader, with their exemplars
    assert data is not None
    found = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    (histogram_point,) = found[name].data.data_points
    (exemplar,) = histogram_point.exemplars
    assert exemplar.span_id == span.get_span_context().span_id
    provider.shutdown()
    return results


GROUP_SITES: list[tuple[str, Callable[[], object]]] = [
    ("span-group flag check (`STATE.groups.model_call`)", _group_flag_site),
    ("RequestObserver + end_ok (http_client group)", _observer_site),
    ("rollout_scope() (rollout group)", _rollout_site),
]


@dataclass(frozen=True)
class GroupResult:
    site: str
    off_s: float
    none_s: float
    all_s: float
    spans_with_none: int


def measure_groups(runs: int) -> list[GroupResult]:
    """Each site with telemetry off, on with groups ``none`` and on with ``all``; spans are counted with
    ``none`` to show the disabled group created none."""
    assert not STATE.enabled, "run the benchmark with telemetry off"
    results = []
    for site, fn in GROUP_SITES:
        off = statistics.median(_per_call(fn, runs))
        with capture_telemetry() as capture:
            STATE.groups = parse_span_groups("none")
            none = statistics.median(_per_call(fn, runs))
            spans_with_none = len(capture.spans())
            STATE.groups = parse_span_groups("all")
            capture.clear()
            on = statistics.median(_per_call(fn, runs))
            capture.clear()
        results.append(GroupResult(site, off, none, on, spans_with_none))
    return results


def measure(runs: int) -> list[Result]:
    assert not STATE.enabled, "run the benchmark with telemetry off"
    cases: list[tuple[str, Callable[[], object]]] = [
        ("baseline: empty function call", _baseline),
        ("instrumented site, telemetry off (`if STATE.enabled:`)", _disabled_site),
        ("client_span() unguarded, telemetry off", _client_span_unguarded),
        ("redact_url (URL with userinfo, query, fragment)", lambda: redact_url(URL)),
        (f"scrub_text ({len(ERROR_TEXT)} chars traceback with secrets)", lambda: scrub_text(ERROR_TEXT)),
        ("bounded_excerpt (10 MB bytes body)", lambda: bounded_excerpt(BODY_10MB_BYTES)),
        ("bounded_excerpt (10 MB str body)", lambda: bounded_excerpt(BODY_10MB_STR)),
    ]
    results = [Result(name, statistics.median(r), r) for name, fn in cases for r in [_per_call(fn, runs)]]
    with capture_telemetry() as capture:
        timings = _per_call(_disabled_site, runs)
        capture.clear()
    enabled = "instrumented site, telemetry on (in-memory exporter)"
    results.append(Result(enabled, statistics.median(timings), timings))
    return results


def _fmt(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e3:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7, help="timed runs per case (median reported)")
    args = parser.parse_args(argv)
    results = measure(args.runs)
    baseline = results[0].median_s
    print(f"Python {sys.version.split()[0]}, {args.runs} runs per case, median per call")
    print(f"| {'case':<62} | {'per call':>10} | {'x baseline':>10} |")
    print(f"|{'-' * 64}|{'-' * 11}:|{'-' * 11}:|")
    for result in results:
        print(f"| {result.name:<62} | {_fmt(result.median_s):>10} | {result.median_s / baseline:>10.1f} |")
    print()
    print("One metric point: the SDK's instrument vs the pre-aggregated one (same provider, same run)")
    print(f"| {'point':<48} | {'SDK':>9} | {'pre-agg':>9} | {'pre / SDK':>9} |")
    print(f"|{'-' * 50}|{'-' * 10}:|{'-' * 10}:|{'-' * 10}:|")
    for p in measure_points(args.runs):
        print(f"| {p.case:<48} | {_fmt(p.sdk_s):>9} | {_fmt(p.pre_s):>9} | {p.pre_s / p.sdk_s:>9.2f} |")
    print()
    print("Span groups at their call sites (x = ratio to the same site with telemetry off, same run)")
    columns = f"{'off':>9} | {'groups none':>11} | {'x off':>6} | {'groups all':>10} | {'x off':>6}"
    print(f"| {'site':<50} | {columns} |")
    print(f"|{'-' * 52}|{'-' * 10}:|{'-' * 12}:|{'-' * 7}:|{'-' * 11}:|{'-' * 7}:|")
    for g in measure_groups(args.runs):
        print(
            f"| {g.site:<50} | {_fmt(g.off_s):>9} | {_fmt(g.none_s):>11} | {g.none_s / g.off_s:>6.1f} "
            f"| {_fmt(g.all_s):>10} | {g.all_s / g.off_s:>6.1f} |"
        )
        assert g.spans_with_none == 0, f"{g.site}: {g.spans_with_none} spans created with groups none"
    disabled = results[1].median_s
    verdict = "OK" if disabled < DISABLED_SITE_BUDGET_S else "OVER BUDGET"
    print(f"disabled instrumented site: {_fmt(disabled)} per call (budget 1 µs): {verdict}")
    return 0 if disabled < DISABLED_SITE_BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
