"""What several commands print the same way: progress bars and exactness failures."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

#: seconds between progress lines when stderr is not a terminal (a log file, CI)
HEARTBEAT_SECONDS = 30.0


class ProgressUpdate:
    """``update(done, total, label)`` plus ``update.phase(name)``: a new phase renames the line and
    starts its count afresh, so a multi-step command (the demos) never prints one step's name
    while another runs."""

    def __init__(self, report: Callable[[int, int | None, str], None], rename: Callable[[str], None]):
        self._report, self._rename = report, rename

    def __call__(self, done: int, total: int | None, label: str) -> None:
        self._report(done, total, label)

    def phase(self, name: str) -> None:
        self._rename(name)


@contextlib.contextmanager
def progress_lines(description: str, interval: float = HEARTBEAT_SECONDS, stream=None):
    """Plain progress lines for logs: one per update at most every ``interval`` seconds, and a
    heartbeat line every ``interval`` seconds while nothing updates (a long cell, training), so a
    non-TTY log never goes quiet for minutes. Yields a :class:`ProgressUpdate`."""
    import threading
    import time

    stream = stream or sys.stderr
    start = time.monotonic()
    state = {"description": description, "done": 0, "total": None, "label": "", "start": start,
             "printed": start - interval}  # the first update prints
    lock = threading.Lock()
    stop = threading.Event()

    def emit(now: float) -> None:
        total = "?" if state["total"] is None else state["total"]
        line = f"[{state['description']}] {state['done']}/{total} {state['label']} ({now - state['start']:.0f}s)"
        print(line.rstrip(), file=stream, flush=True)
        state["printed"] = now

    def heartbeat() -> None:
        while not stop.wait(interval / 4):
            with lock:
                now = time.monotonic()
                if now - state["printed"] >= interval:
                    emit(now)

    def update(done: int, total: int, label: str) -> None:
        with lock:
            state.update(done=done, total=total, label=label)
            now = time.monotonic()
            if now - state["printed"] >= interval or (total and done >= total):
                emit(now)

    def rename(name: str) -> None:
        with lock:
            now = time.monotonic()  # a phase's seconds count from its start; its first update prints
            state.update(description=name, done=0, total=None, label="", start=now, printed=now - interval)

    thread = threading.Thread(target=heartbeat, name=f"draftrl-{description}-progress", daemon=True)
    thread.start()
    try:
        yield ProgressUpdate(update, rename)
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def progress_bar(description: str, enabled: bool = True):
    """A rich progress bar on stderr (plain lines every <= 30 s when stderr is not a terminal);
    yields a :class:`ProgressUpdate`."""
    if not enabled:
        yield None
        return
    if not sys.stderr.isatty():
        with progress_lines(description) as update:
            yield update
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[label]}"), console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=None, label="")

        def update(done: int, total: int | None, label: str) -> None:
            bar.update(task, completed=done, total=total, label=label)

        def rename(name: str) -> None:
            bar.update(task, description=name, completed=0, total=None, label="")

        yield ProgressUpdate(update, rename)


def exactness_failure(command: str, err: Exception) -> int:
    """Print an exactness failure loudly (red panel with the evidence) and return exit code 3."""
    from rich.console import Console
    from rich.panel import Panel

    Console(stderr=True).print(Panel(str(err), title=f"draftrl {command}: EXACTNESS VIOLATION", style="bold red"))
    print(f"draftrl {command}: EXACTNESS VIOLATION: {str(err).splitlines()[0]}", file=sys.stderr)
    return 3
