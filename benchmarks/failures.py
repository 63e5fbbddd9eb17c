"""Failure reports: the CPU cost of carrying a failure across one HTTP hop.

For a 3-event chain (``agent_request_failed`` <- ``verifier_error`` <- ``ZeroDivisionError``) one hop costs
``failure_report_for`` (walk the chain) + ``encode_failure_report`` (header value) on the server and
``decode_failure_report`` + ``rebuild_failure`` on the caller. Each step and the whole pipeline are timed
for ``--iterations`` calls per round; the table shows the median µs per call over ``--rounds`` rounds.

Baselines, run in the same process: ``format_exception`` (what shipping a failure as a traceback string
costs) and an orjson dumps+loads round trip of the same records (the floor for any JSON encoding).
The last line is ``failures_pipeline_us=<median>`` (target < 100 µs).

Run: ``python3 benchmarks/failures.py [--iterations 2000] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "src"))

import orjson  # noqa: E402

from gym_obs.failures import (  # noqa: E402
    NgFailureEvent,
    decode_failure_report,
    encode_failure_report,
    failure_report_for,
    rebuild_failure,
)

TARGET_US = 100.0


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    final = _chain()
    report = failure_report_for(final)
    value = encode_failure_report(report)
    decoded = decode_failure_report(value)
    assert rebuild_failure(decoded) is not None
    payload = report.to_payload()

    def pipeline() -> None:
        rebuild_failure(decode_failure_report(encode_failure_report(failure_report_for(final))))

    cases: dict[str, Callable[[], Any]] = {
        "failure_report_for": lambda: failure_report_for(final),
        "encode_failure_report": lambda: encode_failure_report(report),
        "decode_failure_report": lambda: decode_failure_report(value),
        "rebuild_failure": lambda: rebuild_failure(decoded),
        "pipeline (all four)": pipeline,
        "baseline: format_exception": lambda: traceback.format_exception(final),
        "baseline: orjson dumps+loads": lambda: orjson.loads(orjson.dumps(payload)),
    }
    for fn in cases.values():  # warm up
        _time(fn, max(args.iterations // 10, 1))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved, so drift affects every case alike
        for name, fn in cases.items():
            samples[name].append(_time(fn, args.iterations))
    medians = {name: statistics.median(values) for name, values in samples.items()}

    print(f"3-event chain; header value {len(value)} bytes; {args.rounds} rounds x {args.iterations} calls")
    print(f"{'case':<32}{'median µs':>12}{'min µs':>10}{'× format_exception':>22}")
    base = medians["baseline: format_exception"]
    for name, values in samples.items():
        print(f"{name:<32}{medians[name]:>12.1f}{min(values):>10.1f}{medians[name] / base:>22.2f}")
    total = medians["pipeline (all four)"]
    print(f"target < {TARGET_US:.0f} µs: {'PASS' if total < TARGET_US else 'FAIL'}")
    print(f"failures_pipeline_us={total:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
