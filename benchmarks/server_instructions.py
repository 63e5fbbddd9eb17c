"""Instructions per request of the gym layers with telemetry off, counted by cachegrind (deterministic).

CPU time on a shared machine moves by more than the gym layers cost; an instruction count does not. Each
variant's app (the same ones ``server_overhead.py`` serves: ``bare`` FastAPI, ``simple_off``
``SimpleServer.build_app()`` with telemetry off) is driven in process by a plain asyncio loop: 16 workers,
each running its requests one after another, each request in its own task with a fake uvicorn request cycle
(``disconnected``/``response_started`` flags, and ``on_response`` a method of a protocol whose ``tasks``
holds the running request tasks, so the disconnect step takes its uvicorn path), as uvicorn does.
The sweeper's interval is made long: the real server sweeps once per ~200 requests (~0 per request), while
under valgrind it would run every few requests. A run of ``--warmup`` + ``--requests`` requests minus a run
of the warm-up alone, divided by ``--requests``, is the cost per request; ASLR is off (``setarch -R``) so
runs repeat to within ~0.3%.

System calls are not counted: ``strace -c -f -p <server pid>`` on a ``server_overhead.py --serve`` process
counts those (the gym layers made one ``getpid`` per request before this was measured).

Run: ``python3 benchmarks/server_instructions.py [--variants bare simple_off] [--requests 2000]``
(needs ``valgrind`` and ``setarch``; ~1 minute per variant).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

_WORKERS = 16
_PORT = 31100  # only written into the config and the scope; nothing listens
_BODY = {"type": "http.request", "body": b"", "more_body": False}
_HEADERS = (
    (b"host", b"127.0.0.1:31100"),
    (b"user-agent", b"Python/3.11 aiohttp/3.10.10"),
    (b"accept", b"*/*"),
    (b"accept-encoding", b"gzip, deflate"),
)


class _Protocol:
    """What the gym layers see of uvicorn's connection protocol: its server's set of request tasks."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def on_response_complete(self) -> None:
        return None


_PROTOCOL = _Protocol()


class _Cycle:
    """What the gym layers see of uvicorn's request cycle: ``receive`` is its method, with its flags, and
    ``on_response`` its protocol's (whose ``tasks`` holds every running request's task)."""

    __slots__ = ("disconnected", "on_response", "response_started", "scope", "sent")

    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope
        self.disconnected = False
        self.response_started = False
        self.on_response = _PROTOCOL.on_response_complete
        self.sent = 0

    async def run_asgi(self, app: Any) -> None:
        await app(self.scope, self.receive, self.send)

    async def receive(self) -> dict[str, Any]:
        return _BODY

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.response_started = True
        self.sent += 1


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", _PORT),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "GET",
        "root_path": "",
        "path": "/ping",
        "raw_path": b"/ping",
        "query_string": b"",
        "headers": list(_HEADERS),
        "state": {},
    }


async def _drive(app: Any, requests: int) -> None:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    await queue.put({"type": "lifespan.startup"})
    lifespan_scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    lifespan = asyncio.ensure_future(app(lifespan_scope, queue.get, lifespan_send))
    await started.wait()
    loop = asyncio.get_running_loop()

    async def worker(count: int) -> None:
        for _ in range(count):
            cycle = _Cycle(_scope())
            task = loop.create_task(cycle.run_asgi(app))  # as uvicorn runs a request, and keeps its task
            task.add_done_callback(_PROTOCOL.tasks.discard)
            _PROTOCOL.tasks.add(task)
            await task
            if cycle.sent != 2:
                raise RuntimeError("the route did not answer")

    await asyncio.gather(*(worker(requests // _WORKERS) for _ in range(_WORKERS)))
    await queue.put({"type": "lifespan.shutdown"})
    await lifespan


def _serve_in_process(variant: str, requests: int) -> None:
    import server_overhead
    from gym_obs.server import SimpleServer

    SimpleServer.disconnect_watch_delay_s = 3600.0
    app = server_overhead._fastapi_app() if variant == "bare" else server_overhead._simple_app(variant, _PORT)
    asyncio.run(_drive(app, requests))


def _instructions(variant: str, requests: int) -> int:
    command = ["setarch", platform.machine(), "-R", "valgrind", "--tool=cachegrind", "--cache-sim=no"]
    command += ["--cachegrind-out-file=/dev/null", sys.executable, __file__, "--run", variant, str(requests)]
    environment = {**os.environ, "PYTHONHASHSEED": "0", "OTEL_SEMCONV_STABILITY_OPT_IN": "http"}
    output = subprocess.run(command, capture_output=True, text=True, env=environment, check=True).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", output)
    if found is None:
        raise RuntimeError(f"no instruction count from cachegrind:\n{output}")
    return int(found.group(1).replace(",", ""))


def main(argv: Sequence[str] | None = None) -> int:
    help_format = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=help_format)
    variants = ("bare", "simple_off")
    parser.add_argument("--variants", nargs="+", default=list(variants), choices=variants)
    parser.add_argument("--warmup", type=int, default=496)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--run", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup % _WORKERS or args.requests % _WORKERS:
        parser.error(f"--warmup and --requests must be multiples of {_WORKERS} (the workers share them)")
    if args.run:
        _serve_in_process(args.run[0], int(args.run[1]))
        return 0
    per_request: dict[str, float] = {}
    for variant in args.variants:
        alone = _instructions(variant, args.warmup)
        total = _instructions(variant, args.warmup + args.requests)
        per_request[variant] = (total - alone) / args.requests
        print(f"{variant:12s} {per_request[variant]:10,.0f} instructions per request")
    if {"bare", "simple_off"} <= per_request.keys():
        added = per_request["simple_off"] - per_request["bare"]
        print(f"gym layers   {added:10,.0f} ({per_request['simple_off'] / per_request['bare']:.3f} x bare)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
