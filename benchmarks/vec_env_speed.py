"""Replay training with ``ppo.vec_env: subproc`` against ``dummy``: env steps per second and PPO wall time.

``draftrl/TraceReplay-v1`` on traces of ``--config`` (recorded here unless ``--traces``; a quick cost
table unless ``--cost-table``), made by draftrl's own ``make_vec_env`` for every ``--n-envs``: in this
process (``dummy``: SB3's DummyVecEnv) or one process per env (``subproc``: SB3's SubprocVecEnv) with
each start method of ``--start-methods`` (draftrl uses ``forkserver``). For every repeat the arms run
in a fresh random order; each arm starts its envs (``start_s``: processes, imports, traces loaded,
the first reset), steps them with random actions for ``--seconds`` (``steps_per_s``: env steps, all
envs together), then trains a fresh PPO (``draftrl.train.ppo_size.new_ppo``, ``cfg.ppo``) for
``--timesteps`` (``ppo_s``: rollouts and updates; the start not included). Medians over repeats;
ratios against ``dummy`` at the same ``n_envs``. One env is made in this process first, as the recipes
do; the forkserver's own start (once per process) is in its first arm's ``start_s`` only.

    python benchmarks/vec_env_speed.py --quick
    python benchmarks/vec_env_speed.py --n-envs 2,4 --repeats 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import Bench, common_flags, median, parse_args, replay_files, rotate

ROOT = Path(__file__).resolve().parents[1]


def arm(cfg, start_method: str | None, seconds: float, timesteps: int) -> dict[str, float]:
    """One arm once: start the envs, step them for ``seconds``, then train a fresh PPO for ``timesteps``."""
    from draftrl.train import envs as train_envs
    from draftrl.train.ppo_size import new_ppo

    if start_method is not None:
        train_envs.START_METHOD = start_method
    t0 = time.perf_counter()
    venv = train_envs.make_vec_env(cfg, cfg.env, cfg.seed)
    venv.reset()
    start_s = time.perf_counter() - t0
    venv.action_space.seed(cfg.seed)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        venv.step(np.stack([venv.action_space.sample() for _ in range(venv.num_envs)]))
        steps += venv.num_envs
    steps_per_s = steps / (time.perf_counter() - t0)
    model = new_ppo(cfg, venv)
    t0 = time.perf_counter()
    model.learn(total_timesteps=timesteps)
    ppo_s = time.perf_counter() - t0
    venv.close()
    return {"start_s": start_s, "steps_per_s": steps_per_s, "ppo_s": ppo_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[common_flags()])
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny_cpu.yaml"))
    parser.add_argument("--traces", default=None, help="trace directory from draftrl collect (default: record now)")
    parser.add_argument("--cost-table", default=None, help="cost table from draftrl calibrate (default: a quick one)")
    parser.add_argument("--n-envs", default="2,4", help="comma-separated ppo.n_envs values")
    parser.add_argument("--start-methods", default="forkserver,spawn,fork",
                        help="SubprocVecEnv start methods, each an arm (draftrl's is forkserver)")
    parser.add_argument("--seconds", type=float, default=4.0, help="random-action stepping per arm and repeat")
    parser.add_argument("--timesteps", type=int, default=4096, help="PPO timesteps per arm and repeat")
    parser.add_argument("--n-steps", type=int, default=256, help="ppo.n_steps (rollout length per env)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per arm")
    args = parse_args(parser, quick=dict(n_envs="2", start_methods="forkserver", seconds=1.0, timesteps=512,
                                         n_steps=64, repeats=1))
    bench = Bench(args, __file__)

    from draftrl.config import load_config
    from draftrl.config.env import load_env_config
    from draftrl.train.config import TrainConfig

    traces, cost_table = replay_files(load_env_config(args.config), Path(tempfile.mkdtemp(prefix="vec_env_speed_")),
                                      args.traces, args.cost_table)
    methods = [m for m in args.start_methods.split(",") if m]
    from draftrl.train.envs import make_env

    probe = load_config(TrainConfig, args.config, ["env.id=draftrl/TraceReplay-v1", f"env.traces={traces}",
                                                   f"env.cost_table={cost_table}"])
    make_env(probe.env).close()  # as the recipes do before their training envs (what forkserver preloads)
    arms = {}
    for n in (int(v) for v in args.n_envs.split(",")):
        for vec, method in [("dummy", None), *(("subproc", m) for m in methods)]:
            cfg = load_config(TrainConfig, args.config, [
                "env.id=draftrl/TraceReplay-v1", f"env.traces={traces}", f"env.cost_table={cost_table}",
                f"ppo.n_envs={n}", f"ppo.vec_env={vec}", f"ppo.n_steps={args.n_steps}", "ppo.batch_size=64",
                f"threads={args.threads or 1}"])
            arms[(n, vec, method)] = (lambda cfg=cfg, method=method:
                                      arm(cfg, method, args.seconds, args.timesteps))
    results = rotate(arms, args.repeats)
    where = dict(env="draftrl/TraceReplay-v1", config=Path(args.config).name, seconds=args.seconds,
                 timesteps=args.timesteps, n_steps=args.n_steps, repeats=args.repeats)
    for (n, vec, method), runs in results.items():
        values = {key: median([r[key] for r in runs]) for key in ("steps_per_s", "ppo_s", "start_s")}
        base = {key: median([r[key] for r in results[(n, "dummy", None)]]) for key in ("steps_per_s", "ppo_s")}
        bench.row({"steps_vs_dummy": values["steps_per_s"] / base["steps_per_s"],
                   "ppo_speed_vs_dummy": base["ppo_s"] / values["ppo_s"]}, values,
                  n_envs=n, vec_env=vec, start_method=method or "-", **where)
    bench.save()


if __name__ == "__main__":
    main()
