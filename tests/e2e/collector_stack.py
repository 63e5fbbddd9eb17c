"""The real trace stack as loopback processes: ``otelcol-gym``, Jaeger v2 and Debian's Prometheus.

The collector always runs a SHIPPED config (``collector/*.yaml``) with only addresses overridden by
``--set`` (the file a user runs is the file tested); Jaeger v2 stands in for Tempo (Tempo cannot be built
here) and gets a small config of its own (it is the test's trace store, not a shipped part). Binaries come
from ``scripts/build-collector.sh`` / ``scripts/build-jaeger.sh`` (cached builds keyed by their inputs).
Every wait polls a real endpoint; nothing sleeps blindly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = ROOT / "collector"

SPAN_KIND_SERVER = "server"
SPAN_KIND_CLIENT = "client"


# --- binaries -----------------------------------------------------------------------------------------------


@functools.cache
def built_binary(script: str) -> Path:
    """Run a build script (a cache hit costs a hash) and return the binary path it prints."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=1800, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"scripts/{script} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def otelcol() -> Path:
    return built_binary("build-collector.sh")


def jaeger() -> Path:
    return built_binary("build-jaeger.sh")


# --- processes ----------------------------------------------------------------------------------------------


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body); (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


@dataclass
class Process:
    """A started binary with its log; ``log_tail`` goes into every assertion message about it."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} log ({self.log})\n{text[-chars:]}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to flush (a crash, not a shutdown)."""
        if self.alive():
            self.popen.kill()
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


def wait_until(
    what: str, condition: Callable[[], bool], timeout_s: float, *, watch: Sequence[Process] = ()
) -> None:
    """Poll ``condition`` until it holds; fail early (with logs) if a watched process died."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        dead = [process for process in watch if not process.alive()]
        if dead:
            logs = "\n".join(process.log_tail() for process in dead)
            raise AssertionError(f"{', '.join(p.name for p in dead)} exited before {what}\n{logs}")
        if time.monotonic() > deadline:
            logs = "\n".join(process.log_tail(1500) for process in watch)
            raise TimeoutError(f"no {what} after {timeout_s} s\n{logs}")
        time.sleep(0.2)


@contextlib.contextmanager
def run_process(
    name: str, argv: Sequence[str], work: Path, ready_url: str, *, ready_timeout_s: float = 60.0
) -> Iterator[Process]:
    """Start ``argv`` logging to ``work/<name>.log``; yield once ``ready_url`` answers 200."""
    log = work / f"{name}.log"
    with log.open("wb") as sink:
        popen = subprocess.Popen(list(argv), stdout=sink, stderr=subprocess.STDOUT, cwd=work)
    process = Process(name, popen, log)
    try:
        wait_until(
            f"{name} ready at {ready_url}",
            lambda: http_get(ready_url)[0] == 200,
            ready_timeout_s,
            watch=[process],
        )
        yield process
    finally:
        process.stop()


# --- the collector ------------------------------------------------------------------------------------------


def set_flags(overrides: Mapping[str, Any]) -> list[str]:
    """``--set`` flags (``::`` separates keys; a value is YAML, so lists and maps are given as JSON)."""
    return [
        f"--set={key}={value if isinstance(value, str) else json.dumps(value)}"
        for key, value in overrides.items()
    ]


def validate(config: Path, overrides: Mapping[str, Any] = {}) -> subprocess.CompletedProcess[str]:
    """``otelcol-gym validate``: the collector's own strict decoding of a config."""
    return subprocess.run(
        [str(otelcol()), "validate", f"--config={config}", *set_flags(overrides)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextlib.contextmanager
def run_collector(
    name: str, config: str, work: Path, health_port: int, overrides: Mapping[str, Any]
) -> Iterator[Process]:
    """``otelcol-gym --config=collector/<config>`` with ``overrides``; ready when health_check says so."""
    health = f"127.0.0.1:{health_port}"
    argv = [
        str(otelcol()),
        f"--config={COLLECTOR_DIR / config}",
        *set_flags({"extensions::health_check::endpoint": health, **overrides}),
    ]
    with run_process(name, argv, work, f"http://{health}/") as process:
        yield process


def telemetry_port_override(port: int) -> dict[str, Any]:
    """The collector's own /metrics reader (a list in the shipped config) moved to ``port``."""
    reader = {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": port}}}}
    return {"service::telemetry::metrics::readers": [reader]}


# --- Jaeger v2 (the trace store) ----------------------------------------------------------------------------


def _jaeger_config(otlp_grpc_port: int, query_port: int, grpc_query_port: int, health_port: int) -> str:
    config = {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["jaeger_storage_exporter"]}},
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
        },
        "extensions": {
            "jaeger_storage": {"backends": {"store": {"memory": {"max_traces": 200000}}}},
            "jaeger_query": {
                "storage": {"traces": "store"},
                "http": {"endpoint": f"127.0.0.1:{query_port}"},
                "grpc": {"endpoint": f"127.0.0.1:{grpc_query_port}"},
            },
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"127.0.0.1:{health_port}"}},
        },
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{otlp_grpc_port}"}}}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "store"}},
    }
    return json.dumps(config, indent=2)  # JSON is YAML


