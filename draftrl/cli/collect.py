"""``draftrl collect``: record traces for ``draftrl/TraceReplay-v1``, at any temperature.

Reads an env config (YAML with an ``env:`` section, e.g. ``configs/tiny_cpu.yaml``), decodes
every selected prompt with the real target at each sampling class of the env (``env.temperature``,
``top_k``, ``top_p``, or every entry of ``env.temperature_mix``), ``--continuations K`` times per
sampled class (default 4; once at temperature 0, where decoding is deterministic), each seeded from
(env.seed, prompt, class, k), and stores, from every true prefix, the drafter's deterministic tree of
``max(env.depths)`` levels and ``env.width`` nodes per level (see ``draftrl.replay.traces``: the replay
is exact at temperature 0 and exact in law above it). ``env.draft_sampling=true`` at temperature > 0 is
refused: sampled drafts are exact but not replayable (train them on ``draftrl/SpecDecode-v2``).
The resolved config, the hardware and (with ``--cost-table``) the cost table are saved next to the
traces, all three replaced as one unit (``draftrl.replay.traces``).

An existing trace directory is replaced only with ``--overwrite``; finished recordings (prompt, class,
k) are kept in ``OUT/.partial/``, so after an interruption (Ctrl-C, a crash) the same command resumes.

    draftrl collect --config configs/tiny_cpu.yaml --out runs/traces/tiny --cost-table costs.json
    draftrl collect --config configs/tiny_cpu.yaml --out runs/traces/t07 --set env.temperature=0.7 --continuations 8
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from draftrl.cli import _options


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("collect", help="record draft/target traces for TraceReplay-v1 (any temperature)")
    _options.add_config(p)
    _options.add_models(p)
    _options.add_threads(p)
    _options.add_out(p, "directory for trace.npz, trace.json (and cost_table.json)",
                     overwrite="replace the traces already in --out (and discard an interrupted collection there)")
    p.add_argument("--cost-table", default=None, help="cost table from draftrl calibrate, copied next to the traces")
    p.add_argument("--continuations", type=int, default=None, metavar="K",
                   help="sampled continuations recorded per prompt (per request with --engine vllm) in each "
                        "sampling class at temperature > 0, seeded from env.seed (default: the config's continuations, "
                        "else 4 for traces, 8 for vLLM recordings; a replayed request walks one of them); a greedy "
                        "class records one, greedy decoding being deterministic")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                   help="vllm: record each request's continuations in vLLM (float32, no speculation) for "
                        "draftrl/ServeReplay-v1, in every sampling class of the workload (env.temperature, or "
                        "env.temperature_mix); the env section is then a ServeConfig (the same workload keys, e.g. "
                        "--set env.split=heldout)")
    _options.add_vllm_engine(p)
    _options.add_ray(p, "share the prompts (hf) or the workload's requests (vllm, an engine per worker) out over Ray "
                        "workers")
    _options.add_json(p)
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    """The command's :class:`~draftrl.config.commands.CollectConfig` (the file's other sections are skipped;
    a demo config's collect step: ``_options.load_step``), its drafter's head checked before any model loads."""
    from draftrl.config.commands import CollectConfig

    cfg = _options.load_step(CollectConfig, args)
    cfg.env = _options.settle_drafter(cfg.env, args)
    return cfg


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an --out that holds finished traces (unless ``overwrite``) or anything that is not traces."""
    from draftrl.runs import HEADER_FILE, PARTIAL_DIR, TRACE_FILES

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory for the traces.")
    if not out.is_dir():
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name not in TRACE_FILES)
    if foreign:
        raise ValueError(f"--out {out} holds {', '.join(foreign[:5])}, not traces; choose an empty or new directory.")
    if (out / HEADER_FILE).exists() and not overwrite:
        raise ValueError(f"--out {out} already holds traces; pass --overwrite to replace them, "
                         "or choose another --out.")
    if overwrite and (out / PARTIAL_DIR).exists():
        shutil.rmtree(out / PARTIAL_DIR)


def serving_config(args: argparse.Namespace):
    """``--engine vllm``'s :class:`~draftrl.config.serve.ServeConfig`: ``--config``'s env section, ``--set
    env.KEY=VALUE`` and the flags, the same keys as ``draftrl eval`` on both engines (default split tune)."""
    from draftrl.config.serve import load_serve_config

    return load_serve_config(args.config, _options.overrides(args), split="tune")


