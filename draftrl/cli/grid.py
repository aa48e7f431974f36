"""``draftrl grid``: time fixed (depth, verify_size, width) settings on the tune split.

    draftrl grid --config configs/eval_tiny_cpu.yaml --out runs/grid
    draftrl grid --config configs/eval_tiny_cpu.yaml --out runs/sweep --cell --depth=4 --verify_size=0 --width=1

Writes DIR/grid.json (per cell: tokens/s, speedup vs plain decoding, mean tokens per round,
per language and task; the best setting), DIR/grid_heatmap.png, DIR/sweep.yaml (the same grid
as a wandb sweep whose agents run the ``--cell`` form) and one wandb run per cell.
"""

from __future__ import annotations

import argparse
import contextlib
import sys


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--set`` and ``--threads``, shared by grid, eval and demo."""
    parser.add_argument("--config", default=None, help="YAML with env/grid/eval/wandb sections (configs/eval_*.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set env.max_new_tokens=32 (repeatable)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's threads)")


def load_eval_config(args: argparse.Namespace, cls=None):
    from draftrl.config import load_config
    from draftrl.eval.config import EvalConfig

    config = load_config(cls or EvalConfig, args.config, args.overrides)
    if args.threads is not None:
        config.threads = args.threads
    return config


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


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("grid", help="grid-search fixed depth x verify_size x width settings (tune split)")
    add_config_args(p)
    p.add_argument("--out", required=True, help="output directory (grid.json, grid_heatmap.png, sweep.yaml)")
    p.add_argument("--cell", action="store_true", help="time one cell (--depth/--verify_size/--width) against "
                   "plain decoding: the command wandb sweep agents run")
    p.add_argument("--depth", type=int, default=None, help="with --cell: draft depth")
    p.add_argument("--verify_size", "--verify-size", dest="verify_size", type=int, default=0,
                   help="with --cell: verify size (0 = all drafted nodes)")
    p.add_argument("--width", type=int, default=1, help="with --cell: tree width")
    p.add_argument("--no-monitor", action="store_true", help="skip the exactness monitor at temperature > 0")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from draftrl.decoding.monitor import ExactnessViolation
    from draftrl.eval.exactness import GreedyMismatch

    config = load_eval_config(args)
    if args.no_monitor:
        config.eval.monitor = False
    try:
        if args.cell:
            from draftrl.eval.grid import Cell, run_cell

            if args.depth is None:
                raise ValueError("--cell needs --depth (and optionally --verify_size, --width)")
            result = run_cell(config, args.out, Cell(args.depth, args.verify_size, args.width))
            c = result["cell"]
            print(f"speedup_vs_ar={c['speedup_vs_ar']:.3f}x  tokens_per_second={c['tokens_per_second']:.2f}  "
                  f"mean_tokens_per_round={c['mean_tokens_per_round']:.2f}  cell=d{c['depth']}_v{c['verify_size']}_w{c['width']}")
            return 0
        from draftrl.eval.grid import run_grid

        with progress_bar("grid", not args.quiet) as update:
            result = run_grid(config, args.out, config_path=args.config, progress=update)
    except (ExactnessViolation, GreedyMismatch) as err:
        return exactness_failure("grid", err)
    for name, c in sorted(result["cells"].items(), key=lambda kv: -kv[1]["tokens_per_second"]):
        mark = "  <- best" if name == result["best"]["name"] else ""
        noise = "-" if c["noise"] is None else f"{c['noise']:.2f}"
        print(f"speedup_vs_ar={c['speedup_vs_ar']:.3f}x  tokens_per_round={c['mean_tokens_per_round']:.2f}  "
              f"tokens_per_second={c['tokens_per_second']:.2f}  noise={noise}  cell={name}{mark}")
    print(f"grid.json, grid_heatmap.png and sweep.yaml in {args.out}")
    return 0