@dataclass(frozen=True)
class Span:
    span_id: str
    parent_id: str | None
    service: str
    name: str
    kind: str
    error: bool
    tags: Mapping[str, Any]


class Jaeger:
    """Jaeger's query API (``/api/traces/<id>``), read as plain spans."""

    def __init__(self, query_url: str) -> None:
        self.url = query_url

    def trace(self, trace_id: str) -> list[Span] | None:
        status, body = http_get(f"{self.url}/api/traces/{trace_id}")
        if status != 200:
            return None
        data = json.loads(body)["data"]
        return [span for trace in data for span in _spans(trace)] or None

    def services(self) -> list[str]:
        status, body = http_get(f"{self.url}/api/services")
        return list(json.loads(body)["data"] or []) if status == 200 else []

    def trace_ids(self, service: str, limit: int = 100000) -> set[str]:
        """Every trace id the store holds for ``service`` (the search API, lookback of one hour)."""
        url = f"{self.url}/api/traces?service={urllib.parse.quote(service)}&limit={limit}&lookback=1h"
        status, body = http_get(url, timeout_s=30)
        if status != 200:
            return set()
        return {trace["traceID"].rjust(32, "0") for trace in json.loads(body)["data"] or []}


def _spans(trace: Mapping[str, Any]) -> Iterator[Span]:
    processes = {key: value["serviceName"] for key, value in trace["processes"].items()}
    for span in trace["spans"]:
        tags = {tag["key"]: tag["value"] for tag in span.get("tags", [])}
        parents = [ref["spanID"] for ref in span.get("references", []) if ref["refType"] == "CHILD_OF"]
        yield Span(
            span_id=span["spanID"],
            parent_id=parents[0] if parents else None,
            service=processes[span["processID"]],
            name=span["operationName"],
            kind=str(tags.get("span.kind", "internal")),
            error=tags.get("error") is True or tags.get("otel.status_code") == "ERROR",
            tags=tags,
        )


@contextlib.contextmanager
def run_jaeger(name: str, work: Path, ports: Sequence[int]) -> Iterator[Jaeger]:
    """Jaeger v2 with in-memory storage; ``ports`` = (OTLP gRPC, query HTTP, query gRPC, health)."""
    otlp, query, grpc_query, health = ports
    config = work / f"{name}.yaml"
    config.write_text(_jaeger_config(otlp, query, grpc_query, health))
    with run_process(name, [str(jaeger()), f"--config={config}"], work, f"http://127.0.0.1:{health}/status"):
        yield Jaeger(f"http://127.0.0.1:{query}")


def trace_problems(spans: Sequence[Span], services: set[str]) -> list[str]:
    """Why a trace is not whole: a missing parent, a CLIENT call with no SERVER child, a missing process."""
    by_id = {span.span_id: span for span in spans}
    problems = [
        f"{span.service} {span.name}: parent {span.parent_id} missing"
        for span in spans
        if span.parent_id is not None and span.parent_id not in by_id
    ]
    roots = [span for span in spans if span.parent_id is None]
    if len(roots) != 1:
        problems.append(f"{len(roots)} root spans")
    children: dict[str, list[Span]] = {}
    for span in spans:
        if span.parent_id is not None:
            children.setdefault(span.parent_id, []).append(span)
    for span in spans:
        if span.kind == SPAN_KIND_CLIENT:
            # One SERVER child per attempt that reached the server (retries reuse the CLIENT span).
            servers = [c for c in children.get(span.span_id, []) if c.kind == SPAN_KIND_SERVER]
            if not servers or any(server.service == span.service for server in servers):
                problems.append(f"{span.service} CLIENT {span.name}: no SERVER child in another process")
    seen = {span.service for span in spans}
    if not services <= seen:
        problems.append(f"no spans of {sorted(services - seen)}")
    return problems


# --- Prometheus with a given config ------------------------------------------------------------------------


@contextlib.contextmanager
def run_prometheus_with(
    config: Mapping[str, Any], work: Path, listen: str, flags: Sequence[str] = ()
) -> Iterator[str]:
    """Debian's ``prometheus`` with ``config`` (built by the test from a shipped file); yield its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed (scripts/test.sh installs Debian's package)")
    path = work / "prometheus.yml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    argv = [
        binary,
        f"--config.file={path}",
        f"--storage.tsdb.path={work / 'prometheus-data'}",
        f"--web.listen-address={listen}",
        "--log.level=warn",
        *flags,
    ]
    with run_process("prometheus", argv, work, f"http://{listen}/-/ready"):
        yield f"http://{listen}"


def post_json(url: str, payload: Mapping[str, Any]) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)
