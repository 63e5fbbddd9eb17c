"""Server overhead: CPU per request of a trivial route, read from /proc/<pid>/stat of the server process.

Each variant is one uvicorn server process (httptools, uvloop, one worker, access log off, the same uvicorn
settings for all); load comes from a separate process (aiohttp, keep-alive, ``--concurrency`` workers), so
only the server's own CPU is counted (the process's CPU clock, in ns: all its threads, the span exporter
thread included):

* ``bare``           FastAPI, its built-in telemetry off
* ``contrib``        FastAPI + opentelemetry-instrumentation-fastapi (receive/send spans excluded), SDK tracer
                     provider (BatchSpanProcessor, no-op exporter) and SDK meter provider
* ``native``         FastAPI + gym_obs's native SERVER span (``server/_span.py``), the same SDK set-up
* ``simple_off``     ``SimpleServer.build_app()`` with telemetry off
* ``simple_on``      ``SimpleServer.build_app()`` with telemetry on (the native span, the default), same SDK
* ``simple_contrib`` ``SimpleServer.build_app()`` with ``server_instrumentation: contrib``, same SDK

Variants run interleaved, round after round, after a warm-up; the table shows medians over rounds. The
ratios are the medians of the per-round ratios (each round's variants ran back to back, so a round's ratio
cancels most of the machine's drift). Within a round the variants a ratio compares run next to each other
(``_MEASURE_ORDER``), and every other round runs them in reverse, so a drift in one direction (the load
of the round before, the machine warming) does not always favour the same side. Headline figures and
targets:

* ``native_vs_contrib`` = (native - bare) / (contrib - bare): what the native span adds against what the
  contrib instrumentation adds to the same app; target <= 0.45;
* ``simple_off_vs_bare`` = simple_off / bare: the gym layers with telemetry off; target <= 1.05;
* ``simple_native_vs_contrib`` = (simple_on - simple_off) / (simple_contrib - simple_off): the same ratio
  inside a full ``SimpleServer`` (the gym layers' own telemetry, e.g. the session span attribute, in both).

Run: ``python3 benchmarks/server_overhead.py [--requests 10000] [--concurrency 16] [--rounds 9]
[--port-base 24800] [--check]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_SRC = _HERE.parent / "src"
sys.path.insert(0, str(_SRC))

VARIANTS = ("bare", "contrib", "native", "simple_off", "simple_on", "simple_contrib")
_SDK_VARIANTS = ("contrib", "native", "simple_on", "simple_contrib")
#: the order variants run in a round (reversed every other round): the ones a ratio compares side by side
_MEASURE_ORDER = ("simple_contrib", "simple_on", "simple_off", "bare", "native", "contrib")
_BASE_PORT = 24800  # 24800-24805: inside the server runtime's test range
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_ROUTE = "/ping"


# --- server process ----------------------------------------------------------------------------------------


def _install_sdk() -> None:
    """SDK tracer and meter providers exporting nowhere (the cost of recording, not of shipping)."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class _NoSpans(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    class _NoMetrics(MetricExporter):
        def export(
            self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            return None

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_NoSpans()))
    trace.set_tracer_provider(provider)
    reader = PeriodicExportingMetricReader(_NoMetrics(), export_interval_millis=1000)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


def _fastapi_app() -> Any:
    from fastapi import FastAPI

    from gym_obs.server._native_telemetry import disable_native_telemetry

    app = FastAPI()

    @app.get(_ROUTE)
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    disable_native_telemetry(app)
    return app


def _native_app() -> Any:
    """The bare app under the native SERVER-span layer, with gym telemetry on the SDK set-up above."""
    from gym_obs.config import TelemetryConfig
    from gym_obs.server._span import ServerSpanMiddleware
    from gym_obs.telemetry.setup import setup_telemetry

    setup_telemetry(
        "bench", "resources_servers", config=TelemetryConfig(enabled=True, traces_exporter="none")
    )
    return ServerSpanMiddleware(_fastapi_app())


def _simple_app(variant: str, port: int) -> Any:
    from fastapi import FastAPI

    from gym_obs.config import parse_global_config
    from gym_obs.server import SimpleServer

    class BenchServer(SimpleServer):
        def setup_webserver(self) -> FastAPI:
            app = FastAPI()

            @app.get(_ROUTE)
            async def ping() -> dict[str, bool]:
                return {"ok": True}

            return app

    config = parse_global_config(
        {
            "telemetry": {
                "enabled": variant != "simple_off",
                "traces_exporter": "none",
                "metrics_exporter": "none",
                "server_instrumentation": "contrib" if variant == "simple_contrib" else "native",
            },
            "servers": {
                "bench": {"entrypoint": "bench:BenchServer", "server_type": "resources_servers", "port": port}
            },
        }
    )
    return BenchServer("bench", config).build_app()


