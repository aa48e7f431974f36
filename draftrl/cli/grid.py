"""``draftrl grid``: time fixed (depth, verify_size, width) settings on the tune split.

    draftrl grid --config configs/eval_tiny_cpu.yaml --out runs/grid
    draftrl grid --config configs/eval_tiny_cpu.yaml --out runs/sweep --cell --depth=4 --verify_size=0 --width=1

Writes DIR/grid.json (per cell: tokens/s, speedup vs plain decoding, mean tokens per round,
per language and task; the best setting), DIR/grid_heatmap.png, DIR/sweep.yaml (the same grid
as a wandb sweep whose agents run the ``--cell`` form) and one wandb run holding every cell.
"""

from __future__ import annotations

import argparse
import contextlib
import json

from draftrl.cli import _options
from draftrl.cli._output import exactness_failure, progress_bar


def add_eval_options(p: argparse.ArgumentParser) -> None:
    """What grid, eval and demo share: the config, the models, threads, seed, wandb, json."""
    _options.add_config(p)
    _options.add_models(p)
    _options.add_threads(p)
    _options.add_seed(p, "the prompts' sampling seeds (shared by every setting)")
    _options.add_wandb(p)
    _options.add_json(p)


def config(args: argparse.Namespace):
    """The command's :class:`~draftrl.eval.round.config.EvalConfig` (a demo config's grid and eval steps:
    ``_options.load_step``), its drafter's head checked before any model loads."""
    from draftrl.eval.round.config import EvalConfig

    cfg = _options.load_step(EvalConfig, args)
    cfg.env = _options.settle_drafter(cfg.env, args)
    return cfg


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("grid", help="grid-search fixed depth x verify_size x width settings (tune split)")
    add_eval_options(p)
    _options.add_out(p, "output directory (grid.json, grid_heatmap.png, sweep.yaml)")
    p.add_argument("--cell", action="store_true", help="time one cell (--depth/--verify-size/--width) against "
                   "plain decoding: the command wandb sweep agents run")
    p.add_argument("--depth", type=int, default=None, help="with --cell: draft depth")
    # wandb sweep agents pass the sweep's parameter names verbatim (--verify_size=V), hence the second spelling
    p.add_argument("--verify-size", "--verify_size", dest="verify_size", type=int, default=0,
                   help="with --cell: verify size (0 = all drafted nodes)")
    p.add_argument("--width", type=int, default=1, help="with --cell: tree width")
    _options.keyed(p, "--no-monitor", key="eval.monitor", action="store_const", const=False,
                   help="skip the exactness monitor at temperature > 0")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _options.add_ray(p, "share the tune requests out over Ray workers")
    p.set_defaults(func=run)


def ray_shards(args: argparse.Namespace, cfg, command: str):
    """``--ray``: the workers of ``draftrl.eval.round.ray_shards.RayShards`` (a context manager), else
    a null context (``None``: this process plays every request)."""
    if args.ray is None:
        return contextlib.nullcontext()
    from draftrl.cluster import check_request
    from draftrl.eval.round.ray_shards import RayShards

    check_request(args.ray_workers, args.ray_gpus, cfg.env.device)
    return RayShards(cfg, command, address=args.ray, workers=args.ray_workers, gpus_per_worker=args.ray_gpus)


