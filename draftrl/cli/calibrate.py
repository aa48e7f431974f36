"""``draftrl calibrate``: measure what a round costs on this machine and write a cost table.

Prints g(V) = cost(V) / cost(1) per context length; the measurement is
:func:`draftrl.replay.calibrate.calibrate` (what is timed and how: its module docstring).

    draftrl calibrate --json --out costs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftrl.cli import _options
from draftrl.replay.serve_calibrate import CalibrationSizes

#: The vLLM cells measured by default (importing the module does not import vLLM).
SIZES = CalibrationSizes()


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers, e.g. 1,2,4,8") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must hold positive integers")
    return tuple(sorted(set(values)))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure verify / draft / sample costs and write a cost table")
    _options.add_config(p, "calibrate.repeats=5")
    _options.add_models(p)
    _options.add_threads(p)
    _options.add_seed(p, "the measurement order")
    keyed = _options.keyed
    keyed(p, "--num-tokens", key="calibrate.num_tokens", type=_ints,
          help="tokens per target forward to measure (1 = plain step is always added)")
    keyed(p, "--contexts", key="calibrate.contexts", type=_ints, help="context lengths (tokens in the cache)")
    keyed(p, "--widths", key="calibrate.widths", type=_ints, help="draft tree widths")
    keyed(p, "--levels", key="calibrate.levels", type=int, help="draft levels timed per width")
    keyed(p, "--repeats", key="calibrate.repeats", type=int, help="interleaved repeats per cell (median kept)")
    keyed(p, "--temperature", key="env.temperature", type=float, help="sampling transform timed by the sample cost")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                   help="vllm: step seconds of an in-process vLLM engine vs sequences and tokens verified "
                        "(draftrl.replay.serve_calibrate; --target, --dtype, --threads apply; --drafter eagle3[:PATH] "
                        "also times what the head's drafting adds to a step)")
    p.add_argument("--batch-sizes", type=_ints, default=SIZES.batch_sizes, help="vllm: running sequences")
    p.add_argument("--depths", type=_ints, default=SIZES.depths, help="vllm: draft tokens per sequence")
    p.add_argument("--steps", type=int, default=SIZES.steps,
                   help="vllm: timed steps per (batch size, depth) and prefill cell")
    p.add_argument("--prefill-lens", type=_ints, default=SIZES.prefill_lens, help="vllm: prompt tokens per prefill")
    p.add_argument("--prefill-batch-sizes", type=_ints, default=SIZES.prefill_batch_sizes,
                   help="vllm: prompts prefilled together")
    p.add_argument("--rounds", type=int, default=SIZES.rounds,
                   help="vllm: shuffled passes over the cells (spreads load drift)")
    _options.add_vllm_engine(p)
    _options.add_ray(p, "vllm: share the cells out over Ray workers, each with its own engine")
    _options.add_out(p, "write the cost table JSON here", required=False)
    _options.add_json(p)
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    """The command's :class:`~draftrl.config.commands.CalibrateConfig` (a demo config's calibrate step:
    ``_options.load_step``), its drafter's head checked before any model loads."""
    from draftrl.config.commands import CalibrateConfig

    cfg = _options.load_step(CalibrateConfig, args)
    cfg.env = _options.settle_drafter(cfg.env, args)
    return cfg


def g_lines(table) -> list[str]:
    """One printed line per context length: g(V) = cost(V) / cost(1)."""
    from draftrl.signals.costs import hardware_name

    hw = f"{hardware_name(table.meta.get('hardware', {}))}  threads={table.meta.get('threads')}"
    lines = []
    for c, row in zip(table.context_lens, table.verify_seconds):
        cells = "  ".join(f"g({int(n)})={s / row[0]:.2f}" for n, s in zip(table.num_tokens, row))
        lines.append(f"{cells}  context={int(c)}  step_ms={row[0] * 1e3:.1f}  hardware={hw}")
    widths = "  ".join(
        f"c(W={int(w)})={s / table.verify_seconds[0][0]:.3f}"
        for w, s in zip(table.draft_widths, table.draft_level_seconds)
    )
    lines.append(f"{widths}  draft_base={table.draft_base_seconds / table.verify_seconds[0][0]:.3f}  "
                 f"(draft seconds per level / plain step)  noise={table.noise:.3f}  hardware={hw}")
    return lines


