"""draftrl's engine vs Hugging Face generate: plain greedy, prompt lookup, and draftrl's n-gram drafter.

Same prompts (code_edit and chat, several languages), same target object, fp32, greedy, all
methods interleaved in one run (see ``_bench.py``). For each gamma:

- ``hf_ar``:      ``model.generate(do_sample=False)``
- ``hf_lookup``:  ``generate(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=N)``
- ``draftrl``:    ``SpeculativeDecoder`` + ``NgramDrafter(1, N)``, depth=gamma, width=1

``--layouts on,off`` runs every method with draftrl's ``fast_linear`` on and off, switched on the
SAME model object before each call, so HF and draftrl always share the kernel layout. Tokens are
checked against ``hf_ar`` of the same layout (greedy must match; float ties may not).
``tok_per_forward`` counts every target forward, prefill included: HF verifies the first
candidates inside its prefill forward, draftrl prefills the prompt and then runs round 1.
``outside_forward`` is the share of wall time a method spends outside the target's forward
(hooks time every forward): Python per round, drafting, sampling, KV bookkeeping.

On a heavily shared CPU pass ``--threads 1``: with 2 threads and a load of ~15 on 2 cores, one
SmolLM2 forward measured 2.6 s (threads=2) vs 0.34 s (threads=1), because the two threads wait
on each other whenever the scheduler parks one of them.

    python benchmarks/hf_compare.py --threads 1      # 1 prompt x 4 languages x 2 tasks
    python benchmarks/hf_compare.py --quick
    python benchmarks/hf_compare.py --profile 4     # cProfile one draftrl request at gamma=4
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from _bench import ForwardTimer, context, engine_method, eos_token_ids, first_mismatch, interleave, requests
from draftrl.decoding.drafters import NgramDrafter
from draftrl.models import apply_fast_linear, load_model, remove_fast_linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--languages", default="en,it,zh,es")
    parser.add_argument("--tasks", default="code_edit,chat")
    parser.add_argument("--num-prompts", type=int, default=1, help="per (language, task)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gammas", default="1,2,4,8")
    parser.add_argument("--ngram", type=int, default=3, help="longest n-gram matched, ours and HF's")
    parser.add_argument("--layouts", default="on,off", help="fast_linear settings to run: on, off or on,off")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--quick", action="store_true", help="en+zh, 32 tokens, 2 repeats (explicit flags still win)")
    parser.add_argument("--profile", type=int, default=0, help="cProfile one draftrl request at this gamma and exit")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(languages="en,zh", max_new_tokens=32, repeats=2)
        args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model(args.model, device=args.device, kernels="stock")
    model, tok = loaded.model, loaded.tokenizer
    eos = eos_token_ids(loaded)
    gammas = [int(g) for g in args.gammas.split(",")]
    layouts = args.layouts.split(",")
    reqs = requests(tok, args.languages.split(","), args.tasks.split(","), args.num_prompts, args.max_new_tokens)

    def set_layout(layout: str) -> None:
        (apply_fast_linear if layout == "on" else remove_fast_linear)(model)

    timer = ForwardTimer(model, args.device)  # counts HF's forwards; times every method's forwards

    def hf(layout: str, **kwargs):
        def run(req):
            set_layout(layout)
            timer.reset()
            with torch.inference_mode():
                out = model.generate(
                    torch.tensor([req.ids], device=args.device),
                    attention_mask=torch.ones(1, len(req.ids), dtype=torch.long, device=args.device),
                    max_new_tokens=req.max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
                    **kwargs,
                )
            return out[0, len(req.ids):].tolist(), timer.count  # HF folds prefill into round 1

        return run

    def ours(layout: str, gamma: int):
        run_engine = engine_method(model, NgramDrafter(1, args.ngram), eos, gamma, None, 1)

        def run(req):
            set_layout(layout)
            tokens, rounds = run_engine(req)
            return tokens, rounds + 1  # + the prefill forward

        return run

    if args.profile:
        set_layout(layouts[0])
        run = ours(layouts[0], args.profile)
        run(reqs[0])
        prof = cProfile.Profile()
        prof.runcall(run, reqs[0])
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return

    methods = {}
    for layout in layouts:
        methods[f"hf_ar/{layout}"] = hf(layout)
        for g in gammas:
            methods[f"hf_lookup{g}/{layout}"] = hf(layout, prompt_lookup_num_tokens=g, max_matching_ngram_size=args.ngram)
            methods[f"draftrl{g}/{layout}"] = ours(layout, g)
    print(f"# {len(reqs)} prompts x {len(methods)} methods x {args.repeats} repeats, interleaved", flush=True)
    t = interleave(methods, reqs, args.repeats, args.device, timer=timer)
    items = list(range(len(reqs)))

    where = f"ngram<={args.ngram}  prompts={len(reqs)}  max_new_tokens={args.max_new_tokens}  " + context(
        args.device, loaded.name)
    for layout in layouts:
        ar = f"hf_ar/{layout}"
        for g in gammas:
            hl, dr = f"hf_lookup{g}/{layout}", f"draftrl{g}/{layout}"
            bad = {name: [(reqs[i].id, first_mismatch(t.tokens(ar, i), t.tokens(name, i))) for i in items
                          if first_mismatch(t.tokens(ar, i), t.tokens(name, i)) is not None] for name in (hl, dr)}
            print(
                f"gamma={g}  draftrl_vs_hf_lookup={t.throughput(dr, items) / t.throughput(hl, items):.2f}x  "
                f"draftrl_vs_hf_ar={t.throughput(dr, items) / t.throughput(ar, items):.2f}x  "
                f"hf_lookup_vs_hf_ar={t.throughput(hl, items) / t.throughput(ar, items):.2f}x  "
                f"tok_per_forward draftrl={t.tokens_per_round(dr, items):.2f} hf_lookup={t.tokens_per_round(hl, items):.2f}  "
                f"tok_s hf_ar={t.throughput(ar, items):.1f} hf_lookup={t.throughput(hl, items):.1f} "
                f"draftrl={t.throughput(dr, items):.1f}  mismatches hf_lookup={len(bad[hl])}/{len(reqs)} "
                f"draftrl={len(bad[dr])}/{len(reqs)}  outside_forward hf_ar={t.overhead_share(ar, items):.1%} "
                f"hf_lookup={t.overhead_share(hl, items):.1%} draftrl={t.overhead_share(dr, items):.1%}  "
                f"fast_linear={layout}  {where}"
            )
            for name, lst in bad.items():
                for rid, pos in lst:
                    print(f"#   mismatch {name} vs {ar}: prompt={rid} first_diff_token={pos}")
    if set(layouts) == {"on", "off"}:
        for g in gammas:
            on, off = f"draftrl{g}/on", f"draftrl{g}/off"
            same = sum(t.tokens(on, i) == t.tokens(off, i) for i in items)
            print(f"gamma={g}  draftrl_fast_linear_on_vs_off={t.throughput(on, items) / t.throughput(off, items):.2f}x  "
                  f"hf_lookup_on_vs_off={t.throughput(f'hf_lookup{g}/on', items) / t.throughput(f'hf_lookup{g}/off', items):.2f}x  "
                  f"identical_outputs={same}/{len(reqs)}  {where}")
        print(f"hf_ar_on_vs_off={t.throughput('hf_ar/on', items) / t.throughput('hf_ar/off', items):.2f}x  {where}")
    best = max(gammas, key=lambda g: t.throughput(f"draftrl{g}/{layouts[0]}", items))
    dr, ar = f"draftrl{best}/{layouts[0]}", f"hf_ar/{layouts[0]}"
    mean_round = sum(len(t.tokens(dr, i)) for i in items) / sum(t.runs[(dr, i)][0].rounds - 1 for i in items)
    print(f"speedup_vs_autoregressive={t.throughput(dr, items) / t.throughput(ar, items):.2f}x  "
          f"vs_hf_lookup={t.throughput(dr, items) / t.throughput(f'hf_lookup{best}/{layouts[0]}', items):.2f}x  "
          f"mean_tokens_per_round={mean_round:.2f}  drafter=ngram depth={best}  "
          f"fast_linear={layouts[0]}  {where}")


if __name__ == "__main__":
    main()
