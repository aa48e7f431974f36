"""Steps per second of each env on this machine, and how much faster trace replay is than the real env.

Real envs (round and per-level) run SmolLM2 + n-gram on ``configs/tiny_cpu.yaml``; the replay envs replay
traces of the same config (recorded here unless ``--traces`` is given, with a quick cost table
unless ``--cost-table`` is given); the analytic env needs no model. Each env gets a warm-up
episode, then random actions for ``--seconds`` of wall clock. One line per env, ratio first:

    python benchmarks/env_speed.py --seconds 20
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import gymnasium as gym

import draftrl.envs  # noqa: F401  registers the env ids

ROOT = Path(__file__).resolve().parents[1]


def steps_per_second(env: gym.Env, seconds: float, seed: int = 0) -> float:
    env.action_space.seed(seed)
    env.reset(seed=seed)
    done = False
    while not done:  # warm-up episode
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        done = term or trunc
    env.reset()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        steps += 1
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny_cpu.yaml"))
    parser.add_argument("--seconds", type=float, default=20.0, help="timed wall clock per env")
    parser.add_argument("--traces", default=None, help="trace directory from draftrl collect (default: record now)")
    parser.add_argument("--cost-table", default=None, help="cost table from draftrl calibrate (default: a quick one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the CPU is shared; 1 is steadier)")
    args = parser.parse_args()

    import torch

    from draftrl.config.commands import CalibrateSettings
    from draftrl.envs.calibrate import calibrate
    from draftrl.config.env import load_env_config
    from draftrl.signals.costs import hardware_info, hardware_name
    from draftrl.envs.engines import build_engine
    from draftrl.envs.traces import collect

    torch.set_num_threads(args.threads)
    config = load_env_config(args.config)
    hardware = hardware_name(hardware_info(config.device))
    work = Path(tempfile.mkdtemp(prefix="env_speed_"))
    cost_table = args.cost_table
    if cost_table is None:
        quick = CalibrateSettings(num_tokens=(1, 2, 4, 8), contexts=(128, 512), widths=(config.width,), levels=2,
                                  repeats=1)
        cost_table = str(work / "costs.json")
        calibrate(quick, dataclasses.replace(config, temperature=0.0)).save(cost_table)
    traces = args.traces
    if traces is None:
        engine, tokenizer = build_engine(config)
        traces = str(collect(config, engine, tokenizer).save(work / "traces"))

    rates = {
        "draftrl/SpecDecode-v1": steps_per_second(gym.make("draftrl/SpecDecode-v1", config=config), args.seconds),
        "draftrl/SpecDecodeDepth-v1": steps_per_second(gym.make("draftrl/SpecDecodeDepth-v1", config=config),
                                                       args.seconds),
        "draftrl/TraceReplay-v0": steps_per_second(
            gym.make("draftrl/TraceReplay-v0", traces=traces, cost_table=cost_table), args.seconds),
        "draftrl/TraceReplayDepth-v0": steps_per_second(
            gym.make("draftrl/TraceReplayDepth-v0", traces=traces, cost_table=cost_table), args.seconds),
        "draftrl/Analytic-v0": steps_per_second(gym.make("draftrl/Analytic-v0"), args.seconds),
    }
    real = rates["draftrl/SpecDecode-v1"]
    for env_id, rate in rates.items():
        print(f"vs_real={rate / real:.1f}x  steps_per_s={rate:.1f}  env={env_id}  config={Path(args.config).name}  "
              f"hardware={hardware}  threads={args.threads}")
    print(f"replay_vs_real={rates['draftrl/TraceReplay-v0'] / real:.0f}x  hardware={hardware}  threads={args.threads}")


if __name__ == "__main__":
    main()
