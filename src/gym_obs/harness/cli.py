"""``gym-obs harness run``: arguments and exit status. Heavy imports happen only when the command runs."""

from __future__ import annotations

import argparse
import gc
import math
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

__all__ = ["add_harness_parser", "harness_run"]

EXIT_HARNESS_ERROR = 2
EXIT_INTERRUPTED = 130


#: Servers per role: each is a process with its own port; more than this is a typo, not a load test.
MAX_SERVERS_PER_ROLE = 64


class _OneLineParser(argparse.ArgumentParser):
    """A bad argument is one line naming the flag (the usage is one ``--help`` away), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_HARNESS_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def _integer(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


def _number(value: str) -> float:
    try:
        number = float(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def _positive(value: str) -> int:
    number = _integer(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _server_count(value: str) -> int:
    number = _positive(value)
    if number > MAX_SERVERS_PER_ROLE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SERVERS_PER_ROLE}, got {number}")
    return number


def _seconds(value: str) -> float:
    number = _number(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {value}")
    return number


def _timeout(value: str) -> float:
    number = _number(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {value}")
    return number


def _latency_ms(value: str) -> float:
    number = _number(value)
    if not 0 <= number <= 600_000:
        raise argparse.ArgumentTypeError(f"must be between 0 and 600000 ms, got {value}")
    return number


def _port(value: str) -> int:
    number = _integer(value)
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (1-65535): {number}")
    return number


def _otlp_url(value: str) -> str:
    """An OTLP endpoint must be an http(s) URL with a host: anything else would silently export nothing."""
    url = value.strip()
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number or out of range
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a valid URL ({exc}): {value!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected an http(s) URL with a host, e.g. http://127.0.0.1:4318, got {value!r}"
        )
    return url


def add_harness_parser(subparsers: Any) -> None:
    """Register ``harness run`` on the ``gym-obs`` dispatcher."""
    parser = subparsers.add_parser("harness", help="drive a demo rollout system with load and faults")
    actions = parser.add_subparsers(
        dest="harness_command", metavar="ACTION", required=True, parser_class=_OneLineParser
    )
    run = actions.add_parser(
        "run",
        help="start agent/model/resources servers, run rollouts, summarise the telemetry",
        description="Start a demo rollout system on the gym_obs runtime, drive concurrent rollouts through "
        "it (optionally with injected faults) and summarise what the telemetry saw. Without "
        "--otlp-endpoint every process writes OTLP JSON lines under OUT/<run-id>/telemetry/.",
    )
    run.add_argument("--rollouts", type=_positive, default=200, help="rollouts to run (default 200)")
    run.add_argument("--concurrency", type=_positive, default=32, help="rollouts in flight (default 32)")
    run.add_argument("--agents", type=_server_count, default=1, help="agent servers (default 1)")
    run.add_argument("--models", type=_server_count, default=1, help="model servers (default 1)")
    run.add_argument("--resources", type=_server_count, default=1, help="resources servers (default 1)")
    run.add_argument(
        "--faults", type=Path, metavar="PLAN.yaml", help="fault plan to inject (default: none, no faults)"
    )
    run.add_argument(
        "--otlp-endpoint",
        type=_otlp_url,
        metavar="URL",
        help="send spans and metrics to this OTLP collector (default: none, every process writes OTLP "
        "JSON lines under the run's telemetry/ folder)",
    )
    run.add_argument(
        "--prometheus-port-base",
        type=_port,
        metavar="P",
        help="every process also serves /metrics on P + index (driver P, then each server; "
        "default: none, no /metrics)",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=Path("harness-out"),
        metavar="DIR",
        help="folder of runs: each run writes DIR/<run-id>/ and DIR/latest points at the newest "
        "(default harness-out)",
    )
    run.add_argument(
        "--port-base",
        type=_port,
        default=11000,
        help="head server port; servers listen on the following ports (default 11000)",
    )
    run.add_argument("--host", default="127.0.0.1", help="address every process binds (default 127.0.0.1)")
    run.add_argument(
        "--no-telemetry", action="store_true", help="run with telemetry off (a baseline; default: on)"
    )
    run.add_argument(
        "--model-latency-ms", type=_latency_ms, default=10.0, help="median model latency (default 10)"
    )
    run.add_argument(
        "--latency-distribution",
        choices=["constant", "uniform", "exponential", "lognormal"],
        default="lognormal",
        help="how model latencies are drawn around the median (default lognormal)",
    )
    run.add_argument(
        "--stream",
        action="store_true",
        help="model replies as SSE streams, read by the agent event by event (default: JSON replies)",
    )
    run.add_argument("--turns", type=_positive, default=3, help="model turns per rollout (default 3)")
    run.add_argument(
        "--fanout", type=_positive, default=3, help="parallel calls on fan-out turns (default 3)"
    )
    run.add_argument(
        "--request-timeout",
        type=_timeout,
        metavar="SECONDS",
        help="timeout of each agent -> model/resources call; a hung call fails after it (default 5, "
        "10 when the model latency is large)",
    )
    run.add_argument(
        "--seed",
        type=_integer,
        help="seed for latencies and fault coin flips (default: none, a new draw each run)",
    )
    run.add_argument(
        "--pool-limit-per-host",
        type=_positive,
        metavar="N",
        help="pooled connections per destination in every process (default: the runtime's 1024); "
        "a small pool makes requests queue, so pool waits show",
    )
    run.add_argument(
        "--linger",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="after the rollouts, keep every process and its /metrics up this long before stopping, "
        "so Prometheus can scrape the final values (Ctrl-C or SIGTERM ends the wait early; default 0)",
    )
    run.add_argument(
        "--no-report",
        action="store_true",
        help="do not write the run's report.html at the end of the run (default: written)",
    )
    run.set_defaults(handler=harness_run)


def _raise_keyboard_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def harness_run(args: argparse.Namespace) -> int:
    """Run the harness; 0 when the run completed, 2 with a message when the harness could not run.

    SIGTERM (and SIGINT, even when a shell started the run in the background with SIGINT ignored) is
    handled like Ctrl-C: the servers run in their own sessions, so only the harness can stop them; dying on
    the signal would leave them running.
    """
    previous = {
        signum: signal.signal(signum, _raise_keyboard_interrupt) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("gym-obs harness: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(args: argparse.Namespace) -> int:
    from gym_obs.harness.faults import FaultPlanError, load_fault_plan
    from gym_obs.harness.run import run_harness
    from gym_obs.harness.stack import HarnessError, HarnessOptions

    try:
        plan = load_fault_plan(args.faults) if args.faults is not None else None
        options = HarnessOptions(
            rollouts=args.rollouts,
            concurrency=args.concurrency,
            agents=args.agents,
            models=args.models,
            resources=args.resources,
            fault_plan=plan,
            otlp_endpoint=args.otlp_endpoint,
            prometheus_port_base=args.prometheus_port_base,
            out=args.out,
            host=args.host,
            port_base=args.port_base,
            telemetry=not args.no_telemetry,
            model_latency_s=args.model_latency_ms / 1000.0,
            latency_distribution=args.latency_distribution,
            stream=args.stream,
            turns=args.turns,
            fanout=args.fanout,
            request_timeout_s=args.request_timeout,
            seed=args.seed,
            pool_limit_per_host=args.pool_limit_per_host,
            linger_s=args.linger,
            report=not args.no_report,
        )
        # This process is the driver from here to exit: its startup objects (imports, the plan) live as
        # long as it, so no full collection needs to walk them while rollouts run (the servers freeze
        # theirs too: gym_obs.server._heap). Not in run_harness: a caller's process may be long-lived.
        gc.collect()
        gc.freeze()
        summary = run_harness(options)
    except (HarnessError, FaultPlanError) as exc:
        print(f"gym-obs harness: error: {exc}", file=sys.stderr)
        return EXIT_HARNESS_ERROR
    if summary.get("partial"):
        print(
            f"gym-obs harness: interrupted; partial summary in {summary['out_dir']}/summary.json",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return 0
