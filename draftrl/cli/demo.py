"""``draftrl demo``: fetch the model, calibrate, collect traces, train PPO, grid-search, evaluate.

    draftrl demo                 # about 10 minutes on 2 quiet CPU cores
    draftrl demo --quick         # a few minutes
    draftrl demo --config configs/demo_cpu.yaml --out runs/demo --force

Prints a comparison table (plain decoding, best fixed, heuristic, threshold, bandit, PPO, the
oracle bound) with speedups over plain decoding measured in the same run, the exactness
verdict, and where the report and plots are. Exits 3 when an exactness check fails.
"""

from __future__ import annotations

import argparse
import sys

from draftrl.cli import _options
from draftrl.cli._output import exactness_failure, progress_bar
from draftrl.cli.grid import add_eval_options

#: Display names of the demo's table.
LABELS = {"ar": "plain decoding", "best-grid": "best fixed (grid)", "heuristic": "HF heuristic",
          "threshold": "confidence threshold", "bandit": "UCB bandit", "oracle": "oracle (upper bound)"}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="end to end: calibrate, collect, train PPO, grid, evaluate, compare")
    add_eval_options(p)
    p.add_argument("--quick", action="store_true", help="a few minutes: fewer requests, tokens, cells and steps")
    _options.add_out(p, "output directory (default: runs/demo)", required=False, default="runs/demo",
                     overwrite="replace an earlier demo's outputs in --out (also --force)")
    p.add_argument("--force", dest="overwrite", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    """The :class:`~draftrl.eval.demo.DemoConfig`: the built-in default (or ``--quick``), or ``--config``."""
    from draftrl.eval.demo import DemoConfig

    base = DemoConfig.quick() if args.quick and not args.config else None
    return _options.load(DemoConfig, args, base=base)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from draftrl.decoding.monitor import ExactnessViolation
    from draftrl.eval.demo import STEPS, run_demo
    from draftrl.eval.exactness import GreedyMismatch

    cfg = config(args)
    console = Console(stderr=True)
    console.rule(f"[bold]draftrl demo{' --quick' if args.quick else ''}[/] -> {args.out}")

    def started(i: int, step: str) -> None:
        console.print(f"[bold cyan][{i + 1}/{len(STEPS)}] {step}[/] ...")

    def done(i: int, step: str, seconds: float, note: str) -> None:
        console.print(f"[green]  done[/] {step} in {seconds:.0f}s  {note}")

    try:
        with progress_bar("decoding") as update:
            summary = run_demo(cfg, args.out, force=args.overwrite, step_started=started, step_done=done,
                               progress=update)
    except (ExactnessViolation, GreedyMismatch) as err:
        code = exactness_failure("demo", err)
        print(f"partial results under {args.out}", file=sys.stderr)
        return code
    if args.json:
        import json

        from draftrl.io import plain

        print(json.dumps(plain({k: v for k, v in summary.items() if k != "results_dict"})))
        return 0
    print_summary(summary)
    return 0


def display_name(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    if name.startswith("ppo[") and name.endswith("]"):
        return "PPO " + {"ppo_size": "size (depth+verify/round)", "ppo_depth": "depth (stop/continue/level)"}.get(
            name[4:-1], name[4:-1])
    if name == "ppo":
        return "PPO"
    return name


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from draftrl.eval.report import POLICY_COLUMNS, policy_rows

    results = summary["results_dict"]
    hw = results.get("hardware", {})
    table = Table(title=f"held-out requests: {len(results['prompts'])}, {hw.get('gpu') or hw.get('cpu')}, "
                        f"{hw.get('threads')} thread(s); speedups measured in this run, interleaved")
    for i, col in enumerate(POLICY_COLUMNS):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in policy_rows(results):
        table.add_row(*(escape(cell) for cell in (display_name(row[0]), *row[1:])))  # `ppo[x]` is not markup
    console = Console(width=None if sys.stdout.isatty() else 160)  # pipes and logs get the full table
    console.print(table)
    ex = results["exactness"]
    verdict = "[bold green]PASSED[/]" if ex["passed"] else "[bold red]FAILED[/]"
    checks = []
    if ex["greedy_identity"].get("checked"):
        checks.append(f"greedy token identity on {ex['greedy_identity']['requests']} requests")
    if ex["hf_reference"].get("checked"):
        checks.append(f"HF generate on {ex['hf_reference']['checked']}")
    overhead = ex["monitor_overhead"]["fraction"]
    power = ex.get("power") or {}
    if "correct" in power and power["correct"].get("monitor_overhead") is not None:
        overhead = power["correct"]["monitor_overhead"]
        wrong = power.get("resample-from-p", {})
        checks.append(f"monitor caught resample-from-p after {wrong.get('first_detection') or 'never'} tokens, "
                      f"quiet on the correct sampler over {power['correct']['tokens']}")
    console.print(f"exactness: {verdict} ({'; '.join(checks)})")
    if overhead is not None:
        where = ("at temperature 1, every token tested" if "correct" in power
                 else "at temperature 0 the monitor has nothing to test; eval.power_tokens > 0 measures it at "
                      "temperature 1" if ex["temperature"] == 0 else f"at temperature {ex['temperature']:g}")
        console.print(f"monitor overhead: {overhead * 100:.2f}% of decoding time (target < 3%; {where})")
    steps = ", ".join(f"{k} {v['seconds']:.0f}s" for k, v in summary["steps"].items())
    console.print(f"time: {summary['wall_seconds'] / 60:.1f} min ({steps})")
    out = summary["out"]
    import os

    wandb_note = "" if os.environ.get("WANDB_MODE") == "disabled" else f"; wandb runs: {out}/*/wandb (wandb sync)"
    console.print(f"report: {summary['report']}\nplots:  {out}/eval/*.png, {out}/grid/grid_heatmap.png\n"
                  f"results: {summary['results']}{wandb_note}")
