"""Issue 13 §1: the native SERVER span says what the contrib instrumentation says, minus the documented
differences (listed in ``gym_obs.server._span``'s docstring; ``_DIFFERENT`` below is that list).

Two real uvicorn servers run the same ``SimpleServer`` on loopback, one with ``server_instrumentation:
native``, one with ``contrib``, both writing spans and metrics to the file sink (what leaves the process,
after the export scrubber). The same requests go to both: GET/POST, 2xx/4xx/5xx, an unhandled exception,
a stream, a stream that fails after its first chunk, a router prefix, a ``/ng-trace`` parent and a
websocket. Span names, kinds, parent edges, statuses, attributes and events, and the duration metric's
name, unit, buckets and point attributes must be equal.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest

from gym_obs.telemetry import names
from tests.integration.conformance_apps import SECRET
from tests.integration.relay_support import start_script, wait_listening

pytestmark = pytest.mark.integration

PORTS: Final = {"native": 14400, "contrib": 14401}
TRACE_ID: Final = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID: Final = "00f067aa0ba902b7"
TRACEPARENT: Final = f"00-{TRACE_ID}-{PARENT_ID}-01"
USER_AGENT: Final = f"conformance-test/1.0 (key={SECRET})"
SERVER_KIND: Final = 2  # OTLP SPAN_KIND_SERVER

# The documented differences (server/_span.py): compared by a rule of their own, or not at all.
_DIFFERENT: Final = frozenset(
    {
        names.ATTR_SERVER_ADDRESS,  # native: from the Host header; contrib: the socket's "host:port"
        names.ATTR_SERVER_PORT,  # each server its own port (checked in test_documented_differences)
        "client.port",  # contrib only
        "user_agent.synthetic.type",  # contrib only
    }
)

_SCRIPT = """
    import json, sys
    from gym_obs.config import parse_global_config
    from gym_obs.server.base_server import load_server
    load_server("conformance", parse_global_config(json.loads(sys.argv[1]))).run_webserver()
"""

# (method, path, body): every path is requested once per server, so it names its span.
_REQUESTS: Final = (
    ("GET", "/items/7", None),
    ("POST", "/echo", {"hello": "world"}),
    ("GET", "/missing/k", None),
    ("GET", "/unavailable", None),
    ("GET", "/boom", None),
    ("GET", "/stream", None),
    ("GET", "/api/things/5", None),
    ("GET", "/nowhere", None),
    ("POST", "/items/8", None),  # 405: the route matched, the method did not
    ("GET", f"/ng-trace/{TRACEPARENT}/items/9?api_key={SECRET}", None),
)


def _config(variant: str, directory: Path) -> dict[str, Any]:
    return {
        "telemetry": {
            "enabled": True,
            "traces_exporter": "file",
            "metrics_exporter": "file",
            "file_export_dir": str(directory),
            "metric_export_interval_ms": 60_000,
            "server_instrumentation": variant,
        },
        "servers": {
            "conformance": {
                "entrypoint": "tests.integration.conformance_apps:ConformanceServer",
                "server_type": "resources_servers",
                "port": PORTS[variant],
            }
        },
    }


async def _exercise(port: int) -> None:
    base = f"http://127.0.0.1:{port}"
    headers = {"User-Agent": USER_AGENT}
    async with aiohttp.ClientSession(headers=headers) as session:
        for method, path, body in _REQUESTS:
            async with session.request(method, base + path, json=body) as response:
                await response.read()
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.get(base + "/stream_fails") as response:
                await response.read()
        async with session.ws_connect(base + "/ws") as websocket:
            assert (await websocket.receive(timeout=5)).data == "hello"


def _value(value: dict[str, Any]) -> Any:
    ((kind, raw),) = value.items()
    return int(raw) if kind == "intValue" else raw


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _value(item["value"]) for item in items}


def _lines(directory: Path, suffix: str) -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob(f"*{suffix}")):
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def _server_spans(directory: Path) -> dict[str, dict[str, Any]]:
    """The SERVER spans by ``{method} {url.path}`` (websockets: ``WS {url.path}``)."""
    spans: dict[str, dict[str, Any]] = {}
    for doc in _lines(directory, ".traces.jsonl"):
        for resource_spans in doc["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    if span["kind"] != SERVER_KIND:
                        continue
                    attributes = _attributes(span.get("attributes", []))
                    key = f"{attributes.get(names.ATTR_HTTP_REQUEST_METHOD, 'WS')} {attributes['url.path']}"
                    assert key not in spans, f"two SERVER spans for {key}"
                    span["attributes"] = attributes
                    spans[key] = span
    return spans


def _duration_points(directory: Path) -> tuple[list[tuple[str, str, tuple[float, ...]]], Counter[str]]:
    """(name, unit, buckets) of every http.server.request.duration stream, and its points' attributes."""
    streams: list[tuple[str, str, tuple[float, ...]]] = []
    points: Counter[str] = Counter()
    docs = list(_lines(directory, ".metrics.jsonl"))
    for doc in docs[-1:]:  # cumulative: the last export holds every point
        for resource_metrics in doc["resourceMetrics"]:
            for scope_metrics in resource_metrics["scopeMetrics"]:
                for metric in scope_metrics["metrics"]:
                    if metric["name"] != names.METRIC_HTTP_SERVER_REQUEST_DURATION:
                        continue
                    data = metric["histogram"]["dataPoints"]
                    bounds = tuple(data[0]["explicitBounds"]) if data else ()
                    streams.append((metric["name"], metric.get("unit", ""), bounds))
                    for point in data:
                        attributes = json.dumps(_attributes(point.get("attributes", [])), sort_keys=True)
                        points[attributes] += int(point["count"])
    return streams, points


