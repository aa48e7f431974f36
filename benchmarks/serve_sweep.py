"""Load sweep in real vLLM and in the simulator: the same policies, the same held-out requests.

For each Poisson arrival rate (and fixed concurrency, if given) every policy runs in real vLLM
(``draftrl.eval.serving.run_serving_eval``: policies interleaved, ``--repeats`` passes, the
median-time pass kept, float32 greedy identity checked) and in ``draftrl/ServeReplay-v0`` (the
same runner with the simulator's env). Per load, one line per policy, ratios first: speedup over
no speculation in vLLM and in the simulator, then throughput, TTFT and ITL p50/p95/p99 of both;
then Kendall's tau between the two rankings of the policies (tau-a over pairs, per load and over
every load's speedups together), and a PNG of throughput and p95 ITL against load per policy.
vLLM's own ``ngram:K`` has no simulator (it is not draftrl's proposer) and is run in vLLM only.

    python benchmarks/serve_sweep.py --recordings runs/serve/rec_heldout --calibration runs/serve/vllm_costs.json \\
        --policies none,fixed:2,fixed:4,fixed:8,heuristic,ppo:runs/serve/ppo_sim --rates 0.5,2,8 --out runs/serve/sweep
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from draftrl.decoding.vllm.calibrate import StepCostModel
from draftrl.envs.serve_replay import ServeReplayEnv
from draftrl.envs.serve_sim import Proposals, Recordings
from draftrl.eval.plots import load_sweep
from draftrl.config.serve import load_serve_config
from draftrl.eval.metrics import kendall_tau
from draftrl.eval.policy_names import parse_policies
from draftrl.eval.serving import loads_of, run_serving_eval
from draftrl.io import read_json
from draftrl.signals.costs import hardware_info, hardware_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", required=True, help="held-out recordings (draftrl collect --engine vllm)")
    parser.add_argument("--calibration", required=True, help="draftrl calibrate --engine vllm --out FILE")
    parser.add_argument("--policies", default="none,fixed:1,fixed:2,fixed:4,fixed:8,heuristic")
    parser.add_argument("--rates", default="0.5,2,8", help="Poisson arrival rates, requests per second")
    parser.add_argument("--concurrency", default="", help="fixed concurrency levels too, e.g. 1,4,16")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes; the median-time pass is kept")
    parser.add_argument("--set", dest="overrides", action="append", default=["env.max_new_tokens=48"],
                        help="env.KEY=VALUE, a ServeConfig field (default env.max_new_tokens=48)")
    parser.add_argument("--real-results", default=None, help="reuse this vLLM results.json instead of running vLLM")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    config = load_serve_config(None, args.overrides, split="heldout", shuffle=False, seed=0)
    rates = [float(r) for r in args.rates.split(",") if r]
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    specs = parse_policies(args.policies, engine="vllm")
    simulated = ",".join(s.label for s in specs if s.kind != "ngram")
    recordings, cost = Recordings.load(args.recordings), StepCostModel.from_calibration(args.calibration)
    proposals = Proposals(recordings, config.max_depth)

    def sim_env(cfg, spec):
        return ServeReplayEnv(recordings, cost, cfg, proposals=proposals)

    sim = run_serving_eval(out / "sim", policies=simulated, concurrency=concurrency, rates=rates,
                           repeats=args.repeats, config=config, make_env=sim_env)
    real = read_json(args.real_results, "vLLM results") if args.real_results else run_serving_eval(
        out / "real", policies=args.policies, concurrency=concurrency, rates=rates, repeats=args.repeats, config=config)
    machine = f"{hardware_name(hardware_info())}  load1={os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus"
    all_real, all_sim = [], []
    for section, key in loads_of(real):
        r_table, s_table = real[section][key]["policies"], sim[section][key]["policies"]
        both = [label for label in r_table if label in s_table]
        print(f"--- {section}={key}")
        for label in sorted(r_table, key=lambda k: -r_table[k]["speedup_vs_none"]):
            r, s = r_table[label], s_table.get(label)
            ms = lambda v: f"{v * 1e3:.0f}" if v is not None else "-"  # noqa: E731
            sim_part = (f"sim={s['speedup_vs_none']:.2f}x  sim_tok/s={s['tokens_per_second']:.1f}  "
                        f"sim_ttft_p50={ms(s['time_to_first_token_p50'])}ms  sim_itl_p50/95/99="
                        f"{ms(s['itl_p50'])}/{ms(s['itl_p95'])}/{ms(s['itl_p99'])}ms") if s else "sim=-"
            print(f"vllm={r['speedup_vs_none']:.2f}x  {sim_part}  vllm_tok/s={r['tokens_per_second']:.1f}  "
                  f"ttft_p50={ms(r['time_to_first_token_p50'])}ms  itl_p50/95/99={ms(r['itl_p50'])}/"
                  f"{ms(r['itl_p95'])}/{ms(r['itl_p99'])}ms  {label}")
        a = [r_table[k]["speedup_vs_none"] for k in both]
        b = [s_table[k]["speedup_vs_none"] for k in both]
        all_real += a
        all_sim += b
        tau = kendall_tau(a, b)
        print(f"kendall_tau={tau:.2f}  over {len(both)} policies  {section}={key}" if tau is not None else "")
    tau = kendall_tau(all_real, all_sim)
    print(f"kendall_tau_all={tau:.2f}  over {len(all_real)} (load, policy) speedups  "
          f"exactness_passed={real['exactness']['passed']}  repeats={args.repeats}  machine={machine}")
    load_sweep(real, sim, [s.label for s in specs], out / "sweep.png")


if __name__ == "__main__":
    main()
