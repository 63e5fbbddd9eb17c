"""What telemetry costs a whole rollout system: the harness with telemetry off, file sink, and OTLP.

Runs ``gym-obs harness run`` (real processes: head, agent, model, resources, driver) in interleaved rounds
of three variants -- telemetry off (the baseline), the embedded file sink (the default), and OTLP
http/protobuf to a local collector (``rotel`` with a blackhole exporter, so the collector's own work is
receiving and decoding) -- and reports rollouts/s, rollout latency p50/p99 and the CPU time all processes
spent per rollout while rollouts ran, as medians over the rounds.

The default load is model-bound (50 ms per model call, 16 rollouts in flight: the CPU is not saturated), the
shape of real rollouts where generation dominates. ``--stress`` runs the harness's own default instead
(10 ms lognormal, 32 in flight), which saturates 2 cores so that every microsecond of instrumentation
shows up as queueing delay; read its CPU column, not its latency ratio.

    python3 benchmarks/harness_throughput.py [--rounds 3] [--rollouts 400] [--stress]

Last line: ``telemetry_cost_ratio=<p50 rollout latency with OTLP / p50 without telemetry>``; target <= 1.10.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("off", "file", "otlp")
_PORT_BASE = 25600  # head server; its servers take the next ports
_COLLECTOR_OFFSET = 20  # the collector listens on base + 20 (gRPC) and base + 21 (HTTP)


def _collector_ports(port_base: int) -> tuple[int, int]:
    return port_base + _COLLECTOR_OFFSET, port_base + _COLLECTOR_OFFSET + 1


def _start_collector(workdir: Path, port_base: int) -> subprocess.Popen[bytes]:
    import rotel

    grpc_port, http_port = _collector_ports(port_base)
    agent = Path(rotel.__file__).parent / "rotel-agent"
    command = [
        str(agent), "start",
        "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
        "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
        "--exporter", "blackhole",
        "--pid-file", str(workdir / "rotel.pid"),
        "--log-file", str(workdir / "rotel.log"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    with (workdir / "rotel.out").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", http_port)) == 0:
                return process
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise SystemExit(f"rotel-agent did not start; see {workdir / 'rotel.out'}")


def _run(variant: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "gym_obs.cli", "harness", "run", "--out", str(out),
        "--rollouts", str(args.rollouts), "--concurrency", str(args.concurrency),
        "--model-latency-ms", str(args.model_latency_ms), "--latency-distribution", args.latency_distribution,
        "--port-base", str(args.port_base), "--seed", "1",
    ]  # fmt: skip
    if variant == "off":
        command.append("--no-telemetry")
    elif variant == "otlp":
        command += ["--otlp-endpoint", f"http://127.0.0.1:{_collector_ports(args.port_base)[1]}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"harness run ({variant}) failed:\n{done.stderr[-3000:]}")
    summary: dict[str, Any] = json.loads((out / "latest" / "summary.json").read_text())  # the run's folder
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model-latency-ms", type=float, default=50.0)
    parser.add_argument("--latency-distribution", default="constant")
    parser.add_argument("--stress", action="store_true", help="the harness default load (CPU-bound)")
    parser.add_argument(
        "--port-base",
        type=int,
        default=_PORT_BASE,
        help=f"head server port; the servers use the next ports, the collector base+{_COLLECTOR_OFFSET} "
        f"and base+{_COLLECTOR_OFFSET + 1} (default {_PORT_BASE})",
    )
    args = parser.parse_args()
    if args.stress:
        args.concurrency, args.model_latency_ms, args.latency_distribution = 32, 10.0, "lognormal"

    results: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="gym-obs-bench-") as tmp:
        workdir = Path(tmp)
        collector = _start_collector(workdir, args.port_base)
        try:
            for round_index in range(args.rounds):
                # rotate the order so no variant always runs first (cold caches) or last
                order = VARIANTS[round_index % 3 :] + VARIANTS[: round_index % 3]
                for variant in order:
                    summary = _run(variant, workdir / f"{variant}-{round_index}", args)
                    latency = summary["rollout_latency_s"]
                    cpu = sum(p["cpu_seconds"] or 0.0 for p in summary["processes"].values())
                    results[variant].append(
                        {
                            "rate": summary["rollouts_per_second"],
                            "p50": latency["p50"],
                            "p99": latency["p99"],
                            "cpu_ms": cpu / summary["rollouts"] * 1000,
                            "failures": summary["outcomes"]["failed"],
                        }
                    )
                    print(
                        f"round {round_index + 1} {variant:>4}: "
                        f"{summary['rollouts_per_second']:7.1f} rollouts/s "
                        f"p50 {latency['p50'] * 1000:6.1f} ms p99 {latency['p99'] * 1000:6.1f} ms "
                        f"cpu {results[variant][-1]['cpu_ms']:5.2f} ms/rollout",
                        flush=True,
                    )
        finally:
            collector.terminate()
            collector.wait(timeout=10)

    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in results[variant])

    print()
    print(
        f"{args.rollouts} rollouts, concurrency {args.concurrency}, model latency {args.model_latency_ms} ms "
        f"({args.latency_distribution}), median of {args.rounds} rounds"
    )
    print("| variant | rollouts/s | p50 ms | p99 ms | CPU ms/rollout | p50 x off |")
    print("|---------|-----------:|-------:|-------:|---------------:|----------:|")
    base = median("off", "p50")
    labels = ("telemetry off", "file sink (default)", "OTLP to rotel")
    for variant, label in zip(VARIANTS, labels, strict=True):
        print(
            f"| {label} | {median(variant, 'rate'):.1f} | {median(variant, 'p50') * 1000:.1f} | "
            f"{median(variant, 'p99') * 1000:.1f} | {median(variant, 'cpu_ms'):.2f} | "
            f"{median(variant, 'p50') / base:.3f} |"
        )
    if any(r["failures"] for rs in results.values() for r in rs):
        print("warning: some rollouts failed; numbers include them")
    print(f"telemetry_cost_ratio={median('otlp', 'p50') / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
