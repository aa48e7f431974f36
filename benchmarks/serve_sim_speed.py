"""Steps per second of ``draftrl/ServeReplay-v0`` (the simulator) vs ``draftrl/ServeVLLM-v0`` (real vLLM).

Both envs decode the same workload (the recordings' prompts, ``ServeConfig`` defaults: float32,
SmolLM2-135M) under the same random actions, interleaved: ``--rounds`` times, one real episode
then ``--sim-seconds`` of simulator episodes, so load from other processes hits both alike.
Real steps are counted over whole episodes (vLLM's first step of a request is its prefill, as in
training). One line per concurrency, ratio first:

    python benchmarks/serve_sim_speed.py --recordings runs/serve/rec --calibration runs/serve/cal.json
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from draftrl.decoding.replay import Recordings
from draftrl.envs.serve_replay import ServeReplayEnv
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.signals.costs import hardware_info, hardware_name


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", required=True, help="draftrl collect --engine vllm --out DIR")
    parser.add_argument("--calibration", required=True, help="draftrl calibrate --engine vllm --out FILE")
    parser.add_argument("--concurrency", default="4,16")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (a real episode, then the simulator)")
    parser.add_argument("--sim-seconds", type=float, default=3.0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-requests", type=int, default=None, help="requests per episode (default: all recorded)")
    args = parser.parse_args()
    recordings = Recordings.load(args.recordings)
    kwargs = dict(split=recordings.meta.get("config", {}).get("split", "tune"), max_new_tokens=args.max_new_tokens,
                  num_requests=args.num_requests)
    for c in (int(x) for x in args.concurrency.split(",")):
        sim = ServeReplayEnv(recordings, args.calibration, concurrency=c, **kwargs)
        real = ServeVLLMEnv(concurrency=c, **kwargs)
        run_episodes(real, np.random.default_rng(0), None, 0)  # warm-up
        counts = {"real": [0, 0.0], "sim": [0, 0.0]}
        rng = np.random.default_rng(1)
        for r in range(args.rounds):
            for name, env, seconds in (("real", real, None), ("sim", sim, args.sim_seconds)):
                n, s = run_episodes(env, rng, seconds, 100 + r)
                counts[name][0] += n
                counts[name][1] += s
        real_sps, sim_sps = (counts[k][0] / counts[k][1] for k in ("real", "sim"))
        load = os.getloadavg()[0]
        print(f"sim_over_real={sim_sps / real_sps:.0f}x  sim_steps_per_s={sim_sps:.0f}  real_steps_per_s={real_sps:.2f}  "
              f"real_ms_per_step={1e3 / real_sps:.1f}  sim_us_per_step={1e6 / sim_sps:.1f}  concurrency={c}  "
              f"steps real/sim={counts['real'][0]}/{counts['sim'][0]}  load1={load:.2f} on {os.cpu_count()} cpus  "
              f"machine={hardware_name(hardware_info())}")


if __name__ == "__main__":
    main()
