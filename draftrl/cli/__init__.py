"""The ``draftrl`` command line: one module per sub-command, each with ``add_parser`` and ``run``.

Sub-command modules import heavy libraries (torch, transformers, SB3) inside ``run`` so that
``draftrl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Sub-command modules under ``draftrl.cli``, in the order ``--help`` lists them.
COMMANDS: list[str] = [
    "generate",
    "selftest",
    "models",
    "calibrate",
    "collect",
    "train",
    "export",
    "grid",
    "eval",
    "demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftrl", description="Adaptive speculative decoding: exact engines, RL policies, evaluation."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"draftrl.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:  # user-caused: one clear line, no traceback
        print(f"draftrl {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