def _serve(variant: str, port: int) -> None:
    import uvicorn

    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    if variant in _SDK_VARIANTS:
        _install_sdk()
    if variant in ("bare", "contrib"):
        app = _fastapi_app()
        if variant == "contrib":
            from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

            FastAPIInstrumentor.instrument_app(app, exclude_spans=["receive", "send"])
    elif variant == "native":
        app = _native_app()
    else:
        app = _simple_app(variant, port)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        http="httptools",
        loop="uvloop",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        lifespan="on",
    )


# --- load process ------------------------------------------------------------------------------------------


async def _load(url: str, requests: int, concurrency: int) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(count: int) -> None:
            for _ in range(count):
                async with session.get(url) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{url} answered {response.status}")

        share, extra = divmod(requests, concurrency)
        await asyncio.gather(*(worker(share + (1 if i < extra else 0)) for i in range(concurrency)))


# --- driver ------------------------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid``, all its threads (exited ones too), in nanoseconds where Linux gives it.

    A round takes ~0.6 s of server CPU, so clock ticks (``/proc/<pid>/stat``, 10 ms) would quantize each
    round's figure by ~1.6% -- a third of the 5% the ``simple_off_vs_bare`` target allows. Linux keeps a
    CPU clock per process readable by any process of the same user: ``clock_gettime`` with the id
    ``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)`` (what glibc's ``clock_getcpuclockid`` returns).
    """
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:  # not Linux, or no such clock: clock ticks
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime (fields 14 and 15)


@contextlib.contextmanager
def _servers(port_base: int = _BASE_PORT) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], int]]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_SRC), os.environ.get("PYTHONPATH", "")])}
    running: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for index, variant in enumerate(VARIANTS):
            port = port_base + index
            process = subprocess.Popen(
                [sys.executable, __file__, "--serve", variant, "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            running[variant] = (process, port)
        for variant, (process, port) in running.items():
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{_ROUTE}", timeout=1):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{variant} server did not start") from None
                    time.sleep(0.1)
        yield running
    finally:
        for process, _ in running.values():
            process.terminate()
        for process, _ in running.values():
            process.wait(timeout=10)


def _drive(port: int, requests: int, concurrency: int) -> None:
    url = f"http://127.0.0.1:{port}{_ROUTE}"
    cmd = [
        sys.executable,
        __file__,
        "--load",
        url,
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
    ]
    subprocess.run(cmd, check=True)


def _paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def _added_ratio(on: list[float], other: list[float], base: list[float]) -> float:
    """Median over rounds of (on - base) / (other - base): what one layer adds against another (NaN when
    no round measured ``other`` above ``base``, as in a run too short for the clock's ticks)."""
    ratios = [(a - c) / (b - c) for a, b, c in zip(on, other, base, strict=True) if b > c]
    return statistics.median(ratios) if ratios else math.nan


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--port-base",
        type=int,
        default=_BASE_PORT,
        help=f"the servers listen on base + 0..{len(VARIANTS) - 1}, one per variant (default {_BASE_PORT})",
    )
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.port)
        return 0
    if args.load:
        asyncio.run(_load(args.load, args.requests, args.concurrency))
        return 0

    per_request: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with _servers(args.port_base) as running:
        for process, port in running.values():  # warm-up: imports, first-request paths, pools
            _drive(port, max(500, args.requests // 5), args.concurrency)
            del process
        for round_index in range(args.rounds):
            for variant in _MEASURE_ORDER if round_index % 2 == 0 else reversed(_MEASURE_ORDER):
                process, port = running[variant]
                before = _cpu_seconds(process.pid)
                _drive(port, args.requests, args.concurrency)
                per_request[variant].append((_cpu_seconds(process.pid) - before) / args.requests)

    medians = {variant: statistics.median(values) for variant, values in per_request.items()}
    print(f"server CPU per request, median of {args.rounds} rounds x {args.requests} requests")
    print(f"{'variant':<12} {'µs/request':>11} {'x bare':>8}  rounds (µs)")
    for variant in VARIANTS:
        rounds = " ".join(f"{value * 1e6:.1f}" for value in per_request[variant])
        relative = medians[variant] / medians["bare"]
        print(f"{variant:<12} {medians[variant] * 1e6:>11.1f} {relative:>8.2f}  {rounds}")
    rounds = per_request
    off_ratio = _paired_ratio(rounds["simple_off"], rounds["bare"])
    simple_ratio = _added_ratio(rounds["simple_on"], rounds["simple_contrib"], rounds["simple_off"])
    ratio = _added_ratio(rounds["native"], rounds["contrib"], rounds["bare"])
    print(f"simple_off_vs_bare={off_ratio:.3f} (target <= 1.05)")
    print(f"simple_native_vs_contrib={simple_ratio:.3f}")
    print(f"native_vs_contrib={ratio:.3f} (target <= 0.45)")
    if args.check and (ratio > 0.45 or off_ratio > 1.05):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
