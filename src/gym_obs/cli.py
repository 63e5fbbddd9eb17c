"""The ``gym-obs`` command.

A dispatcher: each subcommand registers its parser and a handler (``args.handler``) in one
``_add_<command>`` function, and imports its implementation only when it runs, so ``gym-obs --version``
stays fast and optional extras are needed only by the subcommands that use them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gym_obs import __version__

_Subparsers = argparse._SubParsersAction  # argparse keeps the subparsers type private


def _dashboards_build(args: argparse.Namespace) -> int:
    try:
        from gym_obs.dashboards import stale_dashboards, write_dashboards

        if args.check:
            stale = stale_dashboards(args.out)
            for path in stale:
                print(f"out of date: {path} (run `gym-obs dashboards build`)", file=sys.stderr)
            return 1 if stale else 0
        for path in write_dashboards(args.out):
            print(path)
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
        print(f"gym-obs dashboards needs the 'dashboards' extra: pip install 'gym-obs[dashboards]' ({exc})")
        return 2
    return 0


def _add_dashboards(subparsers: _Subparsers[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("dashboards", help="Grafana dashboards built from the telemetry names")
    actions = parser.add_subparsers(dest="dashboards_command", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="write dashboards/*.json (deterministic)")
    build.add_argument(
        "--out", type=Path, default=Path("dashboards"), help="output directory (default: dashboards)"
    )
    build.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    build.set_defaults(handler=_dashboards_build)


def _serve(args: argparse.Namespace) -> int:
    from gym_obs.server.launcher import serve

    return serve(args.config, log_dir=args.log_dir, ready_timeout_s=args.ready_timeout)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _add_serve(subparsers: _Subparsers[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="start the head server and every configured server")
    parser.add_argument("config", type=Path, help="the global config (YAML)")
    parser.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a temp directory)")
    parser.add_argument(
        "--ready-timeout",
        type=_positive_seconds,
        default=None,
        help="seconds each server may take to become ready (default: its startup_timeout_s)",
    )
    parser.set_defaults(handler=_serve)


def _add_harness(subparsers: _Subparsers[argparse.ArgumentParser]) -> None:
    from gym_obs.harness.cli import add_harness_parser  # argparse only; the run imports the rest

    add_harness_parser(subparsers)


# Each entry adds one subcommand; later subcommands (serve, harness, ...) append theirs here.
_COMMANDS: tuple[Callable[[_Subparsers[argparse.ArgumentParser]], None], ...] = (
    _add_dashboards,
    _add_serve,
    _add_harness,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym-obs", description="The gym_obs command line.")
    parser.add_argument("--version", action="version", version=f"gym-obs {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_command in _COMMANDS:
        add_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    return handler(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
