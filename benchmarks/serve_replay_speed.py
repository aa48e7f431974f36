"""Steps per second of ``draftrl/ServeReplay-v1`` (the replay) vs ``draftrl/ServeVLLM-v1`` (real vLLM).

Both envs decode the same workload (the recordings' prompts, ``ServeConfig`` defaults: float32,
SmolLM2-135M) under the same random actions, interleaved: ``--repeats`` times, one real episode
and ``--replay-seconds`` of replay episodes in a fresh random order, so load from other processes
hits both alike. Real steps are counted over whole episodes (vLLM's first step of a request is its
prefill, as in training). One line per concurrency, ratio first:

    python benchmarks/serve_replay_speed.py --recordings runs/serve/rec --calibration runs/serve/cal.json
    python benchmarks/serve_replay_speed.py --recordings ... --calibration ... --quick   # concurrency 4, 4 requests
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _bench import Bench, common_flags, parse_args, rotate

from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.replay.recordings import Recordings


def run_episodes(env, rng: np.random.Generator, seconds: float | None, seed: int) -> tuple[int, float]:
    """(steps, seconds) of whole episodes under random actions: one episode, or as many as fit in ``seconds``."""
    steps, t0 = 0, time.perf_counter()
    while True:
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, done, truncated, _ = env.step(np.array([rng.integers(len(env.depths)),
                                                          rng.integers(len(env.budgets))]))
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
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (a real episode and the replay)")
    parser.add_argument("--replay-seconds", type=float, default=3.0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-requests", type=int, default=None, help="requests per episode (default: all recorded)")
    args = parse_args(parser, quick=dict(concurrency="4", repeats=1, replay_seconds=1.0, max_new_tokens=16,
                                         num_requests=4))
    bench = Bench(args, __file__)
    recordings = Recordings.load(args.recordings)
    kwargs = dict(split=recordings.meta.get("config", {}).get("split", "tune"), max_new_tokens=args.max_new_tokens,
                  num_requests=args.num_requests)
    for c in (int(x) for x in args.concurrency.split(",")):
        replay = ServeVLLMEnv(engine="replay", recordings=recordings, calibration=args.calibration, concurrency=c,
                              **kwargs)
        real = ServeVLLMEnv(concurrency=c, **kwargs)
        run_episodes(real, np.random.default_rng(0), None, 0)  # warm-up
        rng, seeds = np.random.default_rng(1), iter(range(100, 100 + 2 * args.repeats))
        counts = rotate({"real": lambda: run_episodes(real, rng, None, next(seeds)),
                         "replay": lambda: run_episodes(replay, rng, args.replay_seconds, next(seeds))}, args.repeats)
        (real_steps, real_s), (replay_steps, replay_s) = ([sum(x) for x in zip(*counts[k])] for k in ("real", "replay"))
        real_sps, replay_sps = real_steps / real_s, replay_steps / replay_s
        bench.row({"replay_over_real": replay_sps / real_sps},
                  {"replay_steps_per_s": replay_sps, "real_steps_per_s": real_sps, "real_ms_per_step": 1e3 / real_sps,
                   "replay_us_per_step": 1e6 / replay_sps, "real_steps": real_steps, "replay_steps": replay_steps},
                  concurrency=c, repeats=args.repeats, max_new_tokens=args.max_new_tokens)
    bench.save()


if __name__ == "__main__":
    main()
