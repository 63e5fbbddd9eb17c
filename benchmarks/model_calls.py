"""Model-call layer cost: CPU per JSON call and per streamed chunk, and inter-chunk latency, layer on vs off.

Two parts, each against the same server without the layer in the same run:

* CPU, whole server: the full ASGI app of a ``SimpleServer`` model server (``build_app()``, telemetry on,
  SDK tracer and meter providers exporting nowhere, the contrib SERVER span) driven in-process with
  synthetic ``receive`` / ``send`` (no sockets, so only the server's own work is timed, with
  ``time.thread_time``). Variants are
  the same server with ``model_calls.enabled`` true / false, interleaved, round after round. Per JSON call:
  ``on - off``. Per streamed chunk beyond the first: ``((on - off)[100 chunks] - (on - off)[1 chunk]) / 99``
  (both streams have the same first and final events, so the difference is the per-chunk path).
* CPU, layer alone: the layer around a minimal ASGI handler inside an SDK SERVER span vs the handler alone
  (the whole server is ~20x the layer's cost, so its difference drowns in noise on a busy machine).
  Targets (checked on the layer alone): <= 15 us per JSON call, <= 0.3 us per streamed chunk.
* Latency: two real uvicorn processes (layer on / off) stream 100 chunks 2 ms apart; an aiohttp client
  records the gaps between chunk arrivals. The medians and p99s must match within noise.

Run: ``python3 benchmarks/model_calls.py [--calls 2000] [--rounds 7] [--streams 20] [--port-base N]
[--check]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "src"))
sys.path.insert(0, str(_HERE))

_PORT = 29750  # 29750-29751: inside the model-call tests' range
_CHUNK_GAP_S = 0.002


def _events(content_chunks: int) -> list[bytes]:
    def sse(data: Any) -> bytes:
        return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    usage = {"prompt_tokens": 120, "completion_tokens": content_chunks}
    return [
        sse(chunk({"role": "assistant", "content": ""})),
        *(sse(chunk({"content": f" token{n}"})) for n in range(content_chunks)),
        sse(chunk({}, "stop")),
        sse({"id": "c1", "model": "m", "choices": [], "usage": usage}),
        sse(b"[DONE]"),
    ]


def _json_reply(call_id: str) -> bytes:
    return json.dumps(
        {
            "id": call_id,
            "model": "m",
            "choices": [{"index": 0, "message": {"content": "hello " * 40}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 40},
        }
    ).encode()


# A real reply's id is new every call (no cache of the layer may hit on it): replies cycle through these.
_JSON_REPLIES = itertools.cycle([_json_reply(f"chatcmpl-{n:032x}") for n in range(4096)])
_REQUEST = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi " * 50}]}).encode()


def build_app(layer: bool, port: int, gap_s: float = 0.0) -> Any:
    """The model server's whole ASGI app (telemetry on), with or without the model-call layer."""
    from gym_obs.config import parse_global_config
    from gym_obs.server import SimpleServer

    streams = {n: _events(n) for n in (1, 100)}

    class BenchModel(SimpleServer):
        sessions_enabled = False

        def setup_webserver(self) -> FastAPI:
            app = FastAPI()

            @app.post("/v1/chat/completions")
            async def chat(request: Request) -> Response:
                body = await request.body()
                chunks = streams.get(int(request.query_params.get("chunks", "0")))
                if chunks is None:
                    return Response(next(_JSON_REPLIES), media_type="application/json")

                async def stream() -> Any:
                    for piece in chunks:
                        yield piece
                        if gap_s:
                            await asyncio.sleep(gap_s)

                del body
                return StreamingResponse(stream(), media_type="text/event-stream")

            return app

    config = parse_global_config(
        {
            "telemetry": {"enabled": True, "traces_exporter": "none", "metrics_exporter": "none"},
            "servers": {
                "bench": {
                    "entrypoint": "bench:BenchModel",
                    "server_type": "responses_api_models",
                    "port": port,
                    "model_calls": {"enabled": layer, "model_allow_list": ["m"]},
                }
            },
        }
    )
    return BenchModel("bench", config).build_app()


