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
    build.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a file is out of date (default: write the files)",
    )
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


def _add_grafana_url(parser: argparse.ArgumentParser) -> None:
    from gym_obs.harness.report.links import DEFAULT_GRAFANA_URL

    parser.add_argument(
        "--grafana-url",
        default=DEFAULT_GRAFANA_URL,
        help="Grafana for the Explore links of a run that used an OTLP endpoint "
        f"(default {DEFAULT_GRAFANA_URL})",
    )


def _report(args: argparse.Namespace) -> int:
    from gym_obs.harness.report import ReportError, write_report

    try:
        path = write_report(args.run_dir, args.out, grafana_url=args.grafana_url)
    except (ReportError, OSError) as exc:
        print(f"gym-obs report: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _add_report(subparsers: _Subparsers[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a run folder",
        description="Read a run folder (a harness run, or the file-sink folder of gym-obs serve) and write "
        "one self-contained HTML file: summary, per-hop latency, retries, pool waits, failures by root cause "
        "with their cause trees, waterfalls of the slowest and failed rollouts, rollouts/s over time.",
    )
    parser.add_argument(
        "run_dir", type=Path, nargs="?", default=Path("harness-out"), help="run folder (default: harness-out)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write OUT/report.html (default: RUN_DIR)")
    _add_grafana_url(parser)
    parser.set_defaults(handler=_report)


def _explain(args: argparse.Namespace) -> int:
    import json

    from gym_obs.harness.explain import UnknownRollout, explain, render_text

    try:
        explanation = explain(args.id, args.run_dir, grafana_url=args.grafana_url)
    except UnknownRollout as exc:
        print(f"gym-obs explain: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(explanation.as_json(), indent=2) if args.json else render_text(explanation))
    return 0


def _add_explain(subparsers: _Subparsers[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="why did one rollout fail: its failure chain, hops and trace",
        description="Print one rollout's outcome, duration, failure chain (outermost -> root cause), the "
        "hops "
        "it made with latency and attempts, and how to open its trace.",
    )
    parser.add_argument("id", metavar="ROLLOUT_ID_OR_TRACE_ID", help="a rollout id or a trace id")
    parser.add_argument(
        "run_dir", type=Path, nargs="?", default=Path("harness-out"), help="run folder (default: harness-out)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts (default: text)")
    _add_grafana_url(parser)
    parser.set_defaults(handler=_explain)


def _top(args: argparse.Namespace) -> int:
    from gym_obs.server.top import run_top

    return run_top(
        args.config,
        args.head,
        once=args.once,
        as_json=args.json,
        limit=args.limit,
        stall_after_s=args.stall_after,
        interval_s=args.interval,
    )


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 200:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 200, got {text!r}")
    return int(text)


def _add_top(subparsers: _Subparsers[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of the in-flight rollouts of every agent server",
        description="Every second, ask the head server which agents run and each agent for its in-flight "
        "rollouts (GET /_gym/inflight; works with telemetry off): counts by stage, the oldest rollouts, "
        "the stalled ones (no progress for --stall-after seconds), retries in progress, hops in flight "
        "per server. An agent that does not answer is shown as such. Ctrl-C exits.",
    )
    parser.add_argument(
        "config",
        type=Path,
        nargs="?",
        default=None,
        help="the global config (YAML) naming the head server (default: none, see --head)",
    )
    parser.add_argument(
        "--head",
        default=None,
        help="the head server's URL (default: CONFIG's, else $GYM_OBS_HEAD_SERVER, "
        "else http://127.0.0.1:11000)",
    )
    parser.add_argument("--once", action="store_true", help="print one view and exit (default: refresh)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts (default: text)")
    parser.add_argument(
        "--stall-after",
        type=_positive_seconds,
        default=30.0,
        help="a rollout with no progress for this many seconds is stalled (default: 30)",
    )
    parser.add_argument(
        "--limit", type=_limit, default=10, help="rollouts per list, at most 200 (default: 10)"
    )
    parser.add_argument(
        "--interval", type=_positive_seconds, default=1.0, help="seconds between refreshes (default: 1)"
    )
    parser.set_defaults(handler=_top)


# Each entry adds one subcommand; later subcommands (serve, harness, ...) append theirs here.
_COMMANDS: tuple[Callable[[_Subparsers[argparse.ArgumentParser]], None], ...] = (
    _add_dashboards,
    _add_serve,
    _add_harness,
    _add_report,
    _add_explain,
    _add_top,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym-obs", description="The gym_obs command line.")
    parser.add_argument("--version", action="version", version=f"gym-obs {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_command in _COMMANDS:
        add_command(subparsers)
    return parser


_LEAF_PARSER = "_gym_obs_command_parser"


def _mark_leaves(parser: argparse.ArgumentParser) -> None:
    """Each command's own parser is recorded in the namespace, so an unknown option is reported with that
    command's usage (``gym-obs harness run --bogus``), not the top-level one."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        parser.set_defaults(**{_LEAF_PARSER: parser})
    for action in subcommands:
        for child in action.choices.values():
            _mark_leaves(child)


def _reject_unknown(parser: argparse.ArgumentParser, extras: list[str]) -> int:
    parser.print_usage(sys.stderr)
    parser.exit(2, f"{parser.prog}: error: unrecognized arguments: {' '.join(extras)}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _mark_leaves(parser)
    args, extras = parser.parse_known_args(argv)
    if extras:
        return _reject_unknown(getattr(args, _LEAF_PARSER, parser), extras)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    return handler(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
