"""Grid-search vLLM's Dynamic SD table (K per batch-size range) in the serving replay.

Every table of depths over the batch-size ranges (K never growing with the batch, by default) runs
on ``draftrl/ServeReplay-v1`` with the tuning split's recordings and the calibrated step cost, at
each load; the score is the geometric mean of its throughput over no speculation's. A tool, not a
benchmark: it tunes a baseline. Prints the best tables, ratios first, and writes
``OUT/dsd_grid.json`` (``best``: the policy spec to pass as the Dynamic SD baseline, e.g. to
``benchmarks/serve_compare.py --dsd``); an ``OUT`` holding an earlier grid is refused unless ``--overwrite``.

    python tools/serve_dsd_grid.py --recordings runs/serve/rec_tune --calibration runs/serve/vllm_costs.json \\
        --out runs/serve/dsd_grid
"""

from __future__ import annotations

import argparse
import os
import time

from draftrl.config.serve import load_serve_config
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.eval.serve.dsd_search import search_dsd
from draftrl.io import prepare_out, write_json
from draftrl.replay.recordings import Proposals, Recordings
from draftrl.replay.serve_calibrate import StepCostModel


def parse_loads(text: str) -> list[dict]:
    """``c1,c4,r2`` -> fixed concurrency 1 and 4, Poisson 2 requests/s."""
    loads = []
    for item in text.split(","):
        kind, value = item[:1], item[1:]
        if kind == "c" and value.isdigit():
            loads.append({"arrival": "fixed", "concurrency": int(value)})
        elif kind == "r":
            loads.append({"arrival": "poisson", "rate": float(value)})
        else:
            raise ValueError(f"load {item!r} must look like cN (fixed concurrency) or rX (Poisson rate), "
                             "e.g. c1,c16,r2")
    return loads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recordings", required=True, help="tuning-split recordings (draftrl collect --engine vllm)")
    p.add_argument("--calibration", required=True, help="draftrl calibrate --engine vllm --out FILE")
    p.add_argument("--loads", default="c1,c4,c16,r1,r4", help="cN: fixed concurrency N; rX: Poisson X requests/s")
    p.add_argument("--ranges", default="1-1,2-4,5-8,9-16", help="batch-size ranges, each gets one K")
    p.add_argument("--ks", default="0,1,2,3,4,6,8")
    p.add_argument("--any-order", action="store_true", help="also tables whose K grows with the batch")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="env.KEY=VALUE, a ServeConfig field")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace an earlier dsd_grid.json in --out")
    args = p.parse_args()
    try:
        out = prepare_out(args.out, ("dsd_grid.json",), overwrite=args.overwrite, command="tools/serve_dsd_grid.py")
    except ValueError as err:
        p.error(str(err))
    recordings = Recordings.load(args.recordings)
    config = load_serve_config(None, args.overrides, split=recordings.requests[0].prompt.split, shuffle=False,
                               seed=0)
    cost = StepCostModel.from_calibration(args.calibration)
    proposals = Proposals(recordings, config.max_depth)
    ranges = tuple(tuple(int(x) for x in r.split("-")) for r in args.ranges.split(","))
    t0 = time.perf_counter()
    scored = search_dsd(lambda cfg, spec: ServeVLLMEnv(cfg, engine="replay", recordings=recordings, calibration=cost,
                                                     proposals=proposals), config,
                        parse_loads(args.loads), ranges=ranges, ks=tuple(int(k) for k in args.ks.split(",")),
                        monotone=not args.any_order)
    seconds = time.perf_counter() - t0
    best = scored[0]
    constant = [r for r in scored if len({t[2] for t in r["table"]}) == 1]
    for r in scored[: args.top] + constant[:1]:
        per_load = "  ".join(f"{k}:{v:.2f}x" for k, v in r["speedups"].items())
        print(f"geomean={r['score']:.3f}x  {per_load}  {r['label']}")
    print(f"best={best['label']}  geomean={best['score']:.3f}x  best_constant={constant[0]['label']} "
          f"{constant[0]['score']:.3f}x  tables={len(scored)}  seconds={seconds:.0f}  "
          f"load1={os.getloadavg()[0]:.2f}  (replay, {args.recordings})")
    write_json(out / "dsd_grid.json", {"best": best["label"], "loads": args.loads, "ranges": args.ranges,
                                                  "calibration": args.calibration, "recordings": args.recordings,
                                                  "seconds": seconds, "tables": scored})


if __name__ == "__main__":
    main()