def run_vllm(args: argparse.Namespace) -> int:
    """Recordings for ``draftrl/ServeReplay-v1`` (``draftrl.replay.recordings.record_workload``)."""
    from draftrl.config.serve import SERVING_DRAFTER
    from draftrl.io import prepare_out
    from draftrl.replay.recordings import CONTINUATIONS, RECORDINGS_FILE, record_workload

    config = serving_config(args)
    if getattr(args, "continuations", None) is not None and args.continuations < 1:
        raise ValueError(f"--continuations {args.continuations} must be >= 1 (sampled continuations per request).")
    if config.drafter != SERVING_DRAFTER:
        raise ValueError(f"env.drafter={config.drafter!r}: draftrl collect --engine vllm records without "
                         "speculation, so "
                         "no drafter is read; name the drafter where the recordings are replayed (ServeReplay-v1's "
                         "drafter, draftrl eval).")

    def progress(msg: str) -> None:
        print(f"[collect] {msg}", file=sys.stderr, flush=True)

    continuations = getattr(args, "continuations", None) or CONTINUATIONS
    on_ray = getattr(args, "ray", None) is not None
    if on_ray:
        from draftrl.cluster import check_request

        check_request(args.ray_workers, args.ray_gpus, "cpu")
        spans = config.tensor_parallel_size * config.pipeline_parallel_size
        if 0 < args.ray_gpus < spans:
            raise ValueError(f"--ray-gpus {args.ray_gpus:g} with a target split over {spans} GPUs: each worker's "
                             f"engine needs all of them; pass --ray-gpus {spans}.")
    prepare_out(args.out, (RECORDINGS_FILE,), overwrite=args.overwrite, command="collect")  # before vLLM loads
    if on_ray:
        from draftrl.replay.ray_record import record_on_ray

        recordings = record_on_ray(config, continuations=continuations, address=args.ray, workers=args.ray_workers,
                                   gpus_per_worker=args.ray_gpus, progress=progress)
    else:
        recordings = record_workload(config, progress=progress, continuations=continuations)
    path = recordings.save(args.out)
    summary = {"requests": len(recordings.prompts), "continuations": len(recordings),
               "sampling": ",".join(c.label for c in config.sampling_classes),
               "tokens": sum(len(r.token_ids) for r in recordings.requests),
               "seconds": recordings.meta["record_seconds"], "out": str(path)}
    print(json.dumps(summary) if args.json else " ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


def run_ray(args: argparse.Namespace, cfg, partial: Path):
    """``--ray``: the prompts shared out over Ray workers (``draftrl.replay.ray_collect``)."""
    from draftrl.cluster import check_request
    from draftrl.replay.ray_collect import collect_on_ray

    check_request(args.ray_workers, args.ray_gpus, cfg.env.device)

    def progress(index, done, total, pid):
        print(f"[collect] {done}/{total} prompt {index} (worker {pid})", file=sys.stderr, flush=True)

    return collect_on_ray(cfg.env, partial, address=args.ray, workers=args.ray_workers, gpus_per_worker=args.ray_gpus,
                          threads=cfg.threads, progress=progress,
                          num_continuations=args.continuations or cfg.continuations)


def run(args: argparse.Namespace) -> int:
    from draftrl.decoding.build import build_engine

    if args.engine == "vllm":
        return run_vllm(args)
    _options.refuse_vllm_engine(args, "draftrl collect")
    from draftrl.replay.traces import collect
    from draftrl.runs import PARTIAL_DIR
    from draftrl.signals.costs import CostTable

    if args.continuations is not None and args.continuations < 1:
        raise ValueError(f"--continuations {args.continuations} must be >= 1 (recordings per prompt and temperature).")
    cfg = config(args)
    _options.set_threads(cfg.threads)
    out = Path(args.out)
    table = CostTable.load(args.cost_table) if args.cost_table else None  # fail before decoding anything
    check_out(out, args.overwrite)
    partial = out / PARTIAL_DIR
    partial.mkdir(parents=True, exist_ok=True)  # --out must be writable before any model loads

    def progress(index, prompt, seconds, label, k):
        print(f"[collect] {index + 1} {prompt.id} {label} k={k} {seconds:.1f}s", file=sys.stderr, flush=True)

    try:
        if args.ray is not None:
            traces = run_ray(args, cfg, partial)
        else:
            engine, tokenizer = build_engine(cfg.env)
            traces = collect(cfg.env, engine, tokenizer, progress=progress, partial_dir=partial,
                             num_continuations=args.continuations or cfg.continuations)
    except KeyboardInterrupt:
        kept = len(list(partial.glob("[0-9]*.npz")))
        print(f"draftrl collect: interrupted; {kept} finished prompt(s) kept in {partial}; run the same command "
              "again to resume.", file=sys.stderr)
        return 130
    traces.save(out, cost_table=table)
    summary = {"prompts": len(traces), "recordings": traces.num_recordings,
               "classes": {c.label: k for c, k in zip(traces.classes, traces.num_continuations)},
               "positions": int(traces.cu_num_positions[-1]), "nodes": len(traces.node_tokens),
               "max_depth": traces.max_depth, "width": traces.width, "seconds": traces.meta["collect_seconds"],
               "out": str(out)}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"prompts={summary['prompts']} recordings={summary['recordings']} classes="
        f"{','.join(f'{label}x{k}' for label, k in summary['classes'].items())} "
        f"positions={summary['positions']} nodes={summary['nodes']} "
        f"max_depth={summary['max_depth']} width={summary['width']} seconds={summary['seconds']:.1f} out={out}"
    )
    return 0
