"""Speedup over plain decoding of n-gram and layer-skip drafting at depths 1, 2, 4, 8, per language and for code.

Groups: one natural-language task (``--task``, chat by default) in each of ``--languages``, plus
``code`` = the English code_edit prompts (Python snippets to modify). Greedy, width 1 (chains),
draftrl's engine for every method (plain decoding = depth 0 on the same engine), all methods
interleaved per prompt (see ``_bench.py``). One line per (group, drafter, depth), ratios first.

Plain decoding is depth 0 on the same engine, so it gets the same CPU fast paths as verification
(``draftrl.models.fast_linear``, one-row forwards included): the speedups are over the fastest
plain decoding draftrl has, not over a handicapped one.

Why ``layerskip:28`` by default: a layer-skip draft is the target's first N of 30 layers plus the
final norm and the (tied, 28M-parameter) LM head, so one draft step costs about
(28.3M + 3.5M * N) / 134M of a target step: 0.95 at N=28, 0.74 at N=20, 0.42 at N=8. SmolLM2-135M
was not trained for early exit; teacher-forced on its own greedy output (8 tune prompts, 4
languages, chat + code, 32 tokens each) the truncated model's argmax agreed with the full model's
50% of the time at N=28, 31% at 26, 24% at 24, 13% at 22 and <= 4% at N <= 20. N=28 is the only
depth where drafts are right often enough for the depth sweep to say anything; the cost model
(S = E / (1 + c * depth), c ~ 0.95) still predicts < 1x at every depth, so expect layer-skip to
lose to plain decoding and report it as measured. Pass ``--drafters ngram,layerskip:20`` etc.

    python benchmarks/depth_by_language.py
    python benchmarks/depth_by_language.py --quick --out runs/bench/depth_by_language
"""

from __future__ import annotations

import argparse

from _bench import Bench, add_grid_args, common_flags, engine_method, first_mismatch, interleave, load_grid, parse_args

from draftrl.drafters.registry import build_drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    add_grid_args(parser, max_new_tokens=48)
    args = parse_args(parser, quick=dict(max_new_tokens=24))
    bench = Bench(args, __file__, device=args.device)

    loaded, eos, reqs, groups = load_grid(args)
    depths = [int(d) for d in args.depths.split(",")]
    drafters = args.drafters.split(",")

    methods = {"ar": engine_method(loaded.model, None, eos, 0)}
    for spec in drafters:
        for d in depths:  # one drafter object per method: model drafters keep their own KV cache
            drafter = build_drafter(spec, loaded, device=args.device)
            methods[f"{spec}@{d}"] = engine_method(loaded.model, drafter, eos, d)
    bench.note(f"{len(reqs)} prompts x {len(methods)} methods x {args.repeats} repeats, interleaved")
    t = interleave(methods, reqs, args.repeats, args.device)

    where = dict(task=args.task, max_new_tokens=args.max_new_tokens, repeats=args.repeats, model=loaded.name)
    best = {}
    for group, items in groups.items():
        ar = t.throughput("ar", items)
        for spec in drafters:
            for d in depths:
                name = f"{spec}@{d}"
                speedup = t.throughput(name, items) / ar
                bad = sum(first_mismatch(t.tokens("ar", i), t.tokens(name, i)) is not None for i in items)
                bench.row({"speedup_vs_autoregressive": speedup},
                          {"mean_tokens_per_round": t.tokens_per_round(name, items),
                           "tok_s": t.throughput(name, items), "ar_tok_s": ar,
                           "greedy_mismatches": f"{bad}/{len(items)}"},
                          group=group, drafter=spec, depth=d, prompts=len(items), **where)
                if speedup > best.get((group, spec), (0.0,))[0]:
                    best[(group, spec)] = (speedup, t.tokens_per_round(name, items), d)
    bench.note("best depth per group and drafter")
    for (group, spec), (speedup, tpr, d) in best.items():
        bench.row({"speedup_vs_autoregressive": speedup}, {"mean_tokens_per_round": tpr},
                  depth=d, group=group, drafter=spec, **where)
    bench.save()


if __name__ == "__main__":
    main()
