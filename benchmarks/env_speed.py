"""Steps per second of each env on this machine, and how much faster trace replay is than the real env.

Real envs (round and per-level) run SmolLM2 + n-gram on ``configs/tiny_cpu.yaml``; the replay envs replay
traces of the same config (recorded here unless ``--traces`` is given, with a quick cost table
unless ``--cost-table`` is given); the analytic env needs no model. Each env gets a warm-up
episode, then random actions for ``--seconds`` of wall clock in all, cut into ``--repeats`` slices
that rotate over the envs in a fresh random order (load from other processes hits every env
alike); an env's rate is the median over its slices. One line per env, ratio first.

At ``--temperature`` (default 0.7; 0 skips it) the live round env and the replay run again over traces
of that temperature (``--continuations`` sampled continuations per prompt, recorded here unless
``--sampled-traces`` is given), interleaved with the rest: the replay at T > 0 walks one recorded
continuation per request (exact in law), so it should keep the greedy replay's speed.

    python benchmarks/env_speed.py --seconds 20
    python benchmarks/env_speed.py --quick            # 1 s per env
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import gymnasium as gym
from _bench import Bench, common_flags, median, parse_args, replay_files, rotate

import draftrl.envs  # noqa: F401  registers the env ids

ROOT = Path(__file__).resolve().parents[1]


def warm_up(env: gym.Env, seed: int = 0) -> gym.Env:
    """One whole episode of random actions (untimed), then a reset."""
    env.action_space.seed(seed)
    env.reset(seed=seed)
    done = False
    while not done:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        done = term or trunc
    env.reset()
    return env


def steps_per_second(env: gym.Env, seconds: float) -> float:
    """Random actions for ``seconds`` of wall clock (episodes reset as they end); steps per second."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        steps += 1
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny_cpu.yaml"))
    parser.add_argument("--seconds", type=float, default=20.0, help="timed wall clock per env, over all slices")
    parser.add_argument("--repeats", type=int, default=4, help="interleaved slices per env")
    parser.add_argument("--traces", default=None, help="trace directory from draftrl collect (default: record now)")
    parser.add_argument("--cost-table", default=None, help="cost table from draftrl calibrate (default: a quick one)")
    parser.add_argument("--temperature", type=float, default=0.7, help="also time live and replay at this "
                        "temperature (0: skip)")
    parser.add_argument("--continuations", type=int, default=4, help="sampled continuations per prompt recorded for "
                        "--temperature")
    parser.add_argument("--sampled-traces", default=None, help="trace directory of --temperature (default: record now)")
    args = parse_args(parser, quick=dict(seconds=1.0, repeats=2))
    bench = Bench(args, __file__)

    from draftrl.config.env import load_env_config
    from draftrl.decoding.build import build_engine
    from draftrl.replay.traces import collect

    config = load_env_config(args.config)
    work = Path(tempfile.mkdtemp(prefix="env_speed_"))
    traces, cost_table = replay_files(config, work, args.traces, args.cost_table)

    live, replay = "draftrl/SpecDecode-v2", "draftrl/TraceReplay-v1"
    kwargs = {live: dict(config=config), "draftrl/SpecDecodeDepth-v2": dict(config=config),
              replay: dict(traces=traces, cost_table=cost_table),
              "draftrl/TraceReplayDepth-v1": dict(traces=traces, cost_table=cost_table), "draftrl/Analytic-v0": {}}
    sampled = f"T{args.temperature:g}"
    if args.temperature > 0:
        hot = dataclasses.replace(config, temperature=args.temperature)
        hot_traces = args.sampled_traces
        if hot_traces is None:
            engine, tokenizer = build_engine(hot)
            hot_traces = str(collect(hot, engine, tokenizer, num_continuations=args.continuations)
                             .save(work / "traces_sampled"))
        kwargs[f"{live}@{sampled}"] = dict(config=hot)
        kwargs[f"{replay}@{sampled}"] = dict(traces=hot_traces, cost_table=cost_table)
    envs = {env_id: warm_up(gym.make(env_id.split("@")[0], **kw)) for env_id, kw in kwargs.items()}
    slices = rotate({env_id: (lambda env=env: steps_per_second(env, args.seconds / args.repeats))
                     for env_id, env in envs.items()}, args.repeats)
    rates = {env_id: median(values) for env_id, values in slices.items()}
    real = rates[live]
    where = dict(config=Path(args.config).name, seconds=args.seconds, repeats=args.repeats)
    for env_id, rate in rates.items():
        bench.row({"vs_real": rate / real}, {"steps_per_s": rate}, env=env_id, **where)
    bench.row({"replay_vs_real": rates[replay] / real}, **where)
    if args.temperature > 0:
        bench.row({f"replay_vs_real_{sampled}": rates[f"{replay}@{sampled}"] / rates[f"{live}@{sampled}"]},
                  {"replay_steps_per_s": rates[f"{replay}@{sampled}"], "real_steps_per_s": rates[f"{live}@{sampled}"]},
                  temperature=args.temperature, continuations=args.continuations, **where)
    bench.save()


if __name__ == "__main__":
    main()
