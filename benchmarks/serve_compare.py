"""Drafting inside vLLM under concurrent load: no speculation, vLLM's ngram at each K (``vllm-ngram:K``), the minimal
prompt-lookup proposer of issue 10 (:mod:`draftrl.decoding.vllm.ref_lookup`, ``vllm-class:...:K``) at each K, draftrl's
drafter at each fixed
depth, the +2/-1 heuristic, a Dynamic SD table and (given) a PPO policy, at concurrency 1, 4 and 16
on the mixed held-out workload; Hugging Face anchors at batch 1.

Everything runs through ``draftrl.eval.serve.compare.run_eval`` (one engine per speculative
config, policies rotated per load, float32 greedy identity against no speculation), then HF
``generate`` plain and prompt lookup on the same requests, one at a time. Prints ratios first:

    speedup_vs_none=1.230x  vs_best_ngram=1.100x  cpu_vs_none=1.210x  cpu_vs_best_ngram=1.080x  tok_s=...
        policy=fixed:4  ...

(``cpu_*``: the same ratios in the engine thread's CPU time, which other processes cannot skew.)
With ``--out``, the serving runner's own files go to ``OUT/serving/``.

    python benchmarks/serve_compare.py --out runs/bench/serve_compare        # full
    python benchmarks/serve_compare.py --quick      # concurrency 1,4, K 4, depth 4, code_edit prompts, 16 tokens
"""

from __future__ import annotations

import argparse
import tempfile
import time

from _bench import (
    Bench,
    add_serving_args,
    common_flags,
    hf_anchor_rows,
    hf_anchors,
    parse_args,
    serving_config,
    serving_prompts,
)

REF_LOOKUP = "draftrl.decoding.vllm.ref_lookup.RefLookupLatest"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[common_flags()])
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--ks", default="2,4,8", help="vLLM ngram K values")
    p.add_argument("--ref-ks", default="4", help=f"K values of the reference proposer ({REF_LOOKUP})")
    p.add_argument("--depths", default="2,4,8", help="draftrl fixed depths")
    p.add_argument("--heuristic", action=argparse.BooleanOptionalAction, default=True, help="the +2/-1 heuristic")
    p.add_argument("--dsd", default="dsd", help="Dynamic SD policy spec (dsd or dsd:S-E:K,...); '' = skip")
    p.add_argument("--ppo", default=None, help="ppo:PATH policy trained on draftrl/ServeVLLM-v1")
    add_serving_args(p)
    args = parse_args(p, quick=dict(concurrency="1,4", ks="4", ref_ks="4", depths="4", dsd="", max_new_tokens=16,
                                    tasks="code_edit", hf_lookup=4))
    import torch

    bench = Bench(args, __file__, owned=("serving",), device="cuda" if torch.cuda.is_available() else "cpu")

    from draftrl.eval.serve.compare import run_eval

    policies = ["none"] + [f"vllm-ngram:{k}" for k in args.ks.split(",") if k] + \
        [f"vllm-class:{REF_LOOKUP}:{k}" for k in args.ref_ks.split(",") if k] + \
        [f"fixed:{d}" for d in args.depths.split(",") if d] + (["heuristic"] if args.heuristic else [])
    if args.dsd:
        policies.append(args.dsd)
    if args.ppo:
        policies.append(args.ppo if args.ppo.startswith("ppo:") else f"ppo:{args.ppo}")
    config = serving_config(args)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    t0 = time.perf_counter()
    serving_dir = bench.path("serving") or tempfile.mkdtemp(prefix="serve_compare_")
    results = run_eval(serving_dir, policies=policies, concurrency=levels, config=config, repeats=args.repeats,
                               progress=lambda d, t, m: bench.note(f"[{d}/{t}] {m}"))
    anchors = hf_anchors(serving_prompts(config), args.hf_lookup) if args.hf_lookup else {}
    where = dict(dtype=args.dtype, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
    for level in levels:
        table = results["concurrency"][str(level)]["policies"]
        ngram = max((v["tokens_per_second"] for k, v in table.items() if k.startswith("vllm-ngram")), default=None)
        ngram_cpu = max((v["tokens_per_cpu_second"] or 0 for k, v in table.items() if k.startswith("vllm-ngram")),
                        default=None)
        for name, s in sorted(table.items(), key=lambda kv: -kv[1]["tokens_per_second"]):
            bench.row({"speedup_vs_none": s["speedup_vs_none"],
                       "vs_best_ngram": s["tokens_per_second"] / ngram if ngram else None,
                       "cpu_vs_none": s.get("cpu_speedup_vs_none") or None,
                       "cpu_vs_best_ngram": (s["tokens_per_cpu_second"] / ngram_cpu
                                             if ngram_cpu and s.get("tokens_per_cpu_second") else None)},
                      {"tok_s": s["tokens_per_second"], "tokens_per_step": s["mean_tokens_per_step"],
                       "itl_p95_ms": (s["itl_p95"] or 0) * 1e3},
                      policy=name, concurrency=level, **where)
    hf_anchor_rows(bench, anchors, results["concurrency"].get("1", {}).get("policies", {}).get("none"), **where)
    bench.row({}, {"exactness": "PASSED" if results["exactness"]["passed"] else "FAILED",
                   "requests": results["concurrency"][str(levels[0])]["policies"]["none"]["num_requests"],
                   "wall_s": time.perf_counter() - t0}, **where)
    bench.save(serving=results, hf_anchors=anchors)


if __name__ == "__main__":
    main()
