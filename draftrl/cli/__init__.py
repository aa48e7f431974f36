"""The ``draftrl`` command line: one module per sub-command, each with ``add_parser`` and ``run``.

Sub-command modules import heavy libraries (torch, transformers, SB3) inside ``run`` so that
``draftrl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: Sub-command modules under ``draftrl.cli``, in the order ``--help`` lists them.
COMMANDS: list[str] = [
    "generate",
    "selftest",
    "models",
    "calibrate",
    "collect",
    "train",
    "distill",
    "export",
    "grid",
    "eval",
    "demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftrl", description="Adaptive speculative decoding: exact engines, RL policies, evaluation."
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a failure (also DRAFTRL_DEBUG=1) instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"draftrl.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every failure ends in one line on stderr and exit 2 (130 for Ctrl-C);
    ``draftrl --debug COMMAND`` (or ``DRAFTRL_DEBUG=1``) shows the traceback instead."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # e.g. train's resume hint repeats it
    debug = args.debug or os.environ.get("DRAFTRL_DEBUG", "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"draftrl {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the final catch: one line, never a traceback
        if debug:
            raise
        print(f"draftrl {args.command}: error: {one_line(err)}", file=sys.stderr)
        return 2


def one_line(err: BaseException) -> str:
    """The message of the errors a user causes (ValueError, FileNotFoundError) as one line;
    ``Type: message`` and the ``--debug`` hint for anything else."""
    message = " ".join(str(err).split()) or "(no message)"
    if type(err) in (ValueError, FileNotFoundError):
        return message
    return f"{type(err).__name__}: {message} (run draftrl --debug ... for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
