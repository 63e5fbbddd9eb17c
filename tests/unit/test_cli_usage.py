"""An unknown option shows the usage of the command it was given to; ``harness run --help`` states every
default. Runs the real ``gym-obs`` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gym_obs.cli import build_parser


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", *args], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["harness", "run", "--bogus"], "gym-obs harness run"),
        (["harness", "run", "--rollouts", "2", "--bogus", "x"], "gym-obs harness run"),
        (["report", "--bogus"], "gym-obs report"),
        (["explain", "abc", "--bogus"], "gym-obs explain"),
        (["dashboards", "build", "--bogus"], "gym-obs dashboards build"),
        (["serve", "config.yaml", "--bogus"], "gym-obs serve"),
    ],
)
def test_unknown_option_prints_that_commands_usage(argv: list[str], prog: str) -> None:
    done = _cli(*argv)
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: {prog} "), done.stderr
    assert f"{prog}: error: unrecognized arguments: {' '.join(argv[argv.index('--bogus') :])}" in done.stderr
    assert "Traceback" not in done.stderr and "COMMAND ..." not in done.stderr


def test_top_level_unknown_option_keeps_the_top_level_usage() -> None:
    done = _cli("--bogus")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: gym-obs ") and "unrecognized arguments: --bogus" in done.stderr


def _harness_run_parser() -> object:
    parser = build_parser()
    harness = next(a for a in parser._actions if a.dest == "command").choices["harness"]  # type: ignore[attr-defined]
    return next(a for a in harness._actions if a.dest == "harness_command").choices["run"]


def test_harness_run_help_states_every_default() -> None:
    run = _harness_run_parser()
    options = [a for a in run._actions if a.option_strings and a.dest != "help"]  # type: ignore[attr-defined]
    assert len(options) >= 20
    for action in options:
        assert action.help and "default" in action.help, action.option_strings
        if action.default not in (None, False):  # a stated value must be the real one
            shown = str(action.default)
            assert shown.removesuffix(".0") in action.help, (action.option_strings, action.default)
    help_text = _cli("harness", "run", "--help").stdout
    assert "(default harness-out)" in help_text and "--out DIR" in help_text


def test_every_command_help_states_every_default() -> None:
    import argparse

    from gym_obs.cli import build_parser

    def leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [parser]
        return [leaf for sub in subs for child in sub.choices.values() for leaf in leaves(child)]

    found = leaves(build_parser())
    assert len(found) >= 6  # dashboards build, serve, harness run, report, explain, top
    for parser in found:
        for action in parser._actions:
            optional_positional = not action.option_strings and action.nargs == "?"
            if (action.option_strings and action.dest != "help") or optional_positional:
                assert action.help and "default" in action.help, (parser.prog, action.dest)
