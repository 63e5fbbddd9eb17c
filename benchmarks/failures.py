"""Failure reports: the CPU cost of carrying a failure across one HTTP hop, as the server and caller do it.

For a 3-event chain (``agent_request_failed`` <- ``verifier_error`` <- ``ZeroDivisionError``) one hop is:

* server: the real ``FailureReplyMiddleware`` (pure ASGI, driven in process) catches the failure and builds
  its reply once: the failure log, one walk of the chain (``observe_failure`` returns it, the log's report
  is built around it), the JSON body with the report, the ``X-NG-Failure-Report`` header encoded once
  (also timed without the ASGI call, to compare with the same work done the old way);
* caller: one report decoded and validated (the body's; the header is only the fallback) and rebuilt.

Baselines in the same run: the hop as it was done before (the chain walked twice on the server, by
``observe_failure`` and again by the log's report; both the body and the header report decoded on the
caller), ``format_exception`` (shipping a failure as a traceback string) and an orjson round trip of the
same records (the floor for any JSON encoding). The single steps are timed too. Each case runs
``--iterations`` calls per round, rounds interleaved; the table shows the median µs per call over
``--rounds`` rounds, and ``hop / hop before`` the median of the per-round ratios.
The last line is ``failures_pipeline_us=<median of the hop>`` (target < 100 µs).

Run: ``python3 benchmarks/failures.py [--iterations 2000] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "src"))

import orjson  # noqa: E402

from gym_obs.client.boundary import report_from_reply_body  # noqa: E402
from gym_obs.failures import (  # noqa: E402
    FAILURE_REPORT_BODY_KEY,
    FAILURE_REPORT_HEADER,
    NgFailureEvent,
    decode_failure_report,
    encode_failure_report,
    failure_report_for,
    observe_failure,
    rebuild_failure,
    request_failure_log,
)
from gym_obs.failures.transport import report_from_reply_header  # noqa: E402
from gym_obs.server import FailureReplyMiddleware  # noqa: E402
from gym_obs.server._exchange import Exchange  # noqa: E402
from gym_obs.server._failure_reply import failure_reply  # noqa: E402

TARGET_US = 100.0
_SCOPE: dict[str, Any] = {"type": "http", "method": "POST", "path": "/run", "headers": []}


def _chain() -> NgFailureEvent:
    try:
        try:
            try:
                _ = 1 / 0
            except ZeroDivisionError as zde:
                raise NgFailureEvent(
                    "verifier_error", "verifier crashed on task 17", boundary="resources_server",
                    stage="verification", http_status=500, details={"verifier": "math", "task": 17},
                ) from zde
        except NgFailureEvent as remote:
            raise NgFailureEvent(
                "agent_request_failed", "POST /verify failed", boundary="agent", http_status=500
            ) from remote
    except NgFailureEvent as final:
        return final
    raise AssertionError("unreachable")


def _time(fn: Callable[[], Any], iterations: int) -> float:
    """µs per call over ``iterations`` calls."""
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - start) / iterations * 1e6


def _time_async(loop: asyncio.AbstractEventLoop, fn: Callable[[], Awaitable[Any]]) -> Callable[[int], float]:
    async def calls(iterations: int) -> float:
        start = time.perf_counter()
        for _ in range(iterations):
            await fn()
        return (time.perf_counter() - start) / iterations * 1e6

    return lambda iterations: loop.run_until_complete(calls(iterations))


class _Reply:
    """What the server sent for one request: the start message and the body."""

    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self.messages[0]["headers"]}

    @property
    def body(self) -> bytes:
        body: bytes = self.messages[1]["body"]
        return body


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    logging.getLogger("gym_obs.server").setLevel(logging.CRITICAL)  # the reply's log line: not measured

    final = _chain()

    async def failing_app(scope: Any, receive: Any, send: Any) -> None:
        raise final.with_traceback(None)  # the same event every time; its traceback must not grow

    middleware = FailureReplyMiddleware(failing_app, boundary="agent")

    async def server_reply() -> _Reply:
        reply = _Reply()
        await middleware(dict(_SCOPE), _no_body, reply.send)
        return reply

    def server_reply_once() -> tuple[bytes, str]:
        """What the layer builds, without the ASGI call: observe + report (one walk), body, header."""
        exchange = Exchange()
        with request_failure_log() as log:
            _, reply_body = failure_reply(final, log, exchange)
        assert exchange.final_report is not None
        return reply_body, encode_failure_report(exchange.final_report)

    def server_reply_before() -> tuple[bytes, str]:
        """The reply as built before: observe (one walk), the log's report (a second walk), body, header."""
        with request_failure_log() as log:
            observe_failure(final)
            report = log.report(final=final)
        assert report is not None
        body = orjson.dumps({"detail": str(final), FAILURE_REPORT_BODY_KEY: report.to_payload()})
        return body, encode_failure_report(report)

    loop = asyncio.new_event_loop()
    sample = loop.run_until_complete(server_reply())
    body, headers = sample.body, sample.headers
    assert sample.messages[0]["status"] == 500

    def caller() -> NgFailureEvent | None:
        report = report_from_reply_body(body)  # the body's report; the header only if it has none
        if report is None or report.failure_id is None:
            report = report_from_reply_header(headers)
        return rebuild_failure(report) if report is not None else None

    def caller_before() -> NgFailureEvent | None:
        from_body = report_from_reply_body(body)
        from_header = report_from_reply_header(headers)
        chosen = from_body if from_body is not None and from_body.failure_id else from_header
        return rebuild_failure(chosen) if chosen is not None else None

    rebuilt = caller()
    assert rebuilt is not None and rebuilt.event_id == final.event_id
    before_body, before_header = server_reply_before()
    assert orjson.loads(before_body)[FAILURE_REPORT_BODY_KEY] == orjson.loads(body)[FAILURE_REPORT_BODY_KEY]
    assert before_header == headers[FAILURE_REPORT_HEADER.lower()]
    assert server_reply_once()[1] == before_header

    async def hop() -> None:
        await server_reply()
        caller()

    def hop_before() -> None:
        server_reply_before()
        caller_before()

    report = failure_report_for(final)
    value = encode_failure_report(report)
    decoded = decode_failure_report(value)
    payload = report.to_payload()

    cases: dict[str, Callable[[int], float]] = {
        "server: failure reply (ASGI layer)": _time_async(loop, server_reply),
        "server: the same reply, no ASGI call": lambda n: _time(server_reply_once, n),
        "caller: one report decoded": lambda n: _time(caller, n),
        "hop (server + caller)": _time_async(loop, hop),
        "before: server, chain walked twice": lambda n: _time(server_reply_before, n),
        "before: caller, two reports decoded": lambda n: _time(caller_before, n),
        "before: hop": lambda n: _time(hop_before, n),
        "step: failure_report_for": lambda n: _time(lambda: failure_report_for(final), n),
        "step: encode_failure_report": lambda n: _time(lambda: encode_failure_report(report), n),
        "step: decode_failure_report": lambda n: _time(lambda: decode_failure_report(value), n),
        "step: rebuild_failure": lambda n: _time(lambda: rebuild_failure(decoded), n),
        "baseline: format_exception": lambda n: _time(lambda: traceback.format_exception(final), n),
        "baseline: orjson dumps+loads": lambda n: _time(lambda: orjson.loads(orjson.dumps(payload)), n),
    }
    for timed in cases.values():  # warm up
        timed(max(args.iterations // 10, 1))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved, so drift affects every case alike
        for name, timed in cases.items():
            samples[name].append(timed(args.iterations))
    loop.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}

    print(
        f"3-event chain; header value {len(headers[FAILURE_REPORT_HEADER.lower()])} bytes, body {len(body)}"
        f" bytes; {args.rounds} rounds x {args.iterations} calls"
    )
    print(f"{'case':<38}{'median µs':>12}{'min µs':>10}{'× format_exception':>22}")
    base = medians["baseline: format_exception"]
    for name, values in samples.items():
        print(f"{name:<38}{medians[name]:>12.1f}{min(values):>10.1f}{medians[name] / base:>22.2f}")
    pairs = zip(samples["hop (server + caller)"], samples["before: hop"], strict=True)
    ratio = statistics.median(now / before for now, before in pairs)
    total = medians["hop (server + caller)"]
    server_pairs = zip(
        samples["server: the same reply, no ASGI call"],
        samples["before: server, chain walked twice"],
        strict=True,
    )
    server_ratio = statistics.median(now / before for now, before in server_pairs)
    print(f"server reply / before = {server_ratio:.2f}")
    print(f"hop / hop before = {ratio:.2f}")
    print(f"target < {TARGET_US:.0f} µs: {'PASS' if total < TARGET_US else 'FAIL'}")
    print(f"failures_pipeline_us={total:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
