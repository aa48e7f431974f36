"""``draftrl eval``: compare drafting policies on the held-out split, with the exactness monitor on.

    draftrl eval --config configs/eval_tiny_cpu.yaml --policies none,best-grid,heuristic,threshold,bandit,lookahead \
        --grid runs/grid/grid.json --out runs/eval
    draftrl eval --config configs/eval_tiny_cpu.yaml --policies none,ppo:runs/ppo --out runs/eval_ppo

Inside vLLM under concurrent load (draftrl.eval.serve.compare; needs vLLM installed)::

    draftrl eval --engine vllm --policies none,fixed:4,heuristic,vllm-ngram:4,dsd:1-1:4,2-4:3,5-16:1 \
        --concurrency 1,4,16 --out runs/serve
    draftrl eval --engine vllm --policies none,vllm-eagle3:2,fixed:2,stop:6:t0.6 --drafter eagle3:runs/distill/head \
        --out runs/serve_eagle3

One policy grammar for both engines (draftrl.eval.policy_names; a name one engine cannot run is
refused naming the ones it can): a policy name says what decides, ``--drafter`` (or a policy's own
``@DRAFTER``, e.g. ``fixed:2@eagle3``) what drafts. One workload section: ``--set env.KEY=VALUE``,
``--target`` and ``--drafter`` set the same key on both. Writes DIR/results.json and DIR/report.md
(hf: PNG plots too); exits 3
with the evidence when an exactness check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftrl.cli import _options
from draftrl.cli._output import exactness_failure, progress_bar
from draftrl.cli.grid import add_eval_options, config, print_greedy_verdict, ray_shards
from draftrl.eval.policy_names import accepted_names

#: ``--engine vllm``'s policies without ``--policies``.
VLLM_POLICIES = ("none", "fixed:4", "heuristic")


def _policies(text: str) -> tuple[str, ...]:
    from draftrl.eval.policy_names import split_policies

    return tuple(split_policies(text))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("eval", help="compare policies on held-out requests (speed, latency, exactness)")
    add_eval_options(p)
    keyed = _options.keyed
    keyed(p, "--policies", key="eval.policies", type=_policies,
          help=f"comma-separated (sets eval.policies); --engine hf: {accepted_names('hf')}; "
               f"--engine vllm: {accepted_names('vllm')}; NAME@DRAFTER drafts with another drafter than --drafter "
               "(e.g. fixed:2@eagle3)")
    p.add_argument("--grid", default=None, help="grid.json from draftrl grid (needed by best-grid; adds the heatmap)")
    _options.add_out(p, "output directory (results.json, report.md, plots)")
    keyed(p, "--no-monitor", key="eval.monitor", action="store_const", const=False,
          help="turn the streaming exactness monitor off")
    keyed(p, "--sampler", key="eval.sampler", choices=_options.samplers(),
          help="resample-from-p (the known-wrong correction) and off-by-one (keeps the first rejected draft token) "
               "are negative controls of the monitor and of the per-token argmax check")
    keyed(p, "--power-tokens", key="eval.power_tokens", type=int,
          help="also measure the tokens each monitor statistic needs to catch resample-from-p (0 = skip)")
    _options.add_ignore_eos(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                   help="hf: draftrl's exact engine, one request at a time (default); vllm: inside vLLM under load "
                        "(the env section is then a ServeConfig: the same workload keys, e.g. "
                        "--set env.max_new_tokens=48, "
                        "plus arrivals and engine settings)")
    p.add_argument("--concurrency", default="1,4,16", help="vllm: requests kept in flight, comma-separated")
    p.add_argument("--rates", default="", help="vllm: Poisson arrival rates (requests/s), comma-separated")
    p.add_argument("--repeats", type=int, default=1, help="vllm: interleaved passes; the median-time pass is kept")
    _options.add_retired(p, "--head", "the head is part of the drafter spec: --drafter eagle3:{value} (every policy "
                         "drafts with it) or one policy's @eagle3:{value} (e.g. vllm-eagle3:2@eagle3:{value})")
    _options.add_vllm_engine(p)
    _options.add_ray(p, "hf: share the held-out requests out over Ray workers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _options.refuse_retired(args)
    if args.engine == "vllm":
        if args.ray is not None:
            raise ValueError("--ray shares out --engine hf evaluations only (vLLM batches its own requests under "
                             "load; one engine per command); drop it.")
        return run_vllm(args)
    _options.refuse_vllm_engine(args, "draftrl eval")
    from draftrl.decoding.monitor import ExactnessViolation
    from draftrl.eval.exactness import GreedyMismatch
    from draftrl.eval.policy_names import parse_policies

    cfg = config(args)
    policies = list(cfg.eval.policies)
    from draftrl.drafters.packaged import missing_head
    from draftrl.drafters.registry import check_drafter_spec
    from draftrl.policies.ppo import load_checked

    for spec in parse_policies(policies):  # fail on a bad name, drafter or damaged policy before loading any model
        if spec.kind == "ppo":
            load_checked(spec.path)
        if spec.drafter is not None:
            check_drafter_spec(spec.drafter)
            line = missing_head(spec.drafter, cfg.env.target)
            if line is not None:
                raise ValueError(f"policy {spec.label!r}: {line}")
    from draftrl.eval.round.compare import OUTPUTS, run_eval
    from draftrl.io import prepare_out

    prepare_out(args.out, OUTPUTS, overwrite=args.overwrite, command="eval")  # before any model loads

    try:
        with ray_shards(args, cfg, "eval") as shards, progress_bar("eval", not args.quiet) as update:
            results = run_eval(cfg, args.out, policies=policies, grid_path=args.grid, config_path=args.config,
                               progress=update, shards=shards)
    except (ExactnessViolation, GreedyMismatch) as err:
        code = exactness_failure("eval", err)
        print(f"partial results in {args.out}/results.json", file=sys.stderr)
        return code
    if args.json:
        from draftrl.io import plain

        print(json.dumps(plain(results)))
        return 0
    if "classes" in results:  # a temperature mix: a table per class, then the mix
        for label, c in results["classes"].items():
            print_policy_table(c, f"held-out evaluation at {label} (weight {c['weight']:.2f}, "
                                  f"{len(c['prompts'])} requests)")
        print_mix_table(results)
    else:
        print_policy_table(results, f"held-out evaluation ({len(results['prompts'])} requests)")
    ex = results["exactness"]
    print(f"exactness: {'PASSED' if ex['passed'] else 'FAILED'}  monitor_overhead="
          f"{(ex['monitor_overhead']['fraction'] or 0) * 100:.3f}%  report: {args.out}/report.md")
    print_greedy_verdict(ex.get("greedy_identity") or {})
    return 0


def print_mix_table(results: dict) -> None:
    """The mix's table: every ratio weight-averaged over the classes (``draftrl.eval.report.mix_rows``)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from draftrl.eval.report import mix_columns, mix_rows

    weights = " + ".join(f"{w:.2f} x {label}" for label, w in results["mix"]["weights"].items())
    table = Table(title=escape(f"temperature mix ({weights})"))
    for i, col in enumerate(mix_columns(results)):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in mix_rows(results):
        table.add_row(*(escape(cell) for cell in row))
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def print_policy_table(results: dict, title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from draftrl.eval.report import POLICY_COLUMNS, policy_rows

    table = Table(title=escape(title))
    for i, col in enumerate(POLICY_COLUMNS):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in policy_rows(results):
        table.add_row(*(escape(cell) for cell in row))  # plain text: `ppo[ppo_size]` is not markup
    Console(width=None if sys.stdout.isatty() else 160).print(table)  # pipes and logs get the full table


def serving_config(args: argparse.Namespace):
    """``--engine vllm``'s :class:`~draftrl.config.serve.ServeConfig`: held-out split, file order, seed 0,
    then ``--config``'s env section, ``--set env.KEY=VALUE`` and the flags (the same keys as ``--engine hf``)."""
    from draftrl.config.serve import load_serve_config

    items = _options.overrides(args)
    hf_only = [item for item in items if item.startswith("eval.") and not item.startswith("eval.policies=")]
    if hf_only:
        raise ValueError(f"{hf_only[0].partition('=')[0]} is read by --engine hf only; drop it with --engine vllm.")
    return load_serve_config(args.config, [item for item in items if not item.startswith(("eval.", "wandb."))],
                             split="heldout", shuffle=False, seed=0)


def serving_wandb(args: argparse.Namespace):
    """``--engine vllm``'s :class:`~draftrl.config.wandb.WandbConfig`: ``--config``'s ``wandb:`` section,
    then ``--set wandb.KEY=VALUE`` and the ``--wandb-*`` flags."""
    from draftrl.config import load_config
    from draftrl.config.wandb import WandbOnlyConfig

    items = [item for item in _options.overrides(args) if item.startswith("wandb.")]
    return load_config(WandbOnlyConfig, args.config, items, partial=True).wandb


def run_vllm(args: argparse.Namespace) -> int:
    from draftrl.eval.policy_names import parse_policies
    from draftrl.eval.serve.compare import ServingMismatch, run_eval
    from draftrl.eval.serve.policies import check_policies

    policies = list(args.policies or VLLM_POLICIES)
    specs = parse_policies(policies, engine="vllm")  # fail on a bad name before loading vLLM
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    rates = [float(r) for r in args.rates.split(",") if r]
    config = serving_config(args)
    check_policies(specs, config)  # and on a value off the grids, a drafter or head vLLM cannot run, before --out
    check_parallel_policies(specs, config)
    wandb = serving_wandb(args)
    from draftrl.eval.round.compare import OUTPUTS
    from draftrl.io import prepare_out

    prepare_out(args.out, OUTPUTS, overwrite=args.overwrite, command="eval")  # before vLLM loads
    try:
        with progress_bar("eval", not args.quiet) as update:
            results = run_eval(args.out, policies=policies, concurrency=concurrency, rates=rates,
                                       repeats=args.repeats, config=config, progress=update)
    except ServingMismatch as err:
        _log_serving(wandb, args.out, None)
        print(f"draftrl eval: EXACTNESS FAILED: {err}", file=sys.stderr)
        print(f"partial results in {args.out}/results.json", file=sys.stderr)
        return 3
    _log_serving(wandb, args.out, results)
    print((Path(args.out) / "report.md").read_text())
    return 0


def check_parallel_policies(specs, config) -> None:
    """With ``env.tensor_parallel_size`` or ``env.pipeline_parallel_size`` above 1, refuse before vLLM loads
    (one line naming the policy) a policy whose engine cannot run so split
    (``draftrl.decoding.vllm.engine.check_parallelism``: draftrl's stepped proposer needs one worker)."""
    if config.tensor_parallel_size == 1 and config.pipeline_parallel_size == 1:
        return
    from draftrl.eval.serve.policies import engine_config_for

    for spec in specs:
        try:
            engine_config_for(spec, config)
        except ValueError as err:
            raise ValueError(f"policy {spec.label!r}: {err}") from None


def _log_serving(wandb, out: str, results: dict | None) -> None:
    """The serving evaluation's wandb run (``job_type`` eval); ``results`` None: the sweep stopped at an
    exactness failure, its results.json is logged and the run ends failed (exit code 3)."""
    from draftrl.config.wandb import EXACTNESS_FAILED, logged_run, wandb_mode
    from draftrl.eval.wandb_log import log_sweep
    from draftrl.io import read_json

    if wandb_mode(wandb) == "disabled":
        return
    failed = results is None
    results = results if results is not None else read_json(Path(out) / "results.json", "serving results")
    with logged_run(wandb, out, job_type="eval", code=EXACTNESS_FAILED if failed else 0,
                    config={"engine": "vllm", **results["config"]}) as run:
        log_sweep(run, results)
