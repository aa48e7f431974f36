"""``draftrl distill``: train an EAGLE-3 draft head for the target, saved in the speculators format.

    draftrl distill --out runs/heads/smollm2 --quick          # minutes on 2 CPU cores: a first look
    draftrl distill --out runs/heads/smollm2                  # the default recipe (needs "draftrl[distill]")
    draftrl distill --out runs/heads/smollm2 --set epochs=6   # then: train on from the last checkpoint
    draftrl distill --out heads/big --target DIR --device cuda --dtype bfloat16 --sharegpt 5000

The folder then serves in stock vLLM (``speculative_config={"method": "eagle3", "model": OUT, ...}``)
and in draftrl's engine (``--drafter eagle3:OUT``). The whole config is checked against the target's
``config.json`` before anything is written (a refused run leaves ``--out`` as it was). Rerunning the
same command resumes an interrupted distillation; rerunning it with a larger ``epochs`` trains on
(data and hidden states kept). The card (``OUT/README.md``) records the commands with their paths
relative to ``OUT``.
"""

from __future__ import annotations

import argparse
import json

from draftrl.cli import _options


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("distill", help="train an EAGLE-3 draft head for the target (speculators format)")
    _options.add_config(p, example="epochs=2")
    _options.keyed(p, "--target", key="target", help="target model: smollm2-135m, a local path or hub id")
    _options.keyed(p, "--device", key="device", help="cpu or cuda[:N]")
    _options.keyed(p, "--dtype", key="dtype", help="the target's dtype: float32 or bfloat16 (GPUs)")
    _options.keyed(p, "--sharegpt", key="sharegpt", type=int,
                   help='add the first user turns of N ShareGPT conversations (pip install "draftrl[distill]")')
    _options.add_threads(p)
    p.add_argument("--quick", action="store_true", help="a small run for a first look (minutes on 2 CPU cores)")
    _options.add_out(p, "folder for the head (config.json, model.safetensors, README.md) and work/; "
                        "an interrupted run there resumes", overwrite=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _options.add_json(p)
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    from draftrl.config import load_config
    from draftrl.distill.config import QUICK, DistillConfig

    return load_config(DistillConfig, args.config, (QUICK if args.quick else []) + _options.overrides(args))


def run(args: argparse.Namespace) -> int:
    from draftrl.cli._output import progress_bar
    from draftrl.distill.pipeline import distill

    cfg = config(args)
    _options.set_threads(cfg.threads)
    with progress_bar("distill", enabled=not args.no_progress) as progress:
        summary = distill(cfg, args.out, args.argv, progress)
    print(json.dumps(summary) if args.json else " ".join(f"{k}={v}" for k, v in summary.items()))
    return 0
