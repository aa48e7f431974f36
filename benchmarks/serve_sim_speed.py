"""Steps per second of ``draftrl/ServeReplay-v0`` (the simulator) vs ``draftrl/ServeVLLM-v0`` (real vLLM).

Both envs decode the same workload (the recordings' prompts, ``ServeConfig`` defaults: float32,
SmolLM2-135M) under the same random actions, interleaved: ``--repeats`` times, one real episode
and ``--sim-seconds`` of simulator episodes in a fresh random order, so load from other processes
hits both alike. Real steps are counted over whole episodes (vLLM's first step of a request is its
prefill, as in training). One line per concurrency, ratio first:

    python benchmarks/serve_sim_speed.py --recordings runs/serve/rec --calibration runs/serve/cal.json
    python benchmarks/serve_sim_speed.py --recordings ... --calibration ... --quick   # concurrency 4, 4 requests
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from _bench import Bench, common_flags, parse_args, rotate
from draftrl.replay.recordings import Recordings
from draftrl.envs.serve_replay import ServeReplayEnv
from draftrl.envs.serve_vllm import ServeVLLMEnv


def run_episodes(env, rng: np.random.Generator, seconds: float | None, seed: int) -> tuple[int, float]:
    """(steps, seconds) of whole episodes under random actions: one episode, or as many as fit in ``seconds``."""
    steps, t0 = 0, time.perf_counter()
    while True:
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, done, truncated, _ = env.step(np.array([rng.integers(len(env.depths)), rng.integers(len(env.budgets))]))
            done = done or truncated
            steps += 1
        seed += 1
        if seconds is None or time.perf_counter() - t0 >= seconds:
            return steps, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--recordings", required=True, help="draftrl collect --engine vllm --out DIR")
    parser.add_argument("--calibration", required=True, help="draftrl calibrate --engine vllm --out FILE")
    parser.add_argument("--concurrency", default="4,16")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (a real episode and the simulator)")
    parser.add_argument("--sim-seconds", type=float, default=3.0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-requests", type=int, default=None, help="requests per episode (default: all recorded)")
    args = parse_args(parser, quick=dict(concurrency="4", repeats=1, sim_seconds=1.0, max_new_tokens=16,
                                         num_requests=4))
    bench = Bench(args, __file__)
    recordings = Recordings.load(args.recordings)
    kwargs = dict(split=recordings.meta.get("config", {}).get("split", "tune"), max_new_tokens=args.max_new_tokens,
                  num_requests=args.num_requests)
    for c in (int(x) for x in args.concurrency.split(",")):
        sim = ServeReplayEnv(recordings, args.calibration, concurrency=c, **kwargs)
        real = ServeVLLMEnv(concurrency=c, **kwargs)
        run_episodes(real, np.random.default_rng(0), None, 0)  # warm-up
        rng, seeds = np.random.default_rng(1), iter(range(100, 100 + 2 * args.repeats))
        counts = rotate({"real": lambda: run_episodes(real, rng, None, next(seeds)),
                         "sim": lambda: run_episodes(sim, rng, args.sim_seconds, next(seeds))}, args.repeats)
        (real_steps, real_s), (sim_steps, sim_s) = ([sum(x) for x in zip(*counts[k])] for k in ("real", "sim"))
        real_sps, sim_sps = real_steps / real_s, sim_steps / sim_s
        bench.row({"sim_over_real": sim_sps / real_sps},
                  {"sim_steps_per_s": sim_sps, "real_steps_per_s": real_sps, "real_ms_per_step": 1e3 / real_sps,
                   "sim_us_per_step": 1e6 / sim_sps, "real_steps": real_steps, "sim_steps": sim_steps},
                  concurrency=c, repeats=args.repeats, max_new_tokens=args.max_new_tokens)
    bench.save()


if __name__ == "__main__":
    main()