def run_vllm(args: argparse.Namespace) -> int:
    from draftrl.decoding.vllm.head_proposer import needs_head
    from draftrl.io import write_json
    from draftrl.replay.serve_calibrate import calibrate_model

    engine = {"gpu_memory_utilization": args.gpu_memory_utilization, "enforce_eager": args.enforce_eager,
              "tensor_parallel_size": args.tensor_parallel_size or 1}
    # read here: they are no keys of CalibrateConfig's env section (an EnvConfig), which refused them
    args.gpu_memory_utilization = args.enforce_eager = args.tensor_parallel_size = None
    cfg = config(args)
    sizes = CalibrationSizes(batch_sizes=args.batch_sizes, depths=args.depths, steps=args.steps,
                             prefill_lens=args.prefill_lens, prefill_batch_sizes=args.prefill_batch_sizes,
                             rounds=args.rounds)
    engine.update(dtype=cfg.env.dtype, threads=cfg.threads, drafter=cfg.env.drafter if needs_head(cfg.env.drafter)
                  else None)

    def progress(msg: str) -> None:
        print(f"[calibrate] {msg}", file=sys.stderr)

    if args.ray is not None:
        from draftrl.cluster import check_request
        from draftrl.replay.ray_calibrate import calibrate_on_ray

        check_request(args.ray_workers, args.ray_gpus, "cpu")
        result = calibrate_on_ray(cfg.env.target, sizes, address=args.ray, workers=args.ray_workers,
                                  gpus_per_worker=args.ray_gpus, seed=cfg.seed, progress=progress, **engine)
    else:
        result = calibrate_model(cfg.env.target, sizes, seed=cfg.seed, progress=progress, **engine)
    if args.out:
        write_json(args.out, result)
    f = result["fit"]
    print(f"step_seconds = {f['base'] * 1e3:.2f} ms + {f['per_seq'] * 1e3:.2f} ms x seqs + "
          f"{f['per_token'] * 1e3:.3f} ms x tokens_verified + {f['per_prefill_token'] * 1e3:.3f} ms x prompt_tokens  "
          f"(residual sd {f['residual_std'] * 1e3:.2f} ms)")
    if f.get("problem"):
        print(f"warning: {f['problem']}", file=sys.stderr)
    for b, row in result.get("head", {}).items():
        cells = "  ".join(f"d={d}: {s * 1e3:.1f}" for d, s in zip(row["levels"], row["seconds"]))
        print(f"head drafting adds, B={b}: {cells} ms")
    if args.json:
        print(json.dumps(result))
    return 0


def run(args: argparse.Namespace) -> int:
    from draftrl.replay.calibrate import calibrate

    if args.out and Path(args.out).exists() and not args.overwrite:  # before minutes of timing, not after
        raise ValueError(f"--out {args.out} exists (an earlier calibration); pass --overwrite to replace it or "
                         "choose another --out.")
    if args.engine == "vllm":
        return run_vllm(args)
    if args.ray is not None:
        raise ValueError("--ray shares out the cells of --engine vllm calibrations; the --engine hf cost table times "
                         "every cell against its neighbours on one device (minutes): drop --ray.")
    _options.refuse_vllm_engine(args, "draftrl calibrate")
    cfg = config(args)
    _options.set_threads(cfg.threads)
    table = calibrate(cfg.calibrate, cfg.env, cfg.seed,
                      progress=lambda msg: print(f"[calibrate] {msg}", file=sys.stderr))
    if args.out:
        table.save(args.out)
    out = sys.stderr if args.json else sys.stdout
    for line in g_lines(table):
        print(line, file=out)
    if args.json:
        data = table.to_dict()
        data["g"] = {str(int(c)): (row / row[0]).round(4).tolist()
                     for c, row in zip(table.context_lens, table.verify_seconds)}
        print(json.dumps(data))
    return 0
