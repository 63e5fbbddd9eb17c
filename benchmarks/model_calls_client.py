"""The client side of model calls: what an agent pays for observing them, against the same calls opted out.

Three figures, each a comparison inside one run (rounds interleaved, medians):

* the check every request pays: ``observe_model_call`` on a URL that is not a model call, next to
  ``RequestObserver`` as a whole (the telemetry-on request path's own object), in ns;
* a JSON model call, ``request()`` + ``get_response_json``, observed vs the same call opted out with
  ``_model_call=NOT_A_MODEL_CALL`` (CPU of the process per call: client, and the in-process aiohttp server,
  which is the same for both);
* a streamed model call (100 content chunks) read with ``iter_sse_data``, observed vs opted out, per chunk.

Telemetry is on (SDK providers, in-memory exporter and reader, cleared every round). Port 30860.
Run: ``python3 benchmarks/model_calls_client.py [--calls 400] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

from aiohttp import web

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "src"))
sys.path.insert(0, str(_HERE))

from gym_obs.client import (  # noqa: E402 - after the path set-up
    NOT_A_MODEL_CALL,
    GlobalAIOHTTPAsyncClientConfig,
    close_global_aiohttp_client,
    get_response_json,
    iter_sse_data,
    request,
    set_global_aiohttp_client,
)
from gym_obs.client._observe import RequestObserver  # noqa: E402
from gym_obs.client._options import RequestOptions  # noqa: E402
from gym_obs.client.model_calls import observe_model_call  # noqa: E402
from gym_obs.telemetry.testing import capture_telemetry  # noqa: E402
from model_calls import _JSON_REPLY, _events  # noqa: E402 - the model-call benchmark's replies

PORT = 30860
BASE = f"http://127.0.0.1:{PORT}"
CHUNKS = 100


REPLY = _JSON_REPLY
STREAM = b"".join(_events(CHUNKS))


async def _serve() -> web.AppRunner:
    async def chat(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        if not body.get("stream"):
            return web.Response(body=REPLY, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(req)
        await response.write(STREAM)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PORT).start()
    return runner


async def _json(observed: bool) -> None:
    extra = {} if observed else {"_model_call": NOT_A_MODEL_CALL}
    response = await request("POST", BASE + "/v1/chat/completions", json={"model": "m"}, **extra)
    await get_response_json(response)
    response.release()


async def _sse_call(observed: bool) -> None:
    extra = {} if observed else {"_model_call": NOT_A_MODEL_CALL}
    response = await request(
        "POST", BASE + "/v1/chat/completions", json={"model": "m", "stream": True}, **extra
    )
    async for _data in iter_sse_data(response):
        pass
    response.release()


async def _cpu_per_call(fn: Any, observed: bool, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        await fn(observed)
    return (time.process_time() - start) / calls


def _check_ns() -> tuple[float, float]:
    options = RequestOptions()
    url = BASE + "/verify"
    n = 200_000
    check = min(
        timeit.repeat(lambda: observe_model_call(url, None, None, "127.0.0.1", PORT, "x"), number=n, repeat=5)
    )
    observer = min(timeit.repeat(lambda: RequestObserver("POST", url, options), number=n // 4, repeat=5))
    return check / n * 1e9, observer / (n // 4) * 1e9


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with capture_telemetry() as capture:
        check_ns, observer_ns = _check_ns()
        runner = await _serve()
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
        results: dict[str, list[float]] = {k: [] for k in ("json_on", "json_off", "sse_on", "sse_off")}
        for _ in range(2):  # warm up
            await _json(True), await _json(False), await _sse_call(True), await _sse_call(False)
        for _ in range(args.rounds):
            capture.clear()
            for name, fn, observed, calls in (
                ("json_on", _json, True, args.calls),
                ("json_off", _json, False, args.calls),
                ("sse_on", _sse_call, True, args.calls // 4),
                ("sse_off", _sse_call, False, args.calls // 4),
            ):
                results[name].append(await _cpu_per_call(fn, observed, calls))
        await close_global_aiohttp_client()
        await runner.cleanup()
    med = {k: statistics.median(v) * 1e6 for k, v in results.items()}
    print(f"load average: {os.getloadavg()}")
    print(
        f"route check on a non-model request: {check_ns:.0f} ns "
        f"(RequestObserver as a whole: {observer_ns:.0f} ns)"
    )
    print(
        f"JSON model call, CPU per call: observed {med['json_on']:.1f} us, "
        f"opted out {med['json_off']:.1f} us, +{med['json_on'] - med['json_off']:.1f} us "
        f"(ratio {med['json_on'] / med['json_off']:.3f})"
    )
    per_chunk = (med["sse_on"] - med["sse_off"]) / (CHUNKS + 4)
    print(
        f"SSE model call ({CHUNKS + 4} events), CPU per call: observed {med['sse_on']:.1f} us, opted out "
        f"{med['sse_off']:.1f} us, ratio {med['sse_on'] / med['sse_off']:.3f}, +{per_chunk:.2f} us per event"
    )


if __name__ == "__main__":
    asyncio.run(main())
