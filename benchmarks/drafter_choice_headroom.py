"""How much any per-round choice of drafter and depth can gain over the best fixed one, on recorded traces.

Issue "Policies that choose the drafter" asks draftrl's engine for a learned policy >= 1.15x the grid's
best fixed (drafter, depth). Before training for it, bound it: with traces of each drafter over the same
held-out prompts (``draftrl collect --drafter D --cost-table C``), every round any schedule could play is
known, and :mod:`draftrl.eval.round.headroom` computes

- every fixed ``(drafter, depth)`` (the grid), the SAM-style rule (``--rule``) at each depth,
- with ``--stops MODEL``, the per-level stops on that drafter's chains up to the deepest depth:
  Hugging Face's confidence threshold (``hf-threshold:T``) and its per-request ROC re-fit
  (``hf-roc``), EAGLE-2's cumulative confidence (``eagle2-cum:T``) and SpecDec++'s trained
  acceptance predictor (``specdec:H``, fitted on ``--train``'s traces of MODEL; needs ``--train``),
- with ``--heuristics DRAFTER:K,...``, Hugging Face's heuristic schedule on DRAFTER from depth K,
- the greedy one-round lookahead, and
- **hindsight**: the fewest seconds any per-round sequence of choices needs (a dynamic program), the
  ceiling of every policy that chooses per round, learned or not,

in the seconds ``draftrl/TraceReplay-v1`` charges (verify all drafted nodes, no noise; the target's
costs from ``--common``'s table, each drafter's own drafting costs). Prints speedups over no speculation,
then over the best fixed arm, for the workload and per task and language, and the hindsight
schedule's share of rounds per drafter. With ``--train NAME=DIR`` (the same drafters' traces on the tune
split) it also trains PPO on ``draftrl/TraceChoice-v0`` over those and places it on the held-out traces
(``ppo`` rows): the learned per-round choice against the ceiling.

    python benchmarks/drafter_choice_headroom.py --traces ngram=runs/tr_ngram --traces eagle3=runs/tr_eagle3 \\
        --rule ngram,eagle3,2 --train ngram=runs/tr_ngram_tune --train eagle3=runs/tr_eagle3_tune \
        --stops eagle3 --heuristics eagle3:5,ngram:5 --depths 1,2,3,4,5,6 --out runs/bench/drafter_choice_headroom
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from _bench import Bench, common_flags, named_dirs, parse_args, stop_flags, stop_rules

from draftrl.envs.trace_choice import TraceChoiceEnv
from draftrl.eval.round.headroom import headroom
from draftrl.policies.acceptance_stop import fit_acceptance
from draftrl.replay.round_table import level_path_probs, match_depths, round_table
from draftrl.replay.traces import Traces, stored_cost_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    p.add_argument("--traces", action="append", required=True, metavar="NAME=DIR",
                   help="a drafter's traces (with the cost table collect stored), repeatable")
    p.add_argument("--common", default=None, help="whose cost table gives the target's costs (default: the first)")
    p.add_argument("--depths", default="1,2,3,4,6", help="draft depths of the arms")
    p.add_argument("--rule", action="append", default=[], metavar="LOOKUP,MODEL,N",
                   help="SAM-style rule: LOOKUP's n-gram drafts when its match is >= N tokens, else MODEL's")
    p.add_argument("--train", action="append", default=[], metavar="NAME=DIR",
                   help="the same drafters' tune-split traces: train PPO on them and place it on --traces")
    p.add_argument("--stops", default=None, metavar="MODEL",
                   help="also replay the per-level stops on MODEL's chains (needs --depths 1..D)")
    stop_flags(p, specdec_thresholds="0.3,0.5,0.7,0.9")
    p.add_argument("--heuristics", default="", metavar="DRAFTER:K,...",
                   help="HF's heuristic schedule on DRAFTER from depth K (needs --depths 1..D)")
    p.add_argument("--timesteps", type=int, default=60_000, help="PPO rounds of training")
    p.add_argument("--seeds", default="0,1,2", help="PPO seeds (one policy each; the rows give their median)")
    args = parse_args(p, quick=dict(timesteps=8_000, seeds="0"))
    bench = Bench(args, __file__)
    depths = [int(d) for d in args.depths.split(",")]
    dirs = named_dirs(args.traces, "--traces")
    traces, costs = {}, {}
    for name, directory in dirs.items():
        traces[name] = Traces.load(directory)
        table = stored_cost_table(directory)
        if table is None:
            raise SystemExit(f"{directory} has no cost_table.json; collect with --cost-table FILE.")
        costs[name] = table
    common = costs[args.common] if args.common else None
    table = round_table(traces, costs, depths, common=common)
    rules = []
    for rule in args.rule:
        lookup, model, n = rule.split(",")
        rules.append((lookup, model, int(n)))
    train_dirs = named_dirs(args.train, "--train") if args.train else {}
    stops = []
    if args.stops:
        if args.stops not in dirs:
            raise SystemExit(f"--stops {args.stops}: no --traces of that name; give one of {list(dirs)}.")
        model = None
        if args.stops in train_dirs:
            tune = Traces.load(train_dirs[args.stops])
            model = fit_acceptance(level_path_probs(tune, max(depths)), match_depths(tune))
            bench.note(f"acceptance predictor fitted on {model.num_samples} judged levels of "
                       f"{train_dirs[args.stops]}: weights {', '.join(f'{w:.3f}' for w in model.weights)}")
            if bench.out is not None:
                model.save(bench.out / "acceptance_model.json")
        else:
            bench.note(f"no --train traces of {args.stops}: specdec:H (fitted on them) left out")
        stops = stop_rules(args, model)
    try:
        heuristics = [(name, int(k)) for name, k in (h.split(":") for h in args.heuristics.split(",") if h)]
        room = headroom(table, rules, [(args.stops, rule) for rule in stops], heuristics)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if train_dirs:
        if list(train_dirs) != list(dirs):
            raise SystemExit(f"--train names {list(train_dirs)}; it needs the drafters of --traces, {list(dirs)}, "
                             "in the same order.")
        from draftrl.train.choice import play_choice, train_choice

        held = TraceChoiceEnv(traces, depths, cost_tables=costs, common=args.common, table=table)
        runs = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            bench.note(f"training PPO on {', '.join(train_dirs.values())} (seed {seed}, {args.timesteps} rounds)")
            policy = train_choice(lambda: TraceChoiceEnv(train_dirs, depths, common=args.common), args.timesteps,
                                  seed=seed)
            runs.append(play_choice(held, policy.act))
        totals = [sum(r) for r in runs]
        median_run = runs[sorted(range(len(runs)), key=totals.__getitem__)[len(runs) // 2]]
        room.schedules["ppo"] = median_run
        room.played["ppo"] = [[] for _ in median_run]

    groups: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(table.prompts):
        groups["all"].append(i)
        groups[f"task={prompt.task}"].append(i)
        groups[f"language={prompt.language}"].append(i)
    summary = {}
    for group, rows in groups.items():
        best = room.best_fixed(rows)
        rule = room.best_rule(rows)
        stop = room.best_stop(rows)
        picks = {"best_fixed": best, **({"best_rule": rule} if rule else {}), **({"best_stop": stop} if stop else {}),
                 **({"ppo": "ppo"} if "ppo" in room.schedules else {}), "lookahead": "lookahead",
                 "hindsight": "hindsight"}
        ratios = {f"{k}_vs_none": room.speedup(v, prompts=rows) for k, v in picks.items()}
        if "ppo" in room.schedules:
            ratios["ppo_vs_best_fixed"] = room.speedup("ppo", over=best, prompts=rows)
        if stop:
            ratios["best_stop_vs_best_fixed"] = room.speedup(stop, over=best, prompts=rows)
        ratios["hindsight_vs_best_fixed"] = room.speedup("hindsight", over=best, prompts=rows)
        if rule:
            ratios["hindsight_vs_best_rule"] = room.speedup("hindsight", over=rule, prompts=rows)
        took = {f"took_{k}": round(room.took(v, rows), 3) for k, v in picks.items()
                if k in ("best_rule", "best_stop", "ppo")}
        bench.row(ratios, {"requests": len(rows), **took}, group=group, best_fixed=best, best_rule=rule or "-",
                  best_stop=stop or "-")
        summary[group] = {"ratios": ratios, "took": took, "best_fixed": best, "best_rule": rule, "best_stop": stop}
    bench.note("every fixed arm, rule, stop and heuristic over the workload: "
               "speedup over none and over the best fixed arm")
    best = room.best_fixed()
    fixed = sorted((n for n in room.schedules if n.startswith(("fixed:", "rule:", "stop:", "heuristic:"))),
                   key=room.total)
    for name in fixed:
        bench.row({"vs_none": room.speedup(name), "vs_best_fixed": room.speedup(name, over=best)},
                  {"took": round(room.took(name), 3)}, arm=name)
    shares = room.arm_shares("hindsight")
    bench.note("hindsight rounds per drafter: " + "  ".join(f"{k}={v:.2f}" for k, v in shares.items()))
    bench.save(traces=dirs, train=args.train, arms=[list(a) for a in table.arms],
               summary=summary, hindsight_shares=shares,
               fixed={name: room.speedup(name) for name in fixed})



if __name__ == "__main__":
    main()
