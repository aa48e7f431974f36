"""Load sweep in real vLLM and in the replay: the same policies, the same held-out requests.

For each Poisson arrival rate (and fixed concurrency, if given) every policy runs in real vLLM
(``draftrl.eval.serve.compare.run_eval``: policies interleaved, ``--repeats`` passes, the
median-time pass kept, float32 greedy identity checked) and in ``draftrl/ServeReplay-v1`` (the
same runner with the replay's env). Per load, one line per policy, ratios first: speedup over
no speculation in vLLM and in the replay (``vllm_speedup_vs_none``, ``replay_speedup_vs_none``),
then throughput, TTFT and ITL p50/p95/p99 of both;
then Kendall's tau between the two rankings of the policies (tau-a over pairs, per load and over
every load's speedups together), and ``OUT/sweep.png``: throughput and p95 ITL against load per
policy (the runner's files in ``OUT/real/`` and ``OUT/replay/``). vLLM's own methods (``vllm-ngram:K``,
``vllm-eagle3:K``, ``vllm-class:...``) have no replay (they are not draftrl's proposer) and run in vLLM only.

    python benchmarks/serve_sweep.py --recordings runs/serve/rec_heldout --calibration runs/serve/vllm_costs.json \\
        --policies none,fixed:2,fixed:4,fixed:8,heuristic,ppo:runs/serve/ppo_replay --rates 0.5,2,8 \\
        --out runs/bench/serve_sweep
    python benchmarks/serve_sweep.py --recordings ... --calibration ... --quick --out DIR    # 2 rates, 1 repeat
"""

from __future__ import annotations

import argparse

from _bench import Bench, common_flags, parse_args

from draftrl.config.serve import load_serve_config
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.eval.metrics import kendall_tau
from draftrl.eval.plots import load_sweep
from draftrl.eval.policy_names import parse_policies
from draftrl.eval.serve.compare import loads_of, run_eval
from draftrl.io import read_json
from draftrl.replay.recordings import Proposals, Recordings
from draftrl.replay.serve_calibrate import StepCostModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--recordings", required=True, help="held-out recordings (draftrl collect --engine vllm)")
    parser.add_argument("--calibration", required=True, help="draftrl calibrate --engine vllm --out FILE")
    parser.add_argument("--policies", default="none,fixed:1,fixed:2,fixed:4,fixed:8,heuristic")
    parser.add_argument("--rates", default="0.5,2,8", help="Poisson arrival rates, requests per second")
    parser.add_argument("--concurrency", default="", help="fixed concurrency levels too, e.g. 1,4,16")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes; the median-time pass is kept")
    parser.add_argument("--set", dest="overrides", action="append", default=["env.max_new_tokens=48"],
                        help="env.KEY=VALUE, a ServeConfig field (default env.max_new_tokens=48)")
    parser.add_argument("--real-results", default=None, help="reuse this vLLM results.json instead of running vLLM")
    args = parse_args(parser, quick=dict(policies="none,fixed:2,heuristic", rates="0.5,4", repeats=1))
    bench = Bench(args, __file__, owned=("real", "replay", "sweep.png"), needs_out=True)
    out = bench.out
    config = load_serve_config(None, args.overrides, split="heldout", shuffle=False, seed=0)
    rates = [float(r) for r in args.rates.split(",") if r]
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    specs = parse_policies(args.policies, engine="vllm")
    replayed = ",".join(s.text for s in specs if not s.kind.startswith("vllm-"))
    recordings, cost = Recordings.load(args.recordings), StepCostModel.from_calibration(args.calibration)
    proposals = Proposals(recordings, config.max_depth)

    def replay_env(cfg, spec):
        return ServeVLLMEnv(cfg, engine="replay", recordings=recordings, calibration=cost, proposals=proposals)

    replay = run_eval(out / "replay", policies=replayed, concurrency=concurrency, rates=rates,
                           repeats=args.repeats, config=config, make_env=replay_env)
    real = read_json(args.real_results, "vLLM results") if args.real_results else run_eval(
        out / "real", policies=args.policies, concurrency=concurrency, rates=rates, repeats=args.repeats, config=config)
    all_real, all_replay = [], []
    for section, key in loads_of(real):
        load = {"rate" if section == "rates" else "concurrency": key}
        r_table, s_table = real[section][key]["policies"], replay[section][key]["policies"]
        both = [label for label in r_table if label in s_table]
        bench.note(f"{section}={key}")
        for label in sorted(r_table, key=lambda k: -r_table[k]["speedup_vs_none"]):
            r, s = r_table[label], s_table.get(label, {})
            ms = lambda v: v * 1e3 if v is not None else None  # noqa: E731
            bench.row({"vllm_speedup_vs_none": r["speedup_vs_none"],
                       "replay_speedup_vs_none": s.get("speedup_vs_none")},
                      {"vllm_tok_s": r["tokens_per_second"], "replay_tok_s": s.get("tokens_per_second"),
                       **{f"{who}{name}_ms": ms(t.get(field)) for who, t in (("", r), ("replay_", s))
                          for name, field in (("ttft_p50", "time_to_first_token_p50"), ("itl_p50", "itl_p50"),
                                              ("itl_p95", "itl_p95"), ("itl_p99", "itl_p99"))}},
                      policy=label, **load)
        tau = kendall_tau([r_table[k]["speedup_vs_none"] for k in both], [s_table[k]["speedup_vs_none"] for k in both])
        all_real += [r_table[k]["speedup_vs_none"] for k in both]
        all_replay += [s_table[k]["speedup_vs_none"] for k in both]
        if tau is not None:
            bench.row({}, {"kendall_tau": tau}, policies=len(both), **load)
    bench.row({}, {"kendall_tau_all": kendall_tau(all_real, all_replay),
                   "exactness_passed": real["exactness"]["passed"]},
              speedups=len(all_real), repeats=args.repeats)
    load_sweep(real, replay, [s.label for s in specs], out / "sweep.png")
    bench.save()


if __name__ == "__main__":
    main()
