"""A learned per-round (drafter, depth) choice in draftrl's real engine, against every fixed arm and HF generate.

PPO is trained on ``draftrl/TraceChoice-v0`` over the tune split's traces of the two drafters
(``--train ngram=DIR --train eagle3=DIR``, as ``drafter_choice_headroom.py`` takes them; each seed
trains one policy and the one with the fewest replayed seconds on the tune traces is kept). Then,
on held-out prompts, in one interleaved run (``--repeats`` rotations, per-request medians), draftrl's
engine decodes with the shipped head and n-gram lookup inside one ``MixedDrafter``:

- ``none`` (no speculation), every fixed ``ngram:K`` and ``eagle3:K`` of ``--fixed-depths``, the SAM rule
  (``sam:N`` at ``--rule-depth``), and ``ppo``: :class:`draftrl.policies.choice.ChoiceSchedule`
  choosing each round's arm from both drafters' own signals;
- per-level confidence stops, the head drafting up to ``max(--depths)`` levels a round
  (:mod:`draftrl.policies.confidence_stop`): Hugging Face's ``hf-threshold:T`` (stop after the first
  token whose draft probability is below ``--hf-threshold``), ``hf-roc`` (that threshold re-fitted
  after every round from the request's ROC, as transformers' code does, so per request) and
  ``eagle2-cum:T`` for each ``--cum-thresholds`` T (stop once the chain's probability is below T;
  every T is a row and the best one in this run is compared with, which favours the baseline) and
  SpecDec++'s ``specdec:H`` for each ``--specdec-thresholds`` H (stop once the predicted probability
  that a token drafted this round is rejected exceeds H; :mod:`draftrl.policies.acceptance_stop`, its
  predictor fitted on the head's tune traces; the best H of this run is compared with);
- Hugging Face's heuristic schedule on the head (``heuristic:K``: +2 levels after a round that
  accepted everything, else -1, from ``--heuristic-initial`` K, at most ``max(--depths)``);
- stock Hugging Face ``generate``, plain and with prompt lookup (``--hf-lookup`` gammas).

Prints throughput ratios with paired bootstrap intervals over requests (``ppo`` against the best
fixed arm measured in this same run, the SAM rule, the HF anchors, both HF thresholds, the best
cumulative stop, the best SpecDec++ stop and the heuristic), per task and language, and
checks every greedy output against ``none``'s.

    python benchmarks/drafter_choice.py --train ngram=runs/tr_ngram_tune --train eagle3=runs/tr_eagle3_tune \\
        --out runs/bench/drafter_choice
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from _bench import (
    Bench,
    anchor_method,
    common_flags,
    engine_method,
    interleave,
    named_dirs,
    parse_args,
    requests,
    stop_flags,
    stop_rules,
)

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.decoding.schedule import HeuristicSchedule
from draftrl.envs.trace_choice import TraceChoiceEnv
from draftrl.eval.bootstrap import paired_ratio_ci
from draftrl.eval.round.anchors import Anchor
from draftrl.policies.acceptance_stop import fit_acceptance
from draftrl.replay.round_table import level_path_probs, match_depths
from draftrl.replay.traces import Traces


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    p.add_argument("--train", action="append", required=True, metavar="NAME=DIR",
                   help="tune-split traces of the n-gram drafter (ngram=DIR) and of the head (eagle3=DIR)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--languages", default="en,it,zh,es")
    p.add_argument("--tasks", default="code_edit,summarize,qa_context,chat")
    p.add_argument("--limit-per-group", type=int, default=1, help="held-out prompts per language x task")
    p.add_argument("--max-new-tokens", type=int, default=32, help="the traces' budget")
    p.add_argument("--depths", default="1,2,3,4,6", help="the PPO arms' depths (the traces' grid)")
    p.add_argument("--fixed-depths", default="1,2,4", help="depths of the fixed ngram:K and eagle3:K rows")
    p.add_argument("--rule-min-match", type=int, default=2)
    p.add_argument("--rule-depth", type=int, default=2)
    p.add_argument("--hf-lookup", default="2,4", help="HF prompt_lookup_num_tokens gammas")
    stop_flags(p, specdec_thresholds="0.5,0.7,0.9")
    p.add_argument("--heuristic-initial", type=int, default=5,
                   help="heuristic:K's first depth (transformers' num_assistant_tokens)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timesteps", type=int, default=60_000)
    p.add_argument("--seeds", default="0,1,2")
    args = parse_args(p, quick=dict(limit_per_group=1, languages="en", tasks="code_edit,chat", repeats=1,
                                    timesteps=4_000, seeds="0", depths="1,2", fixed_depths="1,2", hf_lookup="2",
                                    cum_thresholds="0.25", specdec_thresholds="0.7", max_new_tokens=16))
    bench = Bench(args, __file__)
    from draftrl.drafters.registry import build_drafter
    from draftrl.models import load_model
    from draftrl.train.choice import play_choice, train_choice

    dirs = named_dirs(args.train, "--train")
    if set(dirs) != {"ngram", "eagle3"}:
        raise SystemExit(f"--train names {sorted(dirs)}; give ngram=DIR and eagle3=DIR (the two drafters of sam).")
    depths = [int(d) for d in args.depths.split(",")]
    best_policy, best_seconds = None, float("inf")
    for seed in [int(s) for s in args.seeds.split(",")]:
        bench.note(f"training PPO on the tune traces (seed {seed}, {args.timesteps} rounds)")
        policy = train_choice(lambda: TraceChoiceEnv(dirs, depths), args.timesteps, seed=seed)
        seconds = sum(play_choice(TraceChoiceEnv(dirs, depths), policy.act))
        if seconds < best_seconds:
            best_policy, best_seconds = policy, seconds
    arms = TraceChoiceEnv(dirs, depths).arms

    loaded = load_model(args.model)
    eos = loaded.eos_token_ids
    mixed = build_drafter(f"sam:{args.rule_min_match}", loaded)
    engine = SpeculativeDecoder(loaded.model, mixed, EngineConfig(max_depth=max(depths)), eos)
    from draftrl.policies.choice import ChoiceSchedule

    chooser = ChoiceSchedule(mixed, arms, best_policy.act, lookup="ngram", model="eagle3")

    def mixed_method(forced: str | None, depth: int):
        def run(req):
            mixed.forced = forced
            engine.config.max_new_tokens = req.max_new_tokens
            result = generate(engine, req.ids, fixed_schedule(depth))
            return result.token_ids, result.num_rounds
        return run

    def ppo(req):
        engine.config.max_new_tokens = req.max_new_tokens
        chooser.start(req.max_new_tokens)
        result = generate(engine, req.ids, chooser, on_round=chooser.on_round)
        return result.token_ids, result.num_rounds, list(chooser.played)

    methods = {"none": engine_method(loaded.model, None, eos, 0)}
    for depth in [int(d) for d in args.fixed_depths.split(",")]:
        methods[f"ngram:{depth}"] = mixed_method("lookup", depth)
        methods[f"eagle3:{depth}"] = mixed_method("model", depth)
    methods[f"sam:{args.rule_min_match}:{args.rule_depth}"] = mixed_method(None, args.rule_depth)

    def stop_method(rule):
        def run(req):
            mixed.forced = "model"
            engine.config.max_new_tokens = req.max_new_tokens
            rule.start()
            result = generate(engine, req.ids, fixed_schedule(max(depths)), stop=rule, on_round=rule.on_round)
            return result.token_ids, result.num_rounds
        return run

    tune = Traces.load(dirs["eagle3"])
    acceptance = fit_acceptance(level_path_probs(tune, max(depths)), match_depths(tune))
    bench.note(f"SpecDec++ acceptance predictor fitted on {acceptance.num_samples} judged levels of {dirs['eagle3']}")
    stops = stop_rules(args, acceptance)
    for stop_rule in stops:
        methods[stop_rule.name] = stop_method(stop_rule)
    heuristic = HeuristicSchedule(min(args.heuristic_initial, max(depths)), max(depths))

    def heuristic_method(req):
        mixed.forced = "model"
        engine.config.max_new_tokens = req.max_new_tokens
        heuristic.start()
        result = generate(engine, req.ids, heuristic, on_round=heuristic.on_round)
        return result.token_ids, result.num_rounds

    methods[f"heuristic:{heuristic.initial}"] = heuristic_method
    methods["ppo"] = ppo
    methods["hf"] = anchor_method(loaded.model, Anchor(0), eos)
    for g in [int(g) for g in args.hf_lookup.split(",") if g]:
        methods[f"hf-lookup:{g}"] = anchor_method(loaded.model, Anchor(g), eos)

    reqs = requests(loaded.tokenizer, args.languages.split(","), args.tasks.split(","), args.limit_per_group,
                    args.max_new_tokens)
    timings = interleave(methods, reqs, args.repeats)
    mismatched = [f"{m}:{reqs[i].id}" for m in methods for i in range(len(reqs))
                  if m != "none" and timings.tokens(m, i) != timings.tokens("none", i)]
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(reqs):
        groups["all"].append(i)
        groups[f"task={r.task}"].append(i)
        groups[f"language={r.language}"].append(i)

    def ci(a: str, b: str, rows: list[int]) -> dict:
        return paired_ratio_ci([len(timings.tokens(a, i)) for i in rows], [timings.median_seconds(a, i) for i in rows],
                               [len(timings.tokens(b, i)) for i in rows], [timings.median_seconds(b, i) for i in rows])

    fixed = [m for m in methods if m.startswith(("ngram:", "eagle3:"))]
    lookups = [m for m in methods if m.startswith("hf-lookup:")]
    cums = [m for m in methods if m.startswith("eagle2-cum:")]
    specdecs = [m for m in methods if m.startswith("specdec:")]
    hf_threshold, hf_roc = stops[0].name, stops[1].name
    summary = {}
    for group, rows in groups.items():
        best = max(fixed, key=lambda m: timings.throughput(m, rows))
        best_hf = max(lookups, key=lambda m: timings.throughput(m, rows)) if lookups else None
        best_cum = max(cums, key=lambda m: timings.throughput(m, rows))
        best_specdec = max(specdecs, key=lambda m: timings.throughput(m, rows))
        rule = f"sam:{args.rule_min_match}:{args.rule_depth}"
        cells = {"ppo_vs_best_fixed": ci("ppo", best, rows), "ppo_vs_sam": ci("ppo", rule, rows),
                 "ppo_vs_none": ci("ppo", "none", rows), "ppo_vs_hf": ci("ppo", "hf", rows),
                 **({"ppo_vs_hf_lookup": ci("ppo", best_hf, rows)} if best_hf else {}),
                 "ppo_vs_hf_threshold": ci("ppo", hf_threshold, rows), "ppo_vs_hf_roc": ci("ppo", hf_roc, rows),
                 "ppo_vs_best_cum": ci("ppo", best_cum, rows), "ppo_vs_best_specdec": ci("ppo", best_specdec, rows),
                 "ppo_vs_heuristic": ci("ppo", f"heuristic:{heuristic.initial}", rows),
                 "best_fixed_vs_none": ci(best, "none", rows)}
        bench.row({k: v["ratio"] for k, v in cells.items()},
                  {f"{k}_ci": f"[{v['low']:.2f},{v['high']:.2f}]" for k, v in cells.items() if k.startswith("ppo")},
                  group=group, best_fixed=best, best_hf_lookup=best_hf or "-", best_cum=best_cum,
                  best_specdec=best_specdec, requests=len(rows))
        summary[group] = {"best_fixed": best, "best_hf_lookup": best_hf, "best_cum": best_cum,
                          "best_specdec": best_specdec, **cells}
    bench.note("every method over the workload: throughput over none, tokens per round")
    throughput = {m: timings.throughput(m, groups["all"]) for m in methods}
    for m in sorted(methods, key=throughput.get, reverse=True):
        bench.row({"vs_none": throughput[m] / throughput["none"]},
                  {"tok_s": throughput[m], "tokens_per_round": timings.tokens_per_round(m, groups["all"])}, method=m)
    shares: dict[str, int] = defaultdict(int)
    for i in groups["all"]:
        for name, depth in timings.runs[("ppo", i)][0].detail:
            shares[name] += 1
    total = sum(shares.values()) or 1
    bench.note("ppo rounds per drafter: " + "  ".join(f"{k}={v / total:.2f}" for k, v in sorted(shares.items()))
               + f"  greedy identity: {'passed' if not mismatched else 'FAILED ' + ', '.join(mismatched[:5])}")
    bench.save(train=dirs, arms=[list(a) for a in arms], summary=summary, throughput=throughput,
               ppo_shares={k: v / total for k, v in shares.items()}, mismatched=mismatched,
               requests=[r.id for r in reqs])
    if mismatched:
        raise SystemExit(f"greedy outputs differ from no speculation: {', '.join(mismatched[:5])}")


if __name__ == "__main__":
    main()
