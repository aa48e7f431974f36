"""``draftrl demo``: fetch the model, calibrate, collect traces, train PPO, grid-search, evaluate.

    draftrl demo                 # about 10 minutes on 2 quiet CPU cores
    draftrl demo --quick         # a few minutes
    draftrl demo --config configs/demo_cpu.yaml --out runs/demo --overwrite

Prints a comparison table (plain decoding, best fixed, heuristic, threshold, bandit, PPO, the
lookahead bound) with speedups over plain decoding measured in the same run, the exactness
verdict, and where the report and plots are. Exits 3 when an exactness check fails.

Learning under load in real vLLM (needs vLLM installed; ``draftrl.eval.serve.demo``)::

    draftrl demo --engine vllm             # about 20 minutes on 2 CPU cores -> runs/serve_demo
    draftrl demo --engine vllm --quick     # a few minutes
    draftrl demo --engine vllm --set rates=[1,4,16] --out runs/serve_demo2

calibrate -> collect -> PPO in the serving replay -> Dynamic SD grid -> every policy in vLLM
under a Poisson load sweep; per rate a table, ratios to no speculation first (vLLM, then the
replay), and the sweep plot. Run it again after an interruption: finished steps are skipped.
"""

from __future__ import annotations

import argparse
import sys

from draftrl.cli import _options
from draftrl.cli._output import exactness_failure, progress_bar
from draftrl.cli.grid import add_eval_options

#: Display names of the demo's table.
LABELS = {"none": "plain decoding", "best-grid": "best fixed (grid)", "heuristic": "HF heuristic",
          "threshold": "confidence threshold", "bandit": "UCB bandit", "lookahead": "lookahead (upper bound)"}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="end to end: calibrate, collect, train PPO, grid, evaluate, compare")
    add_eval_options(p)
    p.add_argument("--quick", action="store_true", help="a few minutes: fewer requests, tokens, cells and steps")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                   help="hf: draftrl's exact engine, one request at a time (default); vllm: learning under load in "
                        "real vLLM (--config/--set keys are ServeDemoConfig fields, draftrl/eval/serve/demo.py)")
    _options.add_vllm_engine(p, section=None)  # ServeDemoConfig holds them at its top level
    _options.add_out(p, "output directory (default: runs/demo; --engine vllm: runs/serve_demo)", required=False,
                     overwrite="replace an earlier demo's outputs in --out")
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    """The :class:`~draftrl.eval.round.demo.DemoConfig`: the built-in default (or ``--quick``), or ``--config``;
    with no head shipped for ``--target``, the default ``sam:2`` drafts by n-gram lookup
    (``_options.settle_drafter``)."""
    from draftrl.eval.round.demo import DemoConfig

    base = DemoConfig.quick() if args.quick and not args.config else None
    cfg = _options.load(DemoConfig, args, base=base)
    cfg.env = _options.settle_drafter(cfg.env, args)
    return cfg


def _step_printer(console, steps: tuple[str, ...], progress):
    """``(started, done)`` callbacks that print one line per demo step and name the step on the
    progress line (``[train] 0/?`` while training, not the previous step's name)."""

    def started(i: int, step: str) -> None:
        console.print(f"[bold cyan][{i + 1}/{len(steps)}] {step}[/] ...")
        progress.phase(step)

    def done(i: int, step: str, seconds: float, note: str) -> None:
        console.print(f"[green]  done[/] {step} in {seconds:.0f}s  {note}")

    return started, done


