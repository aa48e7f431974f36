"""How much any drafting schedule can gain over the best fixed K, in the serving replay.

Issue "Learning under load" asks a learned policy for >= 1.10x the best single fixed K over a load
sweep (geometric mean of per-load speedups). Before training for it, measure the ceiling on this
machine's calibrated step cost, on the held-out recordings, at each load (noise-free step cost, the
same seeds and arrivals for every arm):

- **fixed K**: depth cap K every step, no budget (the baseline the goal names);
- **best fixed**: the best fixed (depth, budget) setting of the action grid chosen *per load*, i.e. a
  policy that knows the load and never changes its action within it;
- **lookahead**: the greedy one-step lookahead (``ServeReplay-v1.lookahead_action``: every action of the
  grid tried one step ahead on a copy of the engine);
- **hindsight**: every request drafts only the tokens its continuation will accept (``rule=
  hindsight``), with the best (depth, budget) per load: no per-request depth or admission policy
  over this drafter can verify fewer wasted tokens;
- any ``--policies`` (``dsd:...``, ``ppo:PATH``) through the usual serving runner.

With ``--head [DIR]`` (the EAGLE-3 head; no DIR: the one draftrl ships) the head's proposals are
replayed too (``draftrl.replay.recordings.HeadProposals``), each head row charged route (b)'s engine as
``draftrl calibrate --engine vllm --drafter eagle3`` measured it (``--head-calibration``: its decode
cells, where the head only takes its rows, and its head cells):

- **fixed head K** (route (b)'s ``fixed:K@eagle3``) beside fixed n-gram K: the best fixed (drafter, K);
- **SAM** ``fixed:K@sam:N`` (n-gram lookup on an N-token match, else the head);
- **hindsight over both drafters**: every request, every step, drafts with the drafter that accepts
  more, just the tokens it accepts;
- **hindsight drafter**: the same choice of drafter, the depth from the step's (depth, budget), every
  setting of the grid, and with the greedy one-step lookahead choosing (depth, budget). Why both:
  where a step verifying a few more tokens costs no more (or, on vLLM's CPU runner at batch 1,
  less), drafting only what will be accepted is not the fastest schedule;
- **optimum** (concurrency 1 only): the exact fewest seconds over every per-step choice of drafter
  and depth, a dynamic program over each request's tokens
  (``draftrl.replay.serve_engine.single_stream_optimum``, both drafters priced on route (b)'s engine, the
  one engine that serves both);
- **ceiling**: the best of those per load, what any per-request choice of drafter and depth
  could reach here (issue "Policies that choose the drafter" asks a learned one for >= 1.20x the
  best fixed (drafter, K) at concurrency 1 and >= 1.10x the best single fixed over the sweep).

Prints one line per load (speedups over no speculation of the best arm of each kind), then each
kind's geometric mean over the loads and its ratio to the best single fixed K; ``--out`` keeps
them in ``results.json`` (the serving runner's files of ``--policies`` in ``OUT/policies/``).

    python benchmarks/serve_headroom.py --recordings runs/serve/rec_heldout --calibration runs/serve/vllm_costs.json \\
        --policies dsd:1-1:6,2-4:4,5-8:2,9-16:1,ppo:runs/serve/ppo_replay --out runs/bench/serve_headroom
    python benchmarks/serve_headroom.py --recordings ... --calibration ... --quick     # concurrency 1 and 4 only
    python benchmarks/serve_headroom.py --recordings ... --calibration runs/serve/vllm_costs.json \
        --head --head-calibration runs/serve/vllm_head_costs.json --out runs/bench/serve_headroom_head
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time

import numpy as np
from _bench import Bench, common_flags, parse_args

from draftrl.config.serve import load_serve_config
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.eval.policy_names import parse_policies
from draftrl.eval.serve.compare import loads_of, run_eval
from draftrl.eval.serve.rollout import episode_throughput
from draftrl.policies import Fixed, LookAhead
from draftrl.replay.recordings import Proposals, Recordings, head_proposals
from draftrl.replay.serve_calibrate import StepCostModel
from draftrl.replay.serve_engine import single_stream_fixed, single_stream_optimum


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def group_ceilings(bench: Bench, recordings: Recordings, tokens: int, depths: list[int], proposals: Proposals,
                   cost, heads, head_cost, chosen: list[int], none: list[float], optimum: list[float]) -> None:
    """Per task and per language over the ``chosen`` recordings, at concurrency 1: each group's best
    fixed (drafter, K), the ``optimum`` (per request, from :func:`single_stream_optimum`) and their
    ratio, the group's ceiling; ``none``: each request's seconds without speculation."""
    arms = {f"fixed:{d}": single_stream_fixed(recordings, tokens, d, (proposals, cost)) for d in depths}
    arms.update({f"fixed:{d}@eagle3": single_stream_fixed(recordings, tokens, d, (heads, head_cost)) for d in depths})
    bench.note("concurrency 1 per group: the best fixed (drafter, K) and the optimum, both over no speculation")
    for key in ("task", "language"):
        for value in sorted({getattr(recordings.requests[i].prompt, key) for i in chosen}):
            idx = [i for i in chosen if getattr(recordings.requests[i].prompt, key) == value]
            total = lambda seconds: sum(seconds[i] for i in idx)  # noqa: E731
            fixed = {name: total(none) / total(secs) for name, secs in arms.items()}
            best = max(fixed, key=fixed.get)
            bench.row({"best_fixed_vs_none": fixed[best], "optimum_vs_none": total(none) / total(optimum),
                       "ceiling_vs_best_fixed": total(none) / total(optimum) / fixed[best]},
                      requests=len(idx), group=f"{key}={value}", best_fixed=best)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    p.add_argument("--recordings", required=True, help="held-out recordings (draftrl collect --engine vllm)")
    p.add_argument("--calibration", required=True, help="draftrl calibrate --engine vllm --out FILE")
    p.add_argument("--policies", default="", help="more serving policies to place, e.g. dsd:1-1:6,...,ppo:DIR")
    p.add_argument("--head", nargs="?", const="", default=None, metavar="DIR",
                   help="also replay an EAGLE-3 head (DIR; no DIR: the shipped one): fixed head K, SAM, hindsight "
                        "over both drafters")
    p.add_argument("--head-calibration", default=None,
                   help="draftrl calibrate --engine vllm --drafter eagle3 --out FILE: route (b)'s step costs (default: "
                        "--calibration, if it has head cells)")
    p.add_argument("--head-cost-scale", type=float, default=1.0,
                   help="with --head: multiply the head's calibrated step cost (0 = a free head; what a machine "
                        "where a head level costs less of a target step would allow)")
    p.add_argument("--sam", type=int, default=2, help="with --head: SAM's shortest n-gram match that drafts by lookup")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--rates", default="1,4", help="Poisson arrival rates, requests per second")
    p.add_argument("--set", dest="overrides", action="append", default=["env.max_new_tokens=48"],
                   help="env.KEY=VALUE, a ServeConfig field (default env.max_new_tokens=48)")
    args = parse_args(p, quick=dict(concurrency="1,4", rates=""))
    bench = Bench(args, __file__, owned=("policies",))
    t0 = time.perf_counter()
    recordings = Recordings.load(args.recordings)
    config = load_serve_config(None, args.overrides, split=recordings.requests[0].prompt.split, shuffle=False,
                               seed=0)
    cost = StepCostModel.from_calibration(args.calibration)
    proposals = Proposals(recordings, config.max_depth)
    heads = head_cost = None
    if args.head is not None:
        # route (b)'s engine: its proposer's hooks and bookkeeping cost every step, not only where the head drafts
        head_cost = StepCostModel.from_calibration(args.head_calibration or args.calibration)
        if not head_cost.head:
            raise SystemExit(f"{args.head_calibration or args.calibration} has no head cells; pass --head-calibration "
                             "FILE from draftrl calibrate --engine vllm --drafter eagle3 --out FILE.")
        head_cost.head = {b: (levels, [s * args.head_cost_scale for s in secs])
                          for b, (levels, secs) in head_cost.head.items()}
        heads = head_proposals(recordings, config.max_depth, config.target, args.head or None,
                               progress=lambda msg: print(f"[serve_headroom] {msg}", file=sys.stderr))
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    rates = [float(r) for r in args.rates.split(",") if r]
    loads = [("concurrency", str(c), {"arrival": "fixed", "concurrency": c}) for c in concurrency]
    loads += [("rates", f"{r:g}", {"arrival": "poisson", "rate": r}) for r in rates]
    seed = config.seed if config.seed is not None else 0

    def env_for(cfg, drafter: str = "ngram") -> ServeVLLMEnv:
        return ServeVLLMEnv(cfg, engine="replay", recordings=recordings,
                            calibration=cost if drafter == "ngram" else head_cost, cost_noise=False,
                            proposals=proposals, drafter=drafter, head_proposals=heads)

    def throughput(env: ServeVLLMEnv, policy) -> float:
        """Tokens per engine second of one episode over the workload, ``policy`` choosing each action."""
        prompt_ids = [prompt.id for prompt in env.workload.prompts][: config.num_requests or None]
        return episode_throughput(env, policy, prompt_ids, seed)

    depths = [d for d in config.depths if d > 0]
    budgets = [b for b in config.budgets if b > 0]
    no_limit = max(config.budgets)  # 128 by default: >= depth x running for every depth
    rows = []
    single_stream = None  # with --head at concurrency 1: (the workload's recordings, none's and the optimum's seconds)
    for section, key, load in loads:
        env = env_for(dataclasses.replace(config, **load))
        hind = env_for(dataclasses.replace(config, rule="hindsight", **load))
        plain = throughput(env, Fixed.for_env(env, depth=0, verify_size=0))
        speed = lambda e, d, b: throughput(e, Fixed.for_env(e, depth=d, verify_size=b)) / plain  # noqa: E731
        fixed_k = {f"fixed:{d}": speed(env, d, no_limit) for d in depths}
        fixed = {f"fixed:{d}:{b}" if b else "fixed:0": speed(env, d, b) for d in depths for b in budgets}  # b 0: none
        hindsight = {f"hindsight:{d}:{b}": speed(hind, d, b) for d in depths for b in budgets}
        lookahead = throughput(env, LookAhead.for_env(env)) / plain
        row = {"load": f"{section}={key}", "none_tokens_per_second": plain, "fixed_k": fixed_k,
               "fixed": fixed, "lookahead": lookahead, "hindsight": hindsight}
        best = lambda d: max(d, key=d.get)  # noqa: E731
        ratios = {"best_fixed_k_vs_none": max(fixed_k.values()), "best_fixed_vs_none": max(fixed.values()),
                  "lookahead_vs_none": lookahead, "hindsight_vs_none": max(hindsight.values())}
        context = dict(best_fixed_k=best(fixed_k), best_fixed=best(fixed), best_hindsight=best(hindsight))
        if heads is not None:
            cfg = dataclasses.replace(config, **load)
            head_env, sam_env = env_for(cfg, "eagle3"), env_for(cfg, f"sam:{args.sam}")
            both = env_for(dataclasses.replace(config, rule="hindsight", **load), "hindsight")
            hindsight_drafter = env_for(cfg, "hindsight")
            row["fixed_head"] = {f"fixed:{d}@eagle3": speed(head_env, d, no_limit) for d in depths}
            row["sam"] = {f"fixed:{d}@sam:{args.sam}": speed(sam_env, d, no_limit) for d in depths}
            row["hindsight_both"] = {f"hindsight_both:{d}:{b}": speed(both, d, b) for d in depths for b in budgets}
            row["hindsight_drafter"] = {f"hindsight_drafter:{d}:{b}": speed(hindsight_drafter, d, b)
                                        for d in depths for b in budgets}
            row["hindsight_drafter_lookahead"] = (throughput(hindsight_drafter, LookAhead.for_env(hindsight_drafter))
                                                  / plain)
            row["ceiling"] = max(*row["hindsight_both"].values(), *row["hindsight_drafter"].values(),
                                 row["hindsight_drafter_lookahead"])
            fixed_any = {**fixed_k, **row["fixed_head"]}
            ratios.update({"best_fixed_drafter_k_vs_none": max(fixed_any.values()),
                           "best_sam_vs_none": max(row["sam"].values()),
                           "hindsight_both_vs_none": max(row["hindsight_both"].values()),
                           "hindsight_drafter_vs_none": max(row["hindsight_drafter"].values()),
                           "hindsight_drafter_lookahead_vs_none": row["hindsight_drafter_lookahead"],
                           "ceiling_vs_best_fixed": row["ceiling"] / max(fixed_any.values())})
            context.update(best_fixed_drafter_k=best(fixed_any), best_sam=best(row["sam"]),
                           best_hindsight_drafter=best(row["hindsight_drafter"]))
            if load.get("concurrency") == 1:  # one request at a time: the exact optimum, a dynamic program
                ids = {prompt.id for prompt in env.workload.prompts[: config.num_requests or None]}
                chosen = [i for i, r in enumerate(recordings.requests) if r.prompt.id in ids]
                none = single_stream_optimum(recordings, config.max_new_tokens, 0, [(proposals, cost)])
                optimum = single_stream_optimum(recordings, config.max_new_tokens, config.max_depth,
                                                [(proposals, head_cost), (heads, head_cost)])
                single_stream = (chosen, none, optimum)
                row["optimum"] = sum(none[i] for i in chosen) / sum(optimum[i] for i in chosen)
                row["ceiling"] = max(row["ceiling"], row["optimum"])
                ratios.update({"optimum_vs_none": row["optimum"],
                               "ceiling_vs_best_fixed": row["ceiling"] / max(fixed_any.values())})
        rows.append(row)
        bench.row(ratios, {"none_tok_s": plain}, **{"concurrency" if section == "concurrency" else "rate": key},
                  **context)
    if single_stream is not None:
        group_ceilings(bench, recordings, config.max_new_tokens, depths, proposals, cost, heads, head_cost,
                       *single_stream)
    extra = {}
    if args.policies:
        specs = [s.label for s in parse_policies(args.policies, engine="vllm")]
        res = run_eval(bench.path("policies") or tempfile.mkdtemp(prefix="serve_headroom_"),
                               policies=args.policies, concurrency=concurrency,
                               rates=rates, config=config, make_env=lambda cfg, spec: env_for(cfg))
        extra = {label: [res[s][k]["policies"][label]["speedup_vs_none"] for s, k in loads_of(res)]
                 for label in specs if label != "none"}
    fixed_labels = list(rows[0]["fixed_k"])
    k_best = max(fixed_labels, key=lambda k: geomean([r["fixed_k"][k] for r in rows]))
    reference = geomean([r["fixed_k"][k_best] for r in rows])
    single = max(rows[0]["fixed"], key=lambda k: geomean([r["fixed"][k] for r in rows]))
    kinds = {f"best_single_fixed_k:{k_best}": [r["fixed_k"][k_best] for r in rows],
             f"best_single_depth_budget:{single}": [r["fixed"][single] for r in rows],
             "best_fixed_per_load": [max(r["fixed"].values()) for r in rows],
             "greedy_one_step_lookahead": [r["lookahead"] for r in rows],
             "hindsight_per_load": [max(r["hindsight"].values()) for r in rows],
             **extra}
    if heads is not None:
        pooled = {k: [{**r["fixed_k"], **r["fixed_head"]}[k] for r in rows]
                  for k in [*rows[0]["fixed_k"], *rows[0]["fixed_head"]]}
        any_best = max(pooled, key=lambda k: geomean(pooled[k]))
        sam_best = max(rows[0]["sam"], key=lambda k: geomean([r["sam"][k] for r in rows]))
        kinds.update({f"best_single_fixed_drafter_k:{any_best}": pooled[any_best],
                      f"best_single_sam:{sam_best}": [r["sam"][sam_best] for r in rows],
                      "best_fixed_drafter_k_per_load": [max({**r["fixed_k"], **r["fixed_head"]}.values())
                                                        for r in rows],
                      "hindsight_both_drafters_per_load": [max(r["hindsight_both"].values()) for r in rows],
                      "hindsight_drafter_per_load": [max(r["hindsight_drafter"].values()) for r in rows],
                      "hindsight_drafter_lookahead": [r["hindsight_drafter_lookahead"] for r in rows],
                      "ceiling_per_load": [r["ceiling"] for r in rows]})
    bench.note(f"geometric mean over {len(rows)} loads ({', '.join(r['load'] for r in rows)}): speedup over none, "
               "then vs the best single fixed K")
    for name, values in kinds.items():
        bench.row({"geomean_vs_none": geomean(values), "vs_best_fixed_k": geomean(values) / reference},
                  {"per_load": "/".join(f"{v:.2f}" for v in values)}, kind=name)
    bench.save(recordings=args.recordings, calibration=args.calibration, depths=depths, budgets=budgets, loads=rows,
               seconds=time.perf_counter() - t0,
               summary={name: {"speedups": values, "geomean": geomean(values),
                               "vs_best_fixed_k": geomean(values) / reference} for name, values in kinds.items()})


if __name__ == "__main__":
    main()
