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
    _options.add_out(parser, "run directory for the policy, checkpoints and summary", overwrite=None)
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    _options.add_json(parser)
    parser.set_defaults(func=run)
    return parser


def config(args: argparse.Namespace):
    """The command's :class:`~draftrl.train.config.TrainConfig`."""
    from draftrl.train.config import TrainConfig

    return _options.load(TrainConfig, args)


def run(args: argparse.Namespace) -> int:
    cfg = config(args)
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
    if "--resume" not in argv:
        argv.append("--resume")
    return "draftrl " + " ".join(shlex.quote(a) for a in argv)
