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
import shutil
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("collect", help="record greedy draft/target traces for TraceReplay-v0")
    p.add_argument("--config", default=None,
                   help="YAML with an env: section (other sections are ignored; default: EnvConfig defaults)")
    p.add_argument("--out", required=True, help="directory for trace.npz, trace.json (and cost_table.json)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set env.max_new_tokens=32 (repeatable)")
    p.add_argument("--cost-table", default=None, help="cost table from draftrl calibrate, copied next to the traces")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from draftrl.envs.config import load_env_config
    from draftrl.envs.costs import CostTable
    from draftrl.envs.engines import build_engine
    from draftrl.envs.traces import collect

    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_env_config(args.config, args.set)
    table = CostTable.load(args.cost_table) if args.cost_table else None  # fail before decoding anything
    engine, tokenizer = build_engine(config)

    def progress(index, prompt, seconds):
        print(f"[collect] {index + 1} {prompt.id} {seconds:.1f}s", file=sys.stderr)

    traces = collect(config, engine, tokenizer, progress=progress)
    out = traces.save(args.out)
    if table is not None:
        shutil.copyfile(args.cost_table, Path(out) / "cost_table.json")
    num_positions = int(traces.cu_num_positions[-1])
    print(
        f"prompts={len(traces)} positions={num_positions} nodes={len(traces.node_tokens)} "
        f"max_depth={traces.max_depth} width={traces.width} seconds={traces.meta['collect_seconds']:.1f} out={out}"
    )
    return 0
