"""Rollout context, /ng-rollout and /ng-trace path segments, the propagation allow-list, header injection."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gym_obs.telemetry import names
from gym_obs.telemetry.propagation import (
    ParsedPath,
    apply_rollout_prefix,
    context_from_traceparent,
    current_rollout_id,
    format_traceparent,
    inject_trace_headers,
    parse_path_segments,
    parse_propagation_targets,
    rollout_context,
    rollout_path_prefix,
    should_propagate,
    trace_context_path_segment,
)
from gym_obs.telemetry.spans import client_span, current_ids
from gym_obs.telemetry.testing import Capture, telemetry_state

STATE = telemetry_state()

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACEPARENT_RE = re.compile(names.TRACEPARENT_PATTERN)


@pytest.fixture
def targets() -> Iterator[None]:
    saved = STATE.propagation_targets
    STATE.propagation_targets = parse_propagation_targets("Api.Example.com, [::1]:8080, localhost:9000")
    yield
    STATE.propagation_targets = saved


def test_rollout_context_sets_and_restores() -> None:
    assert current_rollout_id() is None
    with rollout_context("r-1"):
        assert current_rollout_id() == "r-1"
        with rollout_context("r-2"):
            assert current_rollout_id() == "r-2"
        assert current_rollout_id() == "r-1"
    assert current_rollout_id() is None


async def test_rollout_context_follows_tasks_and_to_thread() -> None:
    with rollout_context("r-9"):
        assert await asyncio.to_thread(current_rollout_id) == "r-9"
        assert await asyncio.create_task(asyncio.sleep(0, current_rollout_id())) == "r-9"


def test_rollout_path_prefix_encodes_the_id() -> None:
    assert rollout_path_prefix("r1") == "/ng-rollout/r1"
    assert rollout_path_prefix("a/b c") == "/ng-rollout/a%2Fb%20c"
    assert rollout_path_prefix("r1", token_capture=True) == "/ng-rollout/r1/ng-token-capture"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat", ParsedPath("/v1/chat")),
        ("/ng-rollout/r1/v1/chat", ParsedPath("/v1/chat", None, "r1")),
        (f"/ng-trace/{TP}/v1", ParsedPath("/v1", TP, None)),
        (f"/ng-rollout/r1/ng-trace/{TP}/v1", ParsedPath("/v1", TP, "r1")),
        (f"/ng-trace/{TP}/ng-rollout/r1/v1", ParsedPath("/v1", TP, "r1")),
        ("/ng-rollout/r1/ng-token-capture/v1", ParsedPath("/v1", None, "r1", True)),
        ("/ng-rollout/a%2Fb/x", ParsedPath("/x", None, "a/b")),
        ("/ng-rollout/r1", ParsedPath("/", None, "r1")),
        ("/ng-trace/not-a-traceparent/v1", ParsedPath("/v1")),
        (f"/ng-trace/00-{'0' * 32}-b7ad6b7169203331-01/v1", ParsedPath("/v1")),
        ("/ng-rollout/%0Abad/v1", ParsedPath("/v1")),
        ("/ng-rollout/r1/ng-rollout/r2/v1", ParsedPath("/ng-rollout/r2/v1", None, "r1")),
        ("/x/ng-rollout/r1", ParsedPath("/x/ng-rollout/r1")),
    ],
)
def test_parse_path_segments(path: str, expected: ParsedPath) -> None:
    assert parse_path_segments(path) == expected


@given(st.text())
def test_parse_path_segments_never_raises(path: str) -> None:
    parsed = parse_path_segments("/" + path)
    assert parsed.path.startswith("/")


def test_trace_segment_is_empty_when_off_or_without_a_span(telemetry: Capture) -> None:
    assert trace_context_path_segment() == ""
    with client_span("GET"):
        trace_id, span_id = current_ids()
        segment = trace_context_path_segment()
    assert segment.startswith(f"/ng-trace/00-{trace_id}-{span_id}-")
    assert parse_path_segments(segment + "/x").traceparent == segment.removeprefix("/ng-trace/")


def test_trace_segment_is_empty_when_telemetry_is_off() -> None:
    with client_span("GET"):
        assert trace_context_path_segment() == ""


def test_apply_rollout_prefix_inserts_after_the_authority(telemetry: Capture) -> None:
    assert apply_rollout_prefix("http://h:1/v1?x=1", "r/1") == "http://h:1/ng-rollout/r%2F1/v1?x=1"
    assert apply_rollout_prefix("http://h:1", "r1", True) == "http://h:1/ng-rollout/r1/ng-token-capture"
    assert apply_rollout_prefix("http://h:1/", None) == "http://h:1/"
    with client_span("GET"):
        url = apply_rollout_prefix("http://h:1/v1", "r1")
        segment = trace_context_path_segment()
        assert url == f"http://h:1/ng-rollout/r1{segment}/v1"
        assert apply_rollout_prefix(url, "r2") == url  # idempotent, existing segments win
    assert apply_rollout_prefix("http://h:1/v1", "r1", trace_context=False) == "http://h:1/ng-rollout/r1/v1"


def test_apply_rollout_prefix_leaves_unparseable_urls_alone() -> None:
    assert apply_rollout_prefix("http://[bad/v1", "r1") == "http://[bad/v1"


def test_propagation_targets_are_normalised() -> None:
    assert parse_propagation_targets("Api.Example.com, [::1]:8080, localhost:9000, ,::1") == {
        "api.example.com",
        "[::1]:8080",
        "localhost:9000",
        "::1",
    }
    assert parse_propagation_targets(["A:1"]) == {"a:1"}
    assert parse_propagation_targets(None) == frozenset()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://API.example.com:444/x", True),  # no port in the entry: any port
        ("http://api.example.com/x", True),
        ("http://[::1]:8080/", True),
        ("http://[::1]:8081/", False),
        ("http://localhost:9000/v1", True),
        ("http://localhost/v1", False),  # port 80 is not 9000
        ("https://api.openai.com/v1", False),
        ("http://evil.com/?h=api.example.com", False),
        ("http://api.example.com.evil.com/", False),
        ("garbage", False),
        ("http://[bad", False),
    ],
)
def test_should_propagate_only_to_allow_listed_hosts(targets: None, url: str, expected: bool) -> None:
    assert should_propagate(url) is expected


def test_internal_calls_always_propagate() -> None:
    assert should_propagate("http://anything:1/", internal=True) is True
    assert should_propagate("http://anything:1/") is False


def test_inject_trace_headers(telemetry: Capture) -> None:
    headers: dict[str, str] = {}
    inject_trace_headers(headers)
    assert names.TRACEPARENT_HEADER not in headers
    with client_span("GET"):
        inject_trace_headers(headers)
        trace_id, span_id = current_ids()
    assert headers[names.TRACEPARENT_HEADER].startswith(f"00-{trace_id}-{span_id}-")


@given(st.integers(0, 2**128 - 1), st.integers(0, 2**64 - 1), st.integers(0, 255))
def test_format_traceparent_is_the_w3c_format(trace_id: int, span_id: int, flags: int) -> None:
    assert format_traceparent(trace_id, span_id, flags) == f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def test_format_traceparent_formats_ids_out_of_range_as_they_come() -> None:
    assert format_traceparent(2**128, -1, 256) == f"00-{2**128:032x}-{-1:016x}-{256:02x}"


@pytest.fixture
def global_textmap() -> Iterator[None]:
    saved = propagate.get_global_textmap()
    yield
    propagate.set_global_textmap(saved)


def _injected(context: Context) -> tuple[dict[str, str], dict[str, str]]:
    """(gym_obs' headers, the global propagator's) for the same context."""
    ours: dict[str, str] = {}
    theirs: dict[str, str] = {}
    inject_trace_headers(ours, context)
    propagate.inject(theirs, context)
    return ours, theirs


@pytest.mark.parametrize(
    "textmap",
    [
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()]),  # the default
        CompositePropagator([TraceContextTextMapPropagator()]),
        TraceContextTextMapPropagator(),
        CompositePropagator([W3CBaggagePropagator()]),  # baggage only: no traceparent at all
        CompositePropagator([]),
    ],
    ids=["default", "tracecontext", "tracecontext_bare", "baggage_only", "none"],
)
def test_inject_trace_headers_writes_what_the_global_propagator_writes(
    telemetry: Capture, global_textmap: None, textmap: TextMapPropagator
) -> None:
    """The W3C default is formatted directly (it runs on every hop): the same bytes as the propagator's,
    with a trace state and with baggage too; other propagators inject themselves."""
    propagate.set_global_textmap(textmap)
    traced = names.TRACEPARENT_HEADER in textmap.fields
    with client_span("GET") as span:
        context = trace.set_span_in_context(span)
        ours, theirs = _injected(context)
        assert ours == theirs
        assert (names.TRACEPARENT_HEADER in ours) == traced
        stated = trace.NonRecordingSpan(
            trace.SpanContext(
                span.get_span_context().trace_id, 0xB7AD6B7169203331, is_remote=False,
                trace_flags=trace.TraceFlags(1), trace_state=trace.TraceState([("vendor", "v1"), ("x", "2")]),
            )
        )
        ours, theirs = _injected(trace.set_span_in_context(stated))
        assert ours == theirs
        assert (ours.get("tracestate") == "vendor=v1,x=2") == traced
        ours, theirs = _injected(baggage.set_baggage("user", "a b", context))
        assert ours == theirs
    ours, theirs = _injected(trace.set_span_in_context(trace.INVALID_SPAN))
    assert ours == theirs == {}


def test_inject_trace_headers_defers_to_any_other_propagator(
    telemetry: Capture, global_textmap: None
) -> None:
    class Custom(TextMapPropagator):
        def extract(self, carrier: Any, context: Context | None = None, getter: Any = None) -> Context:
            return context or Context()

        def inject(self, carrier: Any, context: Context | None = None, setter: Any = None) -> None:
            carrier["x-custom"] = "1"

        @property
        def fields(self) -> set[str]:
            return {"x-custom"}

    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), Custom()]))
    with client_span("GET"):
        headers: dict[str, str] = {}
        inject_trace_headers(headers)
    assert headers["x-custom"] == "1" and TRACEPARENT_RE.fullmatch(headers[names.TRACEPARENT_HEADER])


def test_inject_trace_headers_is_a_no_op_when_off() -> None:
    headers: dict[str, str] = {}
    inject_trace_headers(headers)
    assert headers == {}


@pytest.mark.parametrize(
    "value",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        " 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03\t",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        "garbage",
        "",
    ],
)
def test_context_from_traceparent_is_what_the_sdk_propagator_extracts(value: str) -> None:
    ours = trace.get_current_span(context_from_traceparent(value)).get_span_context()
    sdk = trace.get_current_span(
        TraceContextTextMapPropagator().extract({"traceparent": value})
    ).get_span_context()
    assert ours == sdk and ours.is_remote == sdk.is_remote and ours.trace_flags == sdk.trace_flags