def _comparable(span: dict[str, Any], *, parent_edges: bool) -> dict[str, Any]:
    attributes = {k: v for k, v in span["attributes"].items() if k not in _DIFFERENT}
    events = [
        (event["name"], _attributes(event.get("attributes", [])).get(names.ATTR_EXCEPTION_TYPE))
        for event in span.get("events", [])
    ]
    status = span.get("status", {})
    return {
        "name": span["name"],
        "kind": span["kind"],
        "trace": span["traceId"] if parent_edges else None,
        "parent": span.get("parentSpanId") or None,
        "status": status.get("code"),
        "attributes": attributes,
        "events": events,
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directories = {variant: tmp_path_factory.mktemp(variant) for variant in PORTS}

    async def run() -> dict[str, bytes]:
        procs = {
            variant: await start_script(
                _SCRIPT, {"OTEL_BSP_SCHEDULE_DELAY": "50"}, json.dumps(_config(variant, directory))
            )
            for variant, directory in directories.items()
        }
        errors: dict[str, bytes] = {}
        try:
            for variant in procs:
                await wait_listening(PORTS[variant], timeout_s=60)
            for variant in procs:
                await _exercise(PORTS[variant])
        finally:
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
            for variant, proc in procs.items():
                _out, errors[variant] = await asyncio.wait_for(proc.communicate(), 60)
        return errors

    errors = asyncio.run(run())
    for variant, directory in directories.items():
        assert list(directory.glob("*.traces.jsonl")), errors[variant].decode(errors="replace")[-3000:]
    return directories


_FAILED_STREAM: Final = "GET /stream_fails"


def test_same_server_spans(exported: dict[str, Path]) -> None:
    native, contrib = _server_spans(exported["native"]), _server_spans(exported["contrib"])
    assert sorted(native) == sorted(contrib)
    assert len(native) == len(_REQUESTS) + 2  # the failing stream and the websocket too
    for key in native:
        if key == _FAILED_STREAM:
            continue  # a documented difference: test_documented_differences
        parent_edges = key.startswith("GET /items/9")
        left = _comparable(native[key], parent_edges=parent_edges)
        right = _comparable(contrib[key], parent_edges=parent_edges)
        assert left == right, key
    assert native["WS /ws"]["name"] == "HTTP /ws"
    assert native["GET /nowhere"]["name"] == "GET"
    assert native["GET /api/things/5"]["name"] == "GET /api/things/{thing_id}"


def test_documented_differences(exported: dict[str, Path]) -> None:
    native, contrib = _server_spans(exported["native"]), _server_spans(exported["contrib"])
    for key, span in native.items():
        attributes = span["attributes"]
        assert attributes[names.ATTR_SERVER_ADDRESS] == "127.0.0.1"
        assert attributes[names.ATTR_SERVER_PORT] == PORTS["native"]
        assert "client.port" not in attributes
        assert contrib[key]["attributes"][names.ATTR_SERVER_ADDRESS] == f"127.0.0.1:{PORTS['contrib']}"
        assert contrib[key]["attributes"][names.ATTR_SERVER_PORT] == PORTS["contrib"]
    # A stream that fails after its first chunk: the same span, plus error.type, with one exception event.
    left = _comparable(native[_FAILED_STREAM], parent_edges=False)
    right = _comparable(contrib[_FAILED_STREAM], parent_edges=False)
    assert left["attributes"].pop(names.ATTR_ERROR_TYPE) == "ValueError"
    assert (left.pop("events"), right.pop("events")) == (
        [("exception", "ValueError")],
        [("exception", "ValueError")] * 2,
    )
    assert left == right
    agent = native["GET /items/7"]["attributes"][names.ATTR_USER_AGENT_ORIGINAL]
    assert agent.startswith("conformance-test/1.0 (key=") and "[REDACTED]" in agent and SECRET not in agent


def test_the_trace_segment_is_the_parent(exported: dict[str, Path]) -> None:
    for variant in PORTS:
        span = _server_spans(exported[variant])["GET /items/9"]
        assert (span["traceId"], span["parentSpanId"]) == (TRACE_ID, PARENT_ID), variant
        assert names.ATTR_URL_QUERY not in span["attributes"]
        assert SECRET not in json.dumps(span)


_FAILED_STREAM_POINT: Final = {
    names.ATTR_HTTP_REQUEST_METHOD: "GET",
    names.ATTR_HTTP_RESPONSE_STATUS_CODE: 200,
    names.ATTR_HTTP_ROUTE: "/stream_fails",
    names.ATTR_NETWORK_PROTOCOL_VERSION: "1.1",
    names.ATTR_URL_SCHEME: "http",
}


def test_same_duration_metric(exported: dict[str, Path]) -> None:
    native_streams, native_points = _duration_points(exported["native"])
    contrib_streams, contrib_points = _duration_points(exported["contrib"])
    assert native_streams == [
        (names.METRIC_HTTP_SERVER_REQUEST_DURATION, names.UNIT_SECONDS, names.HTTP_DURATION_BUCKETS_S)
    ]
    assert native_streams[0][:2] == contrib_streams[0][:2]  # contrib's buckets: the conventions' advisory
    # The failed stream's point has error.type (a documented difference); every other point is the same.
    failed = {"error.type": "ValueError", **_FAILED_STREAM_POINT}
    assert native_points.pop(json.dumps(failed, sort_keys=True)) == 1
    assert contrib_points.pop(json.dumps(_FAILED_STREAM_POINT, sort_keys=True)) == 1
    assert native_points == contrib_points
    assert sum(native_points.values()) == len(_REQUESTS)  # and no point for the websocket


def test_no_secret_leaves_either_server(exported: dict[str, Path]) -> None:
    for directory in exported.values():
        for path in directory.iterdir():
            assert SECRET.encode() not in path.read_bytes(), path