def run(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return run_vllm(args)
    _options.refuse_vllm_engine(args, "draftrl demo")
    args.out = args.out or "runs/demo"
    from rich.console import Console

    from draftrl.decoding.monitor import ExactnessViolation
    from draftrl.eval.exactness import GreedyMismatch
    from draftrl.eval.round.demo import OUTPUTS, STEPS, run_demo
    from draftrl.io import refuse_foreign

    cfg = config(args)
    refuse_foreign(args.out, (*OUTPUTS, *cfg.train.recipes), overwrite=args.overwrite, command="demo")  # one line
    console = Console(stderr=True)
    console.rule(f"[bold]draftrl demo{' --quick' if args.quick else ''}[/] -> {args.out}")
    try:
        with progress_bar(STEPS[0]) as update:
            started, done = _step_printer(console, STEPS, update)
            summary = run_demo(cfg, args.out, overwrite=args.overwrite, step_started=started, step_done=done,
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

    from draftrl.eval.agreement import verdict_lines
    from draftrl.eval.report import POLICY_COLUMNS, policy_rows

    results = summary["results_dict"]
    hw = results.get("hardware", {})
    console = Console(width=None if sys.stdout.isatty() else 160)  # pipes and logs get the full table
    classes = results.get("classes") or {"": results}  # a temperature mix: one table per class, then the mix
    for label, c in classes.items():
        at = f" at {label} (weight {c['weight']:.2f})" if label else ""
        table = Table(title=f"held-out requests{at}: {len(c['prompts'])}, {hw.get('gpu') or hw.get('cpu')}, "
                            f"{hw.get('threads')} thread(s); speedups measured in this run, interleaved")
        for i, col in enumerate(POLICY_COLUMNS):
            table.add_column(col, justify="left" if i == 0 else "right")
        for row in policy_rows(c):
            table.add_row(*(escape(cell) for cell in (display_name(row[0]), *row[1:])))  # `ppo[x]` is not markup
        console.print(table)
    if "classes" in results:
        from draftrl.cli.eval import print_mix_table

        print_mix_table(results)
    ex = results["exactness"]
    verdict = "[bold green]PASSED[/]" if ex["passed"] else "[bold red]FAILED[/]"
    checks = []
    gi = ex["greedy_identity"]
    if gi.get("checked") and gi.get("mode") == "near-tie":
        checks.append(f"per-token argmax of the verifying forward on every round; agreement with plain decoding "
                      f"{gi['identical']}/{gi['comparisons']}, {gi['num_near_ties']} near-tie(s), "
                      f"{gi['num_violations']} violation(s)")
    elif gi.get("checked"):
        checks.append(f"greedy token identity on {gi['requests']} requests")
    keyed = [label for label, c in (results.get("classes") or {}).items()
             if (c.get("sampling") or {}).get("temperature", 0) > 0
             and ((c.get("exactness") or {}).get("greedy_identity") or {}).get("checked")]
    if keyed:  # env.keyed: the sampled classes drew from plain decoding's keyed stream
        checks.append(f"token identity with plain decoding's keyed stream at {', '.join(keyed)}")
    if (ex.get("hf_reference") or {}).get("checked"):
        checks.append(f"HF generate on {ex['hf_reference']['checked']}")
    overhead = ex["monitor_overhead"]["fraction"]
    power = ex.get("power") or {}
    if "correct" in power and power["correct"].get("monitor_overhead") is not None:
        overhead = power["correct"]["monitor_overhead"]
        wrong = power.get("resample-from-p", {})
        checks.append(f"monitor caught resample-from-p after {wrong.get('first_detection') or 'never'} tokens, "
                      f"quiet on the correct sampler over {power['correct']['tokens']}")
    console.print(f"exactness: {verdict} ({'; '.join(checks)})")
    for label, key in (("grid (tune)", "grid_greedy_identity"), ("eval (held-out)", "greedy_identity")):
        if (ex.get(key) or {}).get("mode") == "near-tie":
            lines = verdict_lines(ex[key])
            console.print(escape(f"{label}: {lines[0]}"), soft_wrap=True)
            for line in lines[1:]:
                console.print(escape(line), soft_wrap=True)
    if overhead is not None:
        where = ("at temperature 1, every token tested" if "correct" in power
                 else "at temperature 0 the monitor has nothing to test; eval.power_tokens > 0 measures it at "
                      "temperature 1" if ex["temperature"] == 0
                 else f"at temperature {ex['temperature']:g}" if not isinstance(ex["temperature"], list)
                 else "over the classes of the mix")
        console.print(f"monitor overhead: {overhead * 100:.2f}% of decoding time (target < 3%; {where})")
    steps = ", ".join(f"{k} {v['seconds']:.0f}s" for k, v in summary["steps"].items())
    console.print(f"time: {summary['wall_seconds'] / 60:.1f} min ({steps})")
    out = summary["out"]
    console.print(f"report: {summary['report']}\nplots:  {out}/eval/*.png, {out}/grid/grid_heatmap.png\n"
                  f"results: {summary['results']}")
    print_wandb(console, summary.get("wandb"))


def print_wandb(console, wandb: dict | None) -> None:
    """The pipeline's wandb group and the one command that uploads every run of it."""
    from rich.markup import escape

    if wandb and wandb.get("sync"):
        console.print(f"wandb: group {escape(wandb['group'])}, offline; upload every run of it with:\n"
                      f"  {escape(wandb['sync'])}")
    elif wandb and wandb.get("group"):
        console.print(f"wandb: group {escape(wandb['group'])}")


def run_vllm(args: argparse.Namespace) -> int:
    """``draftrl demo --engine vllm``: :func:`draftrl.eval.serve.demo.run_demo` with its table."""
    from rich.console import Console

    from draftrl.decoding.vllm.engine import require_vllm
    from draftrl.eval.serve.compare import ServingMismatch
    from draftrl.eval.serve.demo import OUTPUTS, STEPS, ServeDemoConfig, run_demo
    from draftrl.io import refuse_foreign

    require_vllm()
    args.out = args.out or "runs/serve_demo"
    cfg = _options.load(ServeDemoConfig, args, base=ServeDemoConfig.quick() if args.quick else None)
    refuse_foreign(args.out, OUTPUTS, overwrite=args.overwrite, command="demo --engine vllm")  # one line, first
    console = Console(stderr=True)
    console.rule(f"[bold]draftrl demo --engine vllm{' --quick' if args.quick else ''}[/] -> {args.out}")
    try:
        with progress_bar(STEPS[0]) as update:
            started, done = _step_printer(console, STEPS, update)
            summary = run_demo(cfg, args.out, overwrite=args.overwrite, step_started=started, step_done=done,
                                     progress=update)
    except ServingMismatch as err:
        print(f"draftrl demo: EXACTNESS FAILED: {err}", file=sys.stderr)
        print(f"partial results in {args.out}/sweep/results.json", file=sys.stderr)
        return 3
    if args.json:
        import json

        from draftrl.io import plain

        print(json.dumps(plain(summary)))
        return 0
    print_serve_summary(summary)
    return 0


def print_serve_summary(summary: dict) -> None:
    """Per rate: every policy's speedup over no speculation in vLLM and in the replay, then
    throughput and latency; then the geometric mean over rates, exactness, time and files."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from draftrl.signals.costs import hardware_name

    console = Console(width=None if sys.stdout.isatty() else 160)
    fmt = lambda v, scale=1.0, spec="{:.2f}": "-" if v is None else spec.format(v * scale)  # noqa: E731
    for rate, rows in summary["rates"].items():
        table = Table(title=f"Poisson {rate} requests/s, held-out requests, {hardware_name(summary['hardware'])}; "
                            "policies interleaved, ratios from one run")
        ceiling = summary.get("hindsight_vs_none", {}).get(rate)
        if ceiling:
            table.caption = f"the replay's hindsight ceiling: {ceiling:.2f}x none"
        for i, col in enumerate(("policy", "vs none (vLLM)", "vs none (replay)", "vs best fixed", "tokens/s",
                                 "TTFT p50 s", "ITL p50 ms", "ITL p95 ms")):
            table.add_column(col, justify="left" if i == 0 else "right")
        for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["speedup_vs_none"]):
            table.add_row(escape(name), f"{r['speedup_vs_none']:.2f}x",
                          fmt(r["replay_speedup_vs_none"], spec="{:.2f}x"),
                          fmt(r.get("speedup_vs_best_fixed"), spec="{:.2f}x"),
                          f"{r['tokens_per_second']:.1f}", fmt(r["ttft_p50"]), fmt(r["itl_p50"], 1e3, "{:.0f}"),
                          fmt(r["itl_p95"], 1e3, "{:.0f}"))
        console.print(table)
    for rate, classes in summary.get("classes", {}).items():
        table = Table(title=f"Poisson {rate} requests/s per sampling class: tokens / request latency over none's "
                            f"(vLLM / replay) and over the best fixed K's ({escape(str(summary.get('best_fixed')))})")
        table.add_column("policy")
        for cls in classes:
            table.add_column(f"{cls} vs none", justify="right")
            table.add_column(f"{cls} vs best fixed", justify="right")
        names = list(dict.fromkeys(n for rows in classes.values() for n in rows))
        for name in names:
            cells = []
            for rows in classes.values():
                r = rows.get(name, {})
                cells += [f"{fmt(r.get('speedup_vs_none'), spec='{:.2f}x')} / "
                          f"{fmt(r.get('replay_speedup_vs_none'), spec='{:.2f}x')}",
                          fmt(r.get("speedup_vs_best_fixed"), spec="{:.2f}x")]
            table.add_row(escape(name), *cells)
        console.print(table)
    geo = "  ".join(f"{escape(k)} {v:.2f}x" for k, v in sorted(summary["geomean_speedup_vs_none"].items(),
                                                                 key=lambda kv: -kv[1]))
    console.print(f"geometric mean over rates, vs none: {geo}")
    if summary.get("geomean_speedup_vs_best_fixed"):
        geo = "  ".join(f"{escape(k)} {v:.2f}x" for k, v in sorted(summary["geomean_speedup_vs_best_fixed"].items(),
                                                                     key=lambda kv: -kv[1]))
        console.print(f"geometric mean over rates, vs the best fixed K ({escape(summary['best_fixed'])}): {geo}")
    if summary.get("calibration_problem"):
        console.print(f"[bold red]calibration:[/] {escape(summary['calibration_problem'])}")
    tau = summary["kendall_tau"]
    console.print(f"replay vs vLLM ranking: Kendall tau {fmt(tau)} over every (rate, policy)")
    ex = summary["exactness"]
    how = ("float32 greedy identity against vLLM without speculation" if ex["greedy_identity"]["checked"]
           else "the monitor on the sampled streams")
    console.print(f"exactness: {'[bold green]PASSED[/]' if ex['passed'] else '[bold red]FAILED[/]'} ({how})")
    steps = ", ".join(f"{k} {v['seconds']:.0f}s" for k, v in summary["steps"].items())
    console.print(f"time: {summary['wall_seconds'] / 60:.1f} min ({steps})")
    console.print(f"report: {summary['report']}\nplot:   {summary['plot']}\n"
                  f"summary: {summary['out']}/serve_demo_summary.json")
    print_wandb(console, summary.get("wandb"))
