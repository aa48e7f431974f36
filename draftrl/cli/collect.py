"""``draftrl collect``: record greedy traces for ``draftrl/TraceReplay-v0``.

Reads an env config (YAML with an ``env:`` section, e.g. ``configs/tiny_cpu.yaml``), decodes
every selected prompt greedily with the real target and stores, from every true prefix, the
drafter's tree of ``max(env.depths)`` levels and ``env.width`` nodes per level (see
``draftrl.envs.traces``). The resolved config, the hardware and (with ``--cost-table``) the cost
table are saved next to the traces.

    draftrl collect --config configs/tiny_cpu.yaml --out runs/traces/tiny --cost-table costs.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from draftrl.cli import _options


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("collect", help="record greedy draft/target traces for TraceReplay-v0")
    _options.add_config(p)
    _options.add_models(p)
    _options.add_threads(p)
    _options.add_out(p, "directory for trace.npz, trace.json (and cost_table.json)")
    p.add_argument("--cost-table", default=None, help="cost table from draftrl calibrate, copied next to the traces")
    _options.add_json(p)
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    """The command's :class:`~draftrl.config.commands.CollectConfig` (the file's other sections are skipped)."""
    from draftrl.config.commands import CollectConfig

    return _options.load(CollectConfig, args, partial=True)


def run(args: argparse.Namespace) -> int:
    from draftrl.envs.engines import build_engine
    from draftrl.envs.traces import collect
    from draftrl.signals.costs import CostTable

    cfg = config(args)
    _options.set_threads(cfg.threads)
    table = CostTable.load(args.cost_table) if args.cost_table else None  # fail before decoding anything
    engine, tokenizer = build_engine(cfg.env)

    def progress(index, prompt, seconds):
        print(f"[collect] {index + 1} {prompt.id} {seconds:.1f}s", file=sys.stderr)

    traces = collect(cfg.env, engine, tokenizer, progress=progress)
    out = traces.save(args.out)
    if table is not None:
        shutil.copyfile(args.cost_table, Path(out) / "cost_table.json")
    summary = {"prompts": len(traces), "positions": int(traces.cu_num_positions[-1]), "nodes": len(traces.node_tokens),
               "max_depth": traces.max_depth, "width": traces.width, "seconds": traces.meta["collect_seconds"],
               "out": str(out)}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"prompts={summary['prompts']} positions={summary['positions']} nodes={summary['nodes']} "
        f"max_depth={summary['max_depth']} width={summary['width']} seconds={summary['seconds']:.1f} out={out}"
    )
    return 0
