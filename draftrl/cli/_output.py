"""What several commands print the same way: progress bars and exactness failures."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def progress_bar(description: str, enabled: bool = True):
    """A rich progress bar on stderr; yields ``update(done, total, label)``."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[label]}"), console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=None, label="")

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, label=label)

        yield update


def exactness_failure(command: str, err: Exception) -> int:
    """Print an exactness failure loudly (red panel with the evidence) and return exit code 3."""
    from rich.console import Console
    from rich.panel import Panel

    Console(stderr=True).print(Panel(str(err), title=f"draftrl {command}: EXACTNESS VIOLATION", style="bold red"))
    print(f"draftrl {command}: EXACTNESS VIOLATION: {str(err).splitlines()[0]}", file=sys.stderr)
    return 3
