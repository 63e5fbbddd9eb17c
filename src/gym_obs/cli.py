"""The ``gym-obs`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gym_obs import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym-obs", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gym-obs {__version__}")
    parser.add_subparsers(dest="command")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
