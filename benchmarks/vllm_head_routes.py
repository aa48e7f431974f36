"""Two ways to serve a trained EAGLE-3 head in vLLM, against every fixed (drafter, K) and vLLM's own
methods, at concurrency 1 and 4 on the mixed held-out workload (four languages x four tasks).

- route (a): stock vLLM ``vllm-eagle3:K`` (one K for every request) and ``vllm-eagle3:S-E:K,...``
  (vLLM's Dynamic SD table, K per running-batch-size range: the only knob stock vLLM has under load);
- route (b): draftrl's proposer running the same head itself
  (``draftrl.decoding.vllm.head_proposer``): ``fixed:K@eagle3`` (its drafts equal stock
  ``vllm-eagle3:K``'s, so the two differ in cost only), ``fixed:K@sam:N`` (per request: n-gram
  lookup on an N-token match, else the head) and the per-level stops ``stop:K:tT`` (Hugging Face's
  assistant confidence threshold T) and ``stop:K:cT`` (EAGLE-2's chain probability T), which let
  each request stop drafting where its head loses confidence;
- the rest of the grid: vLLM's ``vllm-ngram:K``, draftrl's n-gram proposer ``fixed:K`` and its
  ``heuristic``; Hugging Face ``generate`` (plain and prompt lookup) at batch 1 as anchors.

One ``draftrl.eval.serve.compare.run_eval`` (policies rotated per load and repeat, float32 greedy
identity against ``none``): each policy names its drafter (``@eagle3``, ``@sam:2``; none: the
proposer's n-gram lookup), and ``--head DIR`` puts DIR into every one of them and into
``vllm-eagle3``. Prints ratios first: each policy over ``none``, over the best stock vLLM method
(``vllm-ngram:K``, ``vllm-eagle3:K``) and over the best fixed (drafter, K) of the run (stock and
``fixed:K`` with any drafter; a stop or a table is no fixed K), at concurrency 1 over
the HF anchors, per task and language;
then route (b) over route (a) at each K both ran::

    speedup_vs_none=1.90x  vs_best_stock=1.12x  vs_best_fixed=1.08x  en=... code_edit=...  tok_s=...
        policy=stop:4:t0.6@sam:2  concurrency=1  ...
    route_b_vs_a=1.05x  step_b_vs_a=0.95x  ...  k=3  concurrency=1

    python benchmarks/vllm_head_routes.py --out runs/bench/vllm_head_routes
    python benchmarks/vllm_head_routes.py --quick
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _bench import (
    Bench,
    add_serving_args,
    common_flags,
    group_ratios,
    hf_anchor_rows,
    hf_anchors,
    parse_args,
    serving_config,
    serving_prompts,
)

#: what counts as a fixed (drafter, K): one K for every request, no stop, no table
FIXED_KINDS = ("vllm-ngram", "vllm-eagle3", "fixed")


def with_head(name: str, head: str | None) -> str:
    """``name`` drafting with the head ``head`` (None: as written, the shipped head): ``@eagle3`` ->
    ``@eagle3:HEAD``, ``@sam:N`` -> ``@sam:N:HEAD``, ``vllm-eagle3:...`` -> ``vllm-eagle3:...@eagle3:HEAD``."""
    if head is None:
        return name
    policy, at, drafter = name.partition("@")
    if not at:
        return f"{name}@eagle3:{head}" if policy.startswith("vllm-eagle3:") else name
    kind, *args = drafter.split(":")
    named = (kind == "eagle3" and not args) or (kind == "sam" and len(args) == 1)
    return f"{policy}@{drafter}:{head}" if named else name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[common_flags()])
    p.add_argument("--head", default=None, help="EAGLE-3 head folder; default: the head draftrl ships for the target")
    p.add_argument("--stock", default="vllm-ngram:4,vllm-ngram:6,vllm-eagle3:1,vllm-eagle3:2,vllm-eagle3:3,"
                                       "vllm-eagle3:1-1:2,2-16:1",
                   help="vLLM's own methods (each its own engine; vllm-eagle3:S-E:K,... with a Dynamic SD table)")
    p.add_argument("--draftrl", default="fixed:4,fixed:6,heuristic,fixed:2@eagle3,fixed:3@eagle3,fixed:4@sam:2,"
                                         "fixed:6@sam:2,stop:6:t0.4@sam:2,stop:6:t0.6@sam:2,stop:6:c0.3@sam:2,"
                                         "stop:4:t0.6@eagle3",
                   help="policies on draftrl's proposer (n-gram lookup without @; the head: @eagle3, @sam:N)")
    p.add_argument("--concurrency", default="1,4")
    add_serving_args(p)
    args = parse_args(p, quick=dict(stock="vllm-ngram:4,vllm-eagle3:2",
                                    draftrl="fixed:4,fixed:2@eagle3,stop:4:t0.6@sam:2",
                                    concurrency="1", max_new_tokens=16, tasks="code_edit,chat", hf_lookup=4))
    import torch

    bench = Bench(args, __file__, owned=("serving",), device="cuda" if torch.cuda.is_available() else "cpu")
    from draftrl.drafters.packaged import resolve_head
    from draftrl.eval.policy_names import parse_policies, split_policies
    from draftrl.eval.serve.compare import run_eval

    levels = [int(c) for c in args.concurrency.split(",") if c]
    config = serving_config(args)
    head = resolve_head(args.head, config.target)
    names = ["none"] + [with_head(name, args.head) for name in split_policies(args.stock + "," + args.draftrl)]
    specs = {s.label: s for s in parse_policies(names, engine="vllm")}
    root = bench.out or Path(tempfile.mkdtemp(prefix="vllm_head_routes_"))
    t0 = time.perf_counter()
    results = run_eval(root / "serving", policies=names, concurrency=levels, config=config,
                               repeats=args.repeats, progress=lambda d, t, m: bench.note(f"[{d}/{t}] {m}"))
    anchors = hf_anchors(serving_prompts(config), args.hf_lookup) if args.hf_lookup else {}

    where = dict(dtype=args.dtype, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
    for level in levels:
        table = results["concurrency"][str(level)]["policies"]
        rate = {name: row["tokens_per_second"] for name, row in table.items()}
        stock = max((n for n in rate if specs[n].kind in ("vllm-ngram", "vllm-eagle3") and not specs[n].dsd),
                    key=rate.get, default=None)
        fixed = max((n for n in rate if specs[n].kind in FIXED_KINDS and not specs[n].dsd), key=rate.get, default=None)
        bench.note(f"concurrency {level}: best stock {stock}, best fixed (drafter, K) {fixed}")
        for name, row in sorted(table.items(), key=lambda item: -item[1]["tokens_per_second"]):
            if name == "none":
                continue
            bench.row({"speedup_vs_none": row["speedup_vs_none"],
                       "vs_best_stock": rate[name] / rate[stock] if stock else None,
                       "vs_best_fixed": rate[name] / rate[fixed] if fixed else None,
                       **({f"vs_{a}": rate[name] / r["tokens_per_second"] for a, r in anchors.items()}
                          if level == 1 else {}),
                       **group_ratios(row, table["none"])},
                      {"acceptance_length": row["spec_decoding"]["acceptance_length"],
                       "tok_s": row["tokens_per_second"], "tokens_per_step": row["mean_tokens_per_step"],
                       "step_ms": (row["decode_step_seconds"] or 0) * 1e3},
                      policy=name, concurrency=level, **where)
        for name in table:
            spec = specs[name]
            twin = with_head(f"vllm-eagle3:{spec.depth}", args.head)
            route_b = spec.kind == "fixed" and (spec.drafter or "").partition(":")[0] == "eagle3"
            if route_b and spec.verify_size is None and spec.head_max_batch is None and twin in table:
                a, b = table[twin], table[name]
                bench.row({"route_b_vs_a": b["tokens_per_second"] / a["tokens_per_second"],
                           "step_b_vs_a": b["decode_step_seconds"] / a["decode_step_seconds"]},
                          {"acceptance_length_a": a["spec_decoding"]["acceptance_length"],
                           "acceptance_length_b": b["spec_decoding"]["acceptance_length"]},
                          k=spec.depth, concurrency=level, **where)
    none_c1 = results["concurrency"]["1"]["policies"]["none"] if 1 in levels else None
    hf_anchor_rows(bench, anchors, none_c1, **where)
    bench.row({}, {"exactness": "PASSED" if results["exactness"]["passed"] else "FAILED",
                   "requests": results["concurrency"][str(levels[0])]["policies"]["none"]["num_requests"],
                   "wall_s": time.perf_counter() - t0}, head=head, **where)
    bench.save(serving=results, hf_anchors=anchors, head=head)


if __name__ == "__main__":
    main()
