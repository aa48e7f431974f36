"""``draftrl train``: train a drafting policy from a YAML config, then evaluate it against grid search.

Example::

    draftrl train --config configs/analytic_regimes.yaml --out runs/analytic
    draftrl train --config configs/analytic_regimes.yaml --set total_timesteps=200000 --out runs/long
    draftrl train --config configs/analytic_regimes.yaml --out runs/analytic --resume   # after an interruption

Writes DIR/policy.zip (+ vecnormalize.pkl, policy.json), DIR/train_summary.json, checkpoints and an
offline wandb run (``wandb sync DIR/wandb/offline-run-*`` uploads it later).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train",
        help="train a PPO drafting policy from a config and compare it with every fixed setting",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--config", default=None, help="YAML file from configs/ (default: TrainConfig defaults)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set ppo.learning_rate=1.0e-3 (repeatable)",
    )
    parser.add_argument("--out", required=True, help="run directory for the policy, checkpoints and summary")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from draftrl.config import load_config
    from draftrl.train.config import TrainConfig

    cfg = load_config(TrainConfig, args.config, args.overrides)
    recipe = importlib.import_module(f"draftrl.train.{cfg.recipe}")
    summary = recipe.train(cfg, args.out, resume=args.resume)
    if summary is None:
        print(f"draftrl train: stopped early; continue with --resume --out {args.out}")
        return 1
    return 0