def build_layer_app(layer: bool) -> Any:
    """The layer alone: a minimal ASGI model handler inside an SDK SERVER span, with or without the layer.

    The whole server costs ~20x more than the layer, so on a loaded machine the full-app difference is
    mostly noise (and app-instance effects); this pair isolates the layer with the same replies.
    """
    from opentelemetry import trace

    from gym_obs.server.model_calls import ModelCallMiddleware
    from gym_obs.telemetry import names

    streams = {n: _events(n) for n in (1, 100)}
    # gym's scope, as the native SERVER span layer's: the span ends when the app returns, as there
    tracer = trace.get_tracer(names.INSTRUMENTATION_SCOPE)
    json_start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"application/json")],
    }
    sse_start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/event-stream")],
    }

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        query = scope["query_string"]
        chunks = streams.get(int(query[7:])) if query else None
        if chunks is None:
            await send(json_start)
            await send({"type": "http.response.body", "body": next(_JSON_REPLIES), "more_body": False})
            return
        await send(sse_start)
        for piece in chunks:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    inner = ModelCallMiddleware(handler, server_name="bench", model_allow_list=["m"]) if layer else handler

    async def app(scope: Any, receive: Any, send: Any) -> None:
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER):
            await inner(scope, receive, send)

    return app


# --- CPU: the ASGI app driven in-process ---------------------------------------------------------------


