"""What several commands print the same way: progress bars and exactness failures."""

from __future__ import annotations

import contextlib
import sys


#: seconds between progress lines when stderr is not a terminal (a log file, CI)
HEARTBEAT_SECONDS = 30.0


@contextlib.contextmanager
def progress_lines(description: str, interval: float = HEARTBEAT_SECONDS, stream=None):
    """Plain progress lines for logs: one per update at most every ``interval`` seconds, and a
    heartbeat line every ``interval`` seconds while nothing updates (a long cell, training), so a
    non-TTY log never goes quiet for minutes. Yields ``update(done, total, label)``."""
    import threading
    import time

    stream = stream or sys.stderr
    start = time.monotonic()
    state = {"done": 0, "total": None, "label": "", "printed": start - interval}  # the first update prints
    lock = threading.Lock()
    stop = threading.Event()

    def emit(now: float) -> None:
        total = "?" if state["total"] is None else state["total"]
        print(f"[{description}] {state['done']}/{total} {state['label']} ({now - start:.0f}s)".rstrip(),
              file=stream, flush=True)
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

    thread = threading.Thread(target=heartbeat, name=f"draftrl-{description}-progress", daemon=True)
    thread.start()
    try:
        yield update
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def progress_bar(description: str, enabled: bool = True):
    """A rich progress bar on stderr (plain lines every <= 30 s when stderr is not a terminal);
    yields ``update(done, total, label)``."""
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
