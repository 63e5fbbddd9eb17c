"""Client overhead: CPU µs that gym_obs adds per request, against bare aiohttp and against
opentelemetry-instrumentation-aiohttp-client, on both client paths.

64 concurrent workers send 5,000 GETs per round to a local aiohttp server that runs in a separate process
(so the client's CPU time is what is measured). Variants run interleaved, round after round, and the table
shows medians over rounds:

* ``bare``        a plain ``aiohttp.ClientSession`` with the same connector settings as gym_obs' pool
* ``contrib``     ``opentelemetry-instrumentation-aiohttp-client``'s trace config on a bare session, with
                  the same SDK providers (it always injects ``traceparent`` and makes its span current)
* ``int_off``     the internal path, telemetry off: ``ServerClient.get(name, path)`` to a gym server of
                  the global config (``request(..., _internal=True)``)
* ``int_on``      the same with telemetry on: SDK tracer provider (BatchSpanProcessor, no-op exporter)
                  and SDK meter provider; the CLIENT span is opened and made current before the attempt
                  and its ``traceparent`` injected, as on every gym hop; one duration point per attempt
* ``ext_off``     the external path, telemetry off: ``request("GET", url)`` to a non-gym host
* ``ext_on``      the external path with telemetry on: no trace context goes to a non-gym host, so the
                  span is written in one go at the end (no context attach, no inject)

Added µs = variant µs − bare µs (client CPU time per request). Like is compared with like: contrib injects
trace context into every request, and so does the internal path, whose ratio is the headline
``overhead_ratio_vs_contrib=<int_on added / contrib added>`` (target ≤ 0.5); the external path's is
``external_overhead_ratio_vs_contrib=``. ``gym_off_overhead_pct=`` is the internal path's telemetry-off
overhead in % of bare (target ≤ 5%), ``external_gym_off_overhead_pct=`` the external path's.

Like with like, also in what is current: every request runs inside a sampled parent span, as every gym
hop does (the agent's SERVER span, or the harness's rollout span). Both instrumentations then join that
trace, and both duration points are recorded under a sampled span, so both take an exemplar (gym's
points at its CLIENT span, current during the attempt; contrib records after detaching its span, so its
exemplar points at the parent). ``--no-parent`` starts a trace per request instead: then contrib's
point finds no span and skips the exemplar work that gym's internal path still does, a difference no
deployment has. Each round starts from a collected heap and flushes the span processor inside its own
window (CPU time counts every thread): no variant pays for the previous one's spans.

By default every variant sends the same request (contrib and the internal path add ``traceparent``).
``--rollout`` runs all of them inside a rollout, as an agent's hops run: the internal path then adds the
``X-NG-Rollout-Id`` header and the ``gym.rollout.id`` span attribute, and ``bare`` and ``contrib`` send the
same header (a rollout's hop needs it whatever the client); the external path never sends it (it goes only
to gym servers), so in that mode the external rows are measured against a bare request with one header
more than theirs.

Run: ``python3 benchmarks/client_overhead.py [--requests 5000] [--concurrency 64] [--rounds 7]
[--port-base 22950] [--rollout] [--no-parent]`` (``--port`` is an alias of ``--port-base``: the server's
port). ``--only VARIANT`` runs one variant once and prints nothing: the way to count its instructions
(``valgrind --tool=callgrind`` at two ``--requests`` values, best with ``--concurrency 1``; the warm-up
runs ``min(requests, 1000)`` requests too, so 300 and 900 differ by 1,200; the README has the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "src"))

from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import metrics as otel_metrics  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from gym_obs.client import ServerClient, http_client  # noqa: E402
from gym_obs.client.pool import make_connector  # noqa: E402
from gym_obs.config import GlobalAIOHTTPAsyncClientConfig, GlobalConfig, TelemetryConfig  # noqa: E402
from gym_obs.telemetry import names  # noqa: E402
from gym_obs.telemetry._state import STATE  # noqa: E402
from gym_obs.telemetry.propagation import rollout_context  # noqa: E402
from gym_obs.telemetry.setup import setup_telemetry  # noqa: E402

Get = Callable[[str], Awaitable[None]]
VARIANTS = ("bare", "contrib", "int_off", "int_on", "ext_off", "ext_on")
_SERVER_NAME = "bench_server"
_ROLLOUT_ID = "bench-rollout-0001"


class _NoopExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _serve(port: int) -> None:
    from aiohttp import web

    body = b'{"ok":true}'

    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/item", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)


def _start_server(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"benchmark server did not start on port {port}")


async def _round(get: Get, url: str, requests: int, concurrency: int, flush: Callable[[], object]) -> float:
    """Client CPU µs per request for one round.

    CPU time counts every thread of the process, so each round starts from a collected heap and ends by
    flushing the span processor inside its own window: a variant pays for its own spans' export and
    garbage, never for the previous variant's.
    """
    remaining = iter(range(requests))

    async def worker() -> None:
        for _ in remaining:
            await get(url)

    gc.collect()
    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    flush()
    return (time.process_time() - cpu) / requests * 1e6


def _install_sdk() -> tuple[TracerProvider, MeterProvider]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_NoopExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    trace.set_tracer_provider(tracer_provider)
    otel_metrics.set_meter_provider(meter_provider)
    return tracer_provider, meter_provider


async def _main(args: argparse.Namespace) -> list[str]:
    from opentelemetry.instrumentation.aiohttp_client import create_trace_config

    tracer_provider, meter_provider = _install_sdk()
    handle = setup_telemetry("bench", config=TelemetryConfig(enabled=True))  # reuses the providers above
    on_state = STATE.snapshot()
    off_state = {**on_state, "enabled": False}
    STATE.restore(off_state)

    cfg = GlobalAIOHTTPAsyncClientConfig()
    http_client.set_global_aiohttp_client(cfg, workers=1)

    def session(trace_configs: list[aiohttp.TraceConfig] | None = None) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=make_connector(cfg, "data", workers=1),
            timeout=aiohttp.ClientTimeout(),
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=trace_configs,
        )

    bare = session()
    contrib = session([create_trace_config(tracer_provider=tracer_provider, meter_provider=meter_provider)])

    rollout_headers = {names.ROLLOUT_ID_HEADER: _ROLLOUT_ID} if args.rollout else None

    async def get_bare(url: str) -> None:
        async with bare.get(url, headers=rollout_headers) as response:
            await response.read()

    async def get_contrib(url: str) -> None:
        async with contrib.get(url, headers=rollout_headers) as response:
            await response.read()

    async def get_gym(url: str) -> None:
        response = await http_client.request("GET", url)
        try:
            await response.read()
        finally:
            response.release()

    server = {"entrypoint": "bench.module:Server", "server_type": "resources_servers", "port": args.port_base}
    servers = ServerClient(GlobalConfig.model_validate({"servers": {_SERVER_NAME: server}}))

    async def get_internal(_url: str) -> None:
        response = await servers.get(_SERVER_NAME, "/item")
        try:
            await response.read()
        finally:
            response.release()

    getters: dict[str, tuple[Get, dict[str, object]]] = {
        "bare": (get_bare, off_state),
        "contrib": (get_contrib, off_state),
        "int_off": (get_internal, off_state),
        "int_on": (get_internal, on_state),
        "ext_off": (get_gym, off_state),
        "ext_on": (get_gym, on_state),
    }
    url = f"http://127.0.0.1:{args.port_base}/item"
    variants = VARIANTS if args.only is None else (args.only,)
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    # Every worker task inherits the rollout id and the parent span (context variables).
    rollout = rollout_context(_ROLLOUT_ID if args.rollout else None)
    rollout.__enter__()
    parent = tracer_provider.get_tracer("client_overhead").start_span("parent") if args.parent else None
    parent_token = otel_context.attach(trace.set_span_in_context(parent)) if parent is not None else None
    try:
        for name in variants:  # warm-up: connections opened, caches filled, code paths compiled
            get, state = getters[name]
            STATE.restore(state)
            await _round(get, url, min(args.requests, 1000), args.concurrency, tracer_provider.force_flush)
        if args.only is not None:  # one variant, for an instruction count (see the README)
            await _round(get, url, args.requests, args.concurrency, tracer_provider.force_flush)
            return []
        for round_index in range(args.rounds):
            # Alternate the order so that no variant always runs right after another one.
            for name in VARIANTS if round_index % 2 == 0 else tuple(reversed(VARIANTS)):
                get, state = getters[name]
                STATE.restore(state)
                cpu_us = await _round(get, url, args.requests, args.concurrency, tracer_provider.force_flush)
                results[name].append(cpu_us)
    finally:
        if parent_token is not None and parent is not None:
            otel_context.detach(parent_token)
            parent.end()
        rollout.__exit__(None, None, None)
        STATE.restore(off_state)
        await bare.close()
        await contrib.close()
        await http_client.close_global_aiohttp_client()
        handle.shutdown()
        tracer_provider.shutdown()
        meter_provider.shutdown()
    return _report(results, args)


def _report(results: dict[str, list[float]], args: argparse.Namespace) -> list[str]:
    """Medians over rounds. Added µs are medians of per-round differences to ``bare`` (each round runs
    every variant back to back, so drift in machine load cancels out of the differences)."""
    base = results["bare"]
    added = {name: [v - b for v, b in zip(results[name], base, strict=True)] for name in VARIANTS}
    bare_median = statistics.median(base)
    lines = [
        f"client_overhead: {args.requests} GETs x {args.rounds} rounds, {args.concurrency} workers, "
        f"rollout {'on' if args.rollout else 'off'}, parent span {'on' if args.parent else 'off'}, "
        f"python {sys.version.split()[0]}, "
        f"aiohttp {aiohttp.__version__}, {os.cpu_count()} CPUs, loadavg {_loadavg()}",
        f"{'variant':<10} {'cpu_us/req':>11} {'added_us':>9} {'added_%':>8}   rounds (cpu_us/req)",
    ]
    for name in VARIANTS:
        median_added = statistics.median(added[name])
        rounds = " ".join(f"{v:.1f}" for v in results[name])
        lines.append(
            f"{name:<10} {statistics.median(results[name]):>11.1f} {median_added:>9.1f} "
            f"{median_added / bare_median * 100:>7.1f}%   {rounds}"
        )
    contrib_added = statistics.median(added["contrib"])

    def ratio(name: str) -> float:
        on_added = statistics.median(added[name])
        return on_added / contrib_added if contrib_added > 0 else float("inf")

    def off_pct(name: str) -> float:
        return statistics.median(added[name]) / bare_median * 100

    lines.append(f"external_gym_off_overhead_pct={off_pct('ext_off'):.1f}")
    lines.append(f"external_overhead_ratio_vs_contrib={ratio('ext_on'):.3f}")
    lines.append(f"gym_off_overhead_pct={off_pct('int_off'):.1f}")
    lines.append(f"overhead_ratio_vs_contrib={ratio('int_on'):.3f}")
    return lines


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--port-base", "--port", dest="port_base", type=int, default=22950,
        help="the benchmark server's port (--port: the old name)",
    )
    parser.add_argument(
        "--rollout", action="store_true",
        help="every variant inside a rollout (the internal path adds X-NG-Rollout-Id and gym.rollout.id)",
    )
    parser.add_argument(
        "--no-parent", dest="parent", action="store_false",
        help="no parent span: every request starts a trace (see the module doc for what that skews)",
    )
    parser.add_argument(
        "--only", choices=VARIANTS, default=None,
        help="run one variant once (warm-up, then --requests requests) and report nothing",
    )
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        _serve(args.serve)
        return 0
    server = _start_server(args.port_base)
    try:
        lines = asyncio.run(_main(args))
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(5)
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
