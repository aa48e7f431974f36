"""``draftrl train``: train a drafting policy from a YAML config, then evaluate it against grid search.

Example::

    draftrl train --config configs/analytic_regimes.yaml --out runs/analytic
    draftrl train --config configs/analytic_regimes.yaml --set total_timesteps=200000 --out runs/long
    draftrl train --config configs/analytic_regimes.yaml --out runs/analytic --resume   # after an interruption

Writes DIR/policy.zip (+ vecnormalize.pkl, policy.json), DIR/train_summary.json, checkpoints and an
offline wandb run (``wandb sync DIR/wandb`` uploads it later; ``--wandb-group`` puts it beside a
grid's and an evaluation's runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from typing import Any

from draftrl.cli import _options


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help="train a PPO drafting policy from a config and compare it with every fixed setting",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    _options.add_config(parser, "ppo.learning_rate=1.0e-3")
    _options.add_models(parser)
    _options.add_threads(parser)
    _options.add_seed(parser, "PPO, the training envs (seed + i for env i) and torch")
    _options.add_wandb(parser)
    _options.add_out(parser, "run directory for the policy, checkpoints and summary",
                     overwrite="start afresh: remove an earlier run's files in --out (files draftrl train did not "
                               "write stay)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    parser.add_argument("--traces", default=None,
                        help="with a demo config (a file with the demo's train: section, e.g. a copy of "
                             "configs/demo_cpu.yaml): the traces its collect step wrote (DEMO_OUT/traces); trains the "
                             "demo's first recipe as its train step does (--set recipe=ppo_depth for another)")
    _options.add_json(parser)
    parser.set_defaults(func=run)
    return parser


def config(args: argparse.Namespace):
    """The command's :class:`~draftrl.train.config.TrainConfig`; from a demo config (``_options.is_demo_file``)
    what the demo's train step runs on ``--traces`` (``draftrl.eval.round.demo.train_config``), then ``--set``."""
    from draftrl.train.config import TrainConfig

    if not _options.is_demo_file(args.config):
        if args.traces is not None:
            raise ValueError(f"--traces is read with a demo config only (a file with a train: section, e.g. "
                             f"configs/demo_cpu.yaml); with --config {args.config} set env.traces (and "
                             "depth_env.traces) in the file or with --set env.traces=DIR.")
        return _options.load(TrainConfig, args)
    from draftrl.config import load_config
    from draftrl.eval.round.demo import DemoConfig, train_config

    if args.traces is None:
        raise ValueError(f"--config {args.config} is a demo config: pass --traces DIR, the traces its collect step "
                         "wrote (e.g. runs/demo/traces, or draftrl collect --config ... --out DIR).")
    demo = load_config(DemoConfig, args.config, partial=True)
    items = _options.overrides(args)
    # the demo trains on one env section, its step-level twin (depth_env) a copy: env.KEY sets both
    both = [f"depth_env.{item.lstrip()[4:]}" for item in items if item.lstrip().startswith("env.")
            and item.lstrip()[4:].partition("=")[0].strip() != "id"]
    cfg = load_config(TrainConfig, None, items + both, base=train_config(demo, demo.train.recipes[0], args.traces))
    env = _options.settle_drafter(cfg.env, args)  # the drafter the demo's collect step recorded the traces with
    cfg.env, cfg.depth_env = env, dataclasses.replace(cfg.depth_env, drafter=env.drafter)
    return cfg


def check_out(out: str, overwrite: bool, resume: bool) -> None:
    """Before any work: a fresh run refuses an --out holding files draftrl train did not write, and
    with ``overwrite`` removes an earlier run's files there (a resumed run reads them)."""
    from draftrl.io import prepare_out, refuse_foreign
    from draftrl.runs import RUN_OUTPUTS

    if resume:
        if overwrite:
            raise ValueError("--resume continues the run in --out and --overwrite discards it; pass one of them.")
        return
    if overwrite:
        prepare_out(out, RUN_OUTPUTS, overwrite=True, command="train")
    else:
        refuse_foreign(out, RUN_OUTPUTS, overwrite=False, command="train")


def run(args: argparse.Namespace) -> int:
    cfg = config(args)
    check_out(args.out, args.overwrite, args.resume)
    recipe = importlib.import_module(f"draftrl.train.{cfg.recipe}")
    from draftrl.train.loop import TrainingInterrupted

    try:
        summary = recipe.train(cfg, args.out, resume=args.resume)
    except TrainingInterrupted as stop:
        print(f"draftrl train: interrupted; {stop}. Continue with: {_resume_command(args)}", file=sys.stderr)
        return 130
    if summary is None:
        print(f"draftrl train: stopped early; continue with: {_resume_command(args)}")
        return 1
    if args.json:
        from draftrl.io import plain

        print(json.dumps(plain(summary)))
    else:
        from draftrl.train.evaluation import format_table

        print(format_table(summary["evaluation"]))
    return 0


def _resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run (the same arguments plus ``--resume``)."""
    import shlex

    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    if argv[:1] != ["train"]:
        argv = ["train", *argv]
    argv = [a for a in argv if a != "--overwrite"]  # the resumed run keeps what this one wrote
    if "--resume" not in argv:
        argv.append("--resume")
    return "draftrl " + " ".join(shlex.quote(a) for a in argv)
