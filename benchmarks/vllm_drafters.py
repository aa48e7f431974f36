"""vLLM's own drafters against no speculation in vLLM: an EAGLE-3 head (``vllm-eagle3:K``) and vLLM's
prompt lookup (``vllm-ngram:K``) at each K, at concurrency 1, 4 and 16 on the mixed held-out workload
(four languages x four tasks), overall and per task and language; the head's draft cost per added
position as a fraction of a plain decode step and its acceptance length from vLLM's own counts;
Hugging Face anchors at batch 1, timed in the same run.

One ``draftrl.eval.serve.compare.run_eval`` per K (``none``, ``vllm-eagle3:K``, ``vllm-ngram:K``: policies
rotated per load, float32 greedy identity against ``none``), the Ks in a random order, each K's
engines released before the next K's load (an engine holds ~2 GB here: seventeen do not fit), so
each K's ratios are taken against the ``none`` measured beside it. Prints ratios first:

    speedup_vs_none=1.310x  cpu_vs_none=1.280x  vs_ngram=1.100x  en=1.2x ...  acceptance_length=2.1  tok_s=...
        policy=vllm-eagle3:4  k=4  concurrency=1  ...
    step_vs_none=1.210x  cost_per_position=0.053x  expected_speedup=1.736x  acceptance_length=2.1  ...
        policy=vllm-eagle3:4  k=4  concurrency=1
    draft_cost_per_position=0.052x  head_overhead=0.040x  plain_step_ms=81  ks=1,2,...,8  fit=least_squares
        concurrency=1

``step_vs_none``: the head's mean decode step at K (``decode_step_seconds``) over the one without
speculation, at concurrency 1; ``cost_per_position = (step_vs_none - 1) / K``; the least-squares fit
``step_vs_none = 1 + head_overhead + draft_cost_per_position * K`` over the Ks separates running the
head at all from each drafted (and verified) position; ``expected_speedup = acceptance_length /
step_vs_none`` is the concurrency-1 speedup that step time and acceptance alone predict (prefills
excluded). ``acceptance_length``: vLLM's own counts, ``1 + num_accepted / num_drafts`` (the bonus
token counted). ``en=``, ``code_edit=``, ...: each language's and task's tokens / request latency
over none's.

Without ``--head`` the head draftrl ships for the target drafts (the run's drafter ``eagle3:HEAD``, which
``vllm-eagle3:K`` loads); with ``--head random`` a head of the
target's shape with random weights and a ``--draft-vocab``-token draft vocabulary is built: its drafts are
almost never accepted (speedups below 1), but it costs what a trained head of that shape costs. With
``--out``: ``results.json``, ``vllm_drafters.png``
(speedup vs K, one panel per concurrency), each K's serving run in ``serving/k{K}/`` and a built
head in ``head/``.

    python benchmarks/vllm_drafters.py --head runs/distill/head --out runs/bench/vllm_drafters   # full
    python benchmarks/vllm_drafters.py --quick    # K 2,4, concurrency 1,4, code_edit prompts, 16 tokens
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import (
    Bench,
    add_serving_args,
    common_flags,
    group_ratios,
    hf_anchor_rows,
    hf_anchors,
    parse_args,
    rotations,
    serving_config,
    serving_prompts,
)

PLOT = "vllm_drafters.png"
#: the drafters compared at each K, and their line styles in the plot
METHODS = {"vllm-eagle3": "-o", "vllm-ngram": "--s"}


def plot(path: Path, speedups: dict[tuple[str, int, int], float], ks: list[int], levels: list[int],
         title: str) -> None:
    """Speedup over no speculation against K, one panel per concurrency (``speedups[(method, K, level)]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from draftrl.io import atomic_write_bytes

    fig, axes = plt.subplots(1, len(levels), figsize=(4 * len(levels), 3.4), squeeze=False, sharey=True)
    for ax, level in zip(axes[0], levels):
        for method, style in METHODS.items():
            points = [(k, speedups[(method, k, level)]) for k in ks if (method, k, level) in speedups]
            if points:
                ax.plot(*zip(*points), style, label=method)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=f"concurrency {level}", xlabel="K (draft tokens per step)", xticks=ks)
    axes[0][0].set_ylabel("speedup vs no speculation (vLLM)")
    axes[0][0].legend()
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[common_flags()])
    p.add_argument("--head", default=None, help="EAGLE-3 head folder (speculators format, e.g. from draftrl distill); "
                                                "default: the head draftrl ships for the target; 'random': build one "
                                                "with random weights (draft cost only)")
    p.add_argument("--draft-vocab", type=int, default=8192,
                   help="the built head's draft vocabulary (draftrl distill's default)")
    p.add_argument("--ks", default="1,2,3,4,5,6,7,8", help="K values of vllm-eagle3 (and vllm-ngram)")
    p.add_argument("--ngram", action=argparse.BooleanOptionalAction, default=True, help="vllm-ngram at each K")
    p.add_argument("--concurrency", default="1,4,16")
    add_serving_args(p)
    args = parse_args(p, quick=dict(ks="2,4", concurrency="1,4", max_new_tokens=16, tasks="code_edit", hf_lookup=4))
    import torch

    bench = Bench(args, __file__, owned=("serving", "head", PLOT),
                  device="cuda" if torch.cuda.is_available() else "cpu")

    from draftrl.decoding.vllm.engine import model_path, release_engines
    from draftrl.drafters.eagle3 import random_head
    from draftrl.eval.serve.compare import run_eval

    ks = sorted({int(k) for k in args.ks.split(",") if k})
    levels = [int(c) for c in args.concurrency.split(",") if c]
    root = bench.out or Path(tempfile.mkdtemp(prefix="vllm_drafters_"))
    config = serving_config(args)
    head, head_name = args.head, args.head
    if head is None:
        from draftrl.drafters.packaged import packaged_head

        head = head_name = str(packaged_head(config.target))
    if head == "random":
        head = str(random_head(model_path(config.target), args.draft_vocab).save_pretrained(
            root / "head", speculative_tokens=max(ks)))
        head_name = f"random({args.draft_vocab})"
        bench.note(f"head: random weights, draft vocabulary {args.draft_vocab} (acceptance ~0; a trained head's "
                   f"draft cost): {head}")
    config = dataclasses.replace(config, drafter=f"eagle3:{head}")  # the head vllm-eagle3:K loads
    serving_dir = root / "serving"
    t0 = time.perf_counter()
    groups: dict[int, dict] = {}
    for k in next(rotations(ks, 1)):  # the Ks in a random order: drift does not follow K
        policies = ["none", f"vllm-eagle3:{k}"] + ([f"vllm-ngram:{k}"] if args.ngram else [])
        groups[k] = run_eval(serving_dir / f"k{k}", policies=policies, concurrency=levels, config=config,
                                     repeats=args.repeats,
                                     progress=lambda d, t, m, k=k: bench.note(f"K={k} [{d}/{t}] {m}"))
        release_engines()  # this K's engines; none's is rebuilt for the next K (one shutdown ends them all)
    anchors = hf_anchors(serving_prompts(config), args.hf_lookup) if args.hf_lookup else {}

    where = dict(dtype=args.dtype, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
    speedups: dict[tuple[str, int, int], float] = {}
    for level in levels:
        for k in ks:
            table = groups[k]["concurrency"][str(level)]["policies"]
            ngram = table.get(f"vllm-ngram:{k}")
            for method in METHODS:
                s = table.get(f"{method}:{k}")
                if s is None:
                    continue
                speedups[(method, k, level)] = s["speedup_vs_none"]
                ratios = {"speedup_vs_none": s["speedup_vs_none"], "cpu_vs_none": s["cpu_speedup_vs_none"]}
                if method != "vllm-ngram":
                    ratios["vs_ngram"] = s["tokens_per_second"] / ngram["tokens_per_second"] if ngram else None
                bench.row({**ratios, **group_ratios(s, table["none"])},
                          {"acceptance_length": s["spec_decoding"]["acceptance_length"],
                           "tok_s": s["tokens_per_second"], "tokens_per_step": s["mean_tokens_per_step"],
                           "itl_p95_ms": (s["itl_p95"] or 0) * 1e3},
                          policy=f"{method}:{k}", k=k, concurrency=level, **where)

    draft_cost: dict = {}
    if 1 in levels:
        bench.note("draft cost of the head at concurrency 1 (decode steps, prefills excluded)")
        steps, plain = {}, []
        for k in ks:
            table = groups[k]["concurrency"]["1"]["policies"]
            e, n = table[f"vllm-eagle3:{k}"], table["none"]
            steps[k] = e["decode_step_seconds"] / n["decode_step_seconds"]
            plain.append(n["decode_step_seconds"])
            accept = e["spec_decoding"]["acceptance_length"]
            bench.row({"step_vs_none": steps[k], "cost_per_position": (steps[k] - 1) / k,
                       "expected_speedup": accept / steps[k] if accept else None},
                      {"acceptance_length": accept, "step_ms": e["decode_step_seconds"] * 1e3,
                       "plain_step_ms": n["decode_step_seconds"] * 1e3},
                      policy=f"vllm-eagle3:{k}", k=k, concurrency=1, **where)
        draft_cost = {"step_vs_none": {str(k): v for k, v in steps.items()},
                      "plain_step_seconds": statistics.median(plain)}
        if len(ks) >= 2:
            slope, intercept = np.polyfit(ks, [steps[k] - 1 for k in ks], 1)
            draft_cost.update(draft_cost_per_position=float(slope), head_overhead=float(intercept))
            bench.row({"draft_cost_per_position": float(slope), "head_overhead": float(intercept)},
                      {"plain_step_ms": draft_cost["plain_step_seconds"] * 1e3},
                      ks=",".join(map(str, ks)), fit="least_squares", concurrency=1, **where)

    none_c1 = None
    if 1 in levels:  # none ran beside every K: the median of its runs
        runs = [groups[k]["concurrency"]["1"]["policies"]["none"] for k in ks]
        none_c1 = {key: statistics.median(r[key] for r in runs) if all(r[key] for r in runs) else None
                   for key in ("tokens_per_second", "tokens_per_cpu_second")}
    hf_anchor_rows(bench, anchors, none_c1, **where)
    passed = all(g["exactness"]["passed"] for g in groups.values())
    bench.row({}, {"exactness": "PASSED" if passed else "FAILED",
                   "requests": groups[ks[0]]["concurrency"][str(levels[0])]["policies"]["none"]["num_requests"],
                   "wall_s": time.perf_counter() - t0}, head=head_name, **where)
    if bench.out is not None:
        plot(bench.path(PLOT), speedups, ks, levels,
             f"{bench.machine['cpu']}: vLLM {bench.machine['vllm']}, head {head_name}, {args.dtype}, "
             f"{args.max_new_tokens} tokens")
    bench.save(groups={str(k): g for k, g in groups.items()}, hf_anchors=anchors, head=head, head_name=head_name,
               draft_cost=draft_cost)


if __name__ == "__main__":
    main()