def run(args: argparse.Namespace) -> int:
    from draftrl.decoding.monitor import ExactnessViolation
    from draftrl.eval.exactness import GreedyMismatch

    if args.ray is not None and args.cell:
        raise ValueError("--ray shares out a whole grid; a sweep cell (--cell) is one wandb agent's work: drop --ray "
                         "or --cell.")
    cfg = config(args)
    try:
        if args.cell:
            from draftrl.eval.round.grid import OUTPUTS, Cell, run_cell
            from draftrl.io import refuse_foreign

            if args.depth is None:
                raise ValueError("--cell needs --depth (and optionally --verify-size, --width)")
            # the cells of one sweep share the folder
            refuse_foreign(args.out, (*OUTPUTS, "cell_*.json"), overwrite=args.overwrite, command="grid")
            result = run_cell(cfg, args.out, Cell(args.depth, args.verify_size, args.width))
            c = result["cell"]
            if args.json:
                print(json.dumps(result["cell"]))
                return 0
            print(f"speedup_vs_none={c['speedup_vs_none']:.3f}x  tokens_per_second={c['tokens_per_second']:.2f}  "
                  f"mean_tokens_per_round={c['mean_tokens_per_round']:.2f}  "
                  f"cell=d{c['depth']}_v{c['verify_size']}_w{c['width']}")
            return 0
        from draftrl.eval.round.grid import OUTPUTS, run_grid
        from draftrl.io import prepare_out

        prepare_out(args.out, OUTPUTS, overwrite=args.overwrite, command="grid")
        with ray_shards(args, cfg, "grid") as shards, progress_bar("grid", not args.quiet) as update:
            result = run_grid(cfg, args.out, config_path=args.config, progress=update, shards=shards)
    except (ExactnessViolation, GreedyMismatch) as err:
        return exactness_failure("grid", err)
    if args.json:
        from draftrl.io import plain

        print(json.dumps(plain(result)))
        return 0
    if "classes" in result:  # a temperature mix: each class's best, then the mix's cells
        for label, c in result["classes"].items():
            b = c["best"]
            print(f"{label} (weight {c['weight']:.2f}): best {b['name']}  speedup_vs_none={b['speedup_vs_none']:.3f}x  "
                  f"{_anchor_ratios(b)}")
        for name, c in sorted(result["mix"]["cells"].items(), key=lambda kv: -kv[1]["speedup_vs_none"]):
            mark = "  <- best for the mix" if name == result["best"]["name"] else ""
            per = "  ".join(f"{label}={v:.3f}x" for label, v in c["per_class"].items())
            print(f"mix speedup_vs_none={c['speedup_vs_none']:.3f}x  ({per})  cell={name}{mark}")
        print(f"grid.json, grid_heatmap.png (the mix), grid_heatmap_<class>.png and sweep.yaml in {args.out}")
        return 0
    for name, c in sorted(result["cells"].items(), key=lambda kv: -kv[1]["tokens_per_second"]):
        mark = "  <- best" if name == result["best"]["name"] else ""
        noise = "-" if c["noise"] is None else f"{c['noise']:.2f}"
        print(f"speedup_vs_none={c['speedup_vs_none']:.3f}x  {_anchor_ratios(c)}"
              f"tokens_per_round={c['mean_tokens_per_round']:.2f}  "
              f"tokens_per_second={c['tokens_per_second']:.2f}  noise={noise}  cell={name}{mark}")
    anchors = result.get("anchors") or {}
    if anchors.get("methods"):
        timed = "  ".join(f"{label}={m['tokens_per_second']:.2f} tok/s" for label, m in anchors["methods"].items())
        print(f"anchors timed in the same run: {timed}  (best prompt lookup: {anchors.get('best_lookup')})")
    print_greedy_verdict((result.get("exactness") or {}).get("greedy_identity") or {})
    print(f"grid.json, grid_heatmap.png and sweep.yaml in {args.out}")
    return 0


def print_greedy_verdict(verdict: dict, label: str = "exactness") -> None:
    """The greedy verdict (``draftrl.eval.agreement``): bitwise identity in float32, the agreement rate
    and each divergence's margin in bfloat16/float16; nothing at temperature > 0."""
    from draftrl.eval.agreement import verdict_lines

    for i, line in enumerate(verdict_lines(verdict)):
        print(f"{label}: {line}" if i == 0 else line)


def _anchor_ratios(cell: dict) -> str:
    """``vs_hf=..x  vs_hf_lookup=..x  `` when the grid timed the Hugging Face anchors."""
    parts = [f"{label}={cell[key]:.3f}x" for key, label in (("speedup_vs_hf", "vs_hf"),
                                                          ("speedup_vs_hf_lookup", "vs_hf_lookup"))
             if cell.get(key) is not None]
    return "".join(f"{p}  " for p in parts)