async def _one_call(app: Any, chunks: int) -> int:
    query = f"chunks={chunks}".encode() if chunks else b""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"bench"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    done = asyncio.Event()
    sent = [False]
    received = 0

    async def receive() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": _REQUEST, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal received
        if message["type"] == "http.response.body":
            received += len(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    await app(scope, receive, send)
    return received


async def _cpu_per_call(app: Any, chunks: int, calls: int) -> float:
    for _ in range(50):
        await _one_call(app, chunks)
    # Start every timed block from a collected heap: a full collection (tens of ms on this heap) then falls
    # in no block, instead of into whichever variant's block the allocation count happens to reach it in.
    gc.collect()
    start = time.thread_time()
    for _ in range(calls):
        await _one_call(app, chunks)
    return (time.thread_time() - start) / calls * 1e6


async def cpu_rounds(calls: int, rounds: int) -> dict[str, list[float]]:
    from server_overhead import _install_sdk  # the same no-op SDK set-up as the server benchmark

    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    _install_sdk()
    variants = {
        "": {True: build_app(True, _PORT), False: build_app(False, _PORT)},
        "alone_": {True: build_layer_app(True), False: build_layer_app(False)},
    }
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for prefix, apps in variants.items():
            for chunks, label in ((0, "json"), (1, "stream1"), (100, "stream100")):
                for layer in (False, True):
                    per_call = await _cpu_per_call(apps[layer], chunks, calls if chunks < 100 else calls // 5)
                    results.setdefault(f"{prefix}{label}_{'on' if layer else 'off'}", []).append(per_call)
    return results


def _costs(cpu: dict[str, list[float]], prefix: str) -> tuple[float, float]:
    """(per JSON call, per streamed chunk beyond the first), medians of the rounds' paired differences."""

    def layer(label: str, i: int) -> float:
        return cpu[f"{prefix}{label}_on"][i] - cpu[f"{prefix}{label}_off"][i]

    rounds = range(len(cpu[f"{prefix}json_on"]))
    json_cost = statistics.median(layer("json", i) for i in rounds)
    per_chunk = statistics.median((layer("stream100", i) - layer("stream1", i)) / 99 for i in rounds)
    return json_cost, per_chunk


def _install_quiet_sdk() -> None:
    """SDK providers with nothing that wakes on a timer, for instruction counts: a periodic reader's tick
    (slow under valgrind) would land in one run's count and not in the other's."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def only(layer: bool, calls: int, chunks: int) -> None:
    """``--only``: 200 warm-up calls and ``calls`` more of the layer-alone pair's one variant, untimed; run
    it under ``valgrind --tool=cachegrind`` at two ``--calls`` values (see the README)."""
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    _install_quiet_sdk()
    build_app(True, _PORT)  # telemetry on (the layer's instruments), as in cpu_rounds
    app = build_layer_app(layer)
    for _ in range(200):
        await _one_call(app, chunks)
    gc.collect()
    for _ in range(calls):
        await _one_call(app, chunks)


# --- latency: real uvicorn processes -----------------------------------------------------------------------


def _serve(layer: bool, port: int) -> None:
    import uvicorn

    from server_overhead import _install_sdk

    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    _install_sdk()
    app = build_app(layer, port, gap_s=_CHUNK_GAP_S)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")


def _start(layer: bool, port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", "on" if layer else "off", "--port", str(port)]
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=1):
                return process
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError(f"server on port {port} did not start") from None
            time.sleep(0.1)


async def _gaps(port: int, streams: int) -> list[float]:
    import aiohttp

    gaps: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(streams):
            url = f"http://127.0.0.1:{port}/v1/chat/completions?chunks=100"
            async with session.post(url, data=_REQUEST) as response:
                last: float | None = None
                async for _piece in response.content.iter_any():
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
    return gaps


def latency(streams: int, port: int = _PORT) -> dict[str, list[float]]:
    processes = {layer: _start(layer, port + int(layer)) for layer in (False, True)}
    try:
        result: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(3):  # interleaved
            for layer in (False, True):
                gaps = asyncio.run(_gaps(port + int(layer), streams))
                result["on" if layer else "off"].extend(gaps)
        return result
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(10)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--serve", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--only", choices=("on", "off"), help="one layer-alone variant, --calls calls, untimed (valgrind)"
    )
    parser.add_argument("--chunks", type=int, default=0, help="with --only: 0 (JSON), 1 or 100")
    parser.add_argument("--port", type=int, default=_PORT, help=argparse.SUPPRESS)
    parser.add_argument("--port-base", type=int, default=_PORT, help="the latency part's two ports")
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve == "on", args.port)
        return 0
    if args.only:
        asyncio.run(only(args.only == "on", args.calls, args.chunks))
        return 0

    print("load average:", os.getloadavg())
    cpu = asyncio.run(cpu_rounds(args.calls, args.rounds))
    med = {key: statistics.median(values) for key, values in cpu.items()}
    print(f"{'case':<18}{'off us/call':>14}{'on us/call':>14}{'layer us':>12}")
    for prefix, title in (("", "server"), ("alone_", "alone")):
        for label in ("json", "stream1", "stream100"):
            off, on = med[f"{prefix}{label}_off"], med[f"{prefix}{label}_on"]
            print(f"{title + ' ' + label:<18}{off:>14.1f}{on:>14.1f}{on - off:>12.2f}")
    json_cost, per_chunk = _costs(cpu, "alone_")
    server_json, server_chunk = _costs(cpu, "")
    print(f"server: json_call_cost_us={server_json:.2f} stream_chunk_cost_us={server_chunk:.3f} (noisy)")
    print(f"json_call_cost_us={json_cost:.2f} (target <= 15)")
    print(f"stream_chunk_cost_us={per_chunk:.3f} (target <= 0.3)")

    gaps = latency(args.streams, args.port_base)
    for key in ("off", "on"):
        values = gaps[key]
        print(
            f"inter-chunk gap layer {key:>3}: median {statistics.median(values) * 1e3:.3f} ms, "
            f"p99 {_p(values, 0.99) * 1e3:.3f} ms over {len(values)} gaps"
        )
    print("load average:", os.getloadavg())
    ok = json_cost <= 15 and per_chunk <= 0.3
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
