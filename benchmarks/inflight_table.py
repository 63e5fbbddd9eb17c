"""The in-flight table's cost per hop: what ``hop_attempt`` + ``hop_done`` add to every request.

Run: ``python3 benchmarks/inflight_table.py [--runs N]``. Each case is one hop's pair of hook calls (the
attempt loop's ``inflight.hop_attempt(url, 1)`` and ``inflight.hop_done()``), timed inside an asyncio task
as the client runs them, in several runs; the median per-hop cost is printed next to two baselines measured
in the same process: two empty function calls (the hooks' call overhead) and a bare dict set + pop (the
update the table does). Exit status 1 if a tracked hop costs more than 25x the two empty calls (a ratio:
absolute numbers swing with the machine's load; either way it is far below 1% of a loopback request
through ``request()``, see client_overhead.py).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from gym_obs.telemetry import inflight
from gym_obs.telemetry.propagation import rollout_context

TRACKED_HOP_BUDGET_X = 25.0
URL = "http://127.0.0.1:11002/v1/responses"


def _per_call(fn: Callable[[], object], runs: int) -> float:
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return statistics.median(t / number for t in timer.repeat(repeat=runs, number=number))


def _empty(*_args: object) -> None:
    return None


def _two_empty_calls() -> None:
    _empty(URL, 1)
    _empty()


_DICT: dict[object, object] = {}


def _dict_set_pop() -> None:
    _DICT[URL] = 1
    _DICT.pop(URL, None)


def _hop() -> None:
    inflight.hop_attempt(URL, 1)
    inflight.hop_done()


def _retried_hop() -> None:
    inflight.hop_attempt(URL, 1)
    inflight.hop_attempt(URL, 2)
    inflight.hop_done()


async def _measure(runs: int) -> list[tuple[str, float]]:
    results = [
        ("baseline: two empty function calls", _per_call(_two_empty_calls, runs)),
        ("baseline: dict set + pop", _per_call(_dict_set_pop, runs)),
    ]
    inflight.enable(False)
    results.append(("tracking off (not an agent): flag check", _per_call(_hop, runs)))
    inflight.enable(servers={("127.0.0.1", 11002): "model_0"})
    results.append(("tracking on, request outside any rollout", _per_call(_hop, runs)))
    with rollout_context("rollout-1"), inflight.rollout("rollout-1"):
        results.append(("tracking on, hop of a tracked rollout", _per_call(_hop, runs)))
        results.append(("tracking on, hop with one retry (3 calls)", _per_call(_retried_hop, runs)))
        others = [inflight.rollout(f"other-{i}") for i in range(10_000)]
        for cm in others:
            cm.__enter__()
        results.append(("tracking on, hop, 10,000 rollouts in the table", _per_call(_hop, runs)))
        snapshot = _per_call(lambda: inflight.snapshot(limit=200), max(3, runs // 2))
        for cm in others:
            cm.__exit__(None, None, None)
    inflight.enable(False)
    results.append(("snapshot of 10,001 rollouts (route reply, limit 200)", snapshot))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per case (default: 7)")
    args = parser.parse_args(argv)
    results = asyncio.run(_measure(args.runs))
    base = results[0][1]
    print(f"| {'case':<54} | {'per hop':>9} | {'x baseline':>10} |")
    print(f"|{'-' * 56}|{'-' * 10}:|{'-' * 11}:|")
    for name, seconds in results:
        shown = f"{seconds * 1e9:.0f} ns" if seconds < 1e-6 else f"{seconds * 1e6:.2f} µs"
        if seconds > 1e-3:
            shown = f"{seconds * 1e3:.2f} ms"
        print(f"| {name:<54} | {shown:>9} | {seconds / base:>10.1f} |")
    tracked = dict(results)["tracking on, hop of a tracked rollout"]
    print(f"inflight_tracked_hop_ns={tracked * 1e9:.0f}")
    return 0 if tracked < TRACKED_HOP_BUDGET_X * base else 1


if __name__ == "__main__":
    sys.exit(main())
