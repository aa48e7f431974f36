"""Per-decision latency of an exported policy: onnxruntime controller vs SB3 predict vs TorchScript.

One observation per call, the way a decoding loop asks once per round. Each runtime includes its
own normalisation (SB3: ``VecNormalize.normalize_obs`` + ``model.predict(deterministic=True)``,
as ``PPOPolicy.act`` does; exported runtimes: the manifest's statistics). Calls are interleaved
in blocks (a burst of load from another process hits every runtime alike), after a warm-up; the
median over calls is printed in microseconds, ratios to the ONNX controller first. One thread for
every runtime (torch and onnxruntime):

    python benchmarks/policy_latency.py runs/analytic            # trains nothing: give a run dir
    python benchmarks/policy_latency.py --train                  # or train a small analytic policy first
    python benchmarks/policy_latency.py --train --quick          # 1,000 calls per runtime
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench import Bench, common_flags, median, parse_args, rotations

ROOT = Path(__file__).resolve().parents[1]


def train_small(out: Path) -> Path:
    from draftrl.config import load_config
    from draftrl.train import ppo_size
    from draftrl.train.config import TrainConfig

    os.environ.setdefault("WANDB_MODE", "disabled")
    cfg = load_config(TrainConfig, ROOT / "configs" / "analytic_regimes.yaml",
                      ["total_timesteps=2048", "ppo.n_steps=64", "eval_episodes=2", "baselines=[]",
                       "progress_bar=false"])
    ppo_size.train(cfg, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[common_flags()])
    parser.add_argument("policy", nargs="?", help="run directory of draftrl train (or its policy.zip)")
    parser.add_argument("--train", action="store_true", help="train a small analytic policy to time")
    parser.add_argument("--calls", type=int, default=20000, help="timed calls per runtime")
    parser.add_argument("--block", type=int, default=200, help="calls per interleaved block")
    args = parse_args(parser, quick=dict(calls=1000, block=100))
    if not args.policy and not args.train:
        parser.error("give a run directory or --train")
    if args.threads != 1:
        parser.error(f"--threads {args.threads}: every runtime is timed on one thread (the controller's setting); "
                     "drop --threads.")
    bench = Bench(args, __file__)

    from draftrl.export.controller import PolicyController
    from draftrl.export.network import export
    from draftrl.export.torchscript import TorchScriptController
    from draftrl.policies import PPOPolicy

    with tempfile.TemporaryDirectory() as tmp:
        run = train_small(Path(tmp) / "run") if args.train else Path(args.policy)
        export(run, Path(tmp) / "policy.onnx", "onnx", check_observations=256)
        export(run, Path(tmp) / "policy.pt", "torchscript", check_observations=256)
        onnx = PolicyController(Path(tmp) / "policy.onnx", threads=1)
        script = TorchScriptController(Path(tmp) / "policy.pt")
        sb3 = PPOPolicy.load(run)

        rng = np.random.default_rng(0)
        low = np.zeros(len(onnx.feature_names), dtype=np.float32)
        observations = [(low + rng.random(len(low))).astype(np.float32) for _ in range(args.block)]
        runtimes = {"onnxruntime_controller": onnx.act, "sb3_predict": sb3.act, "torchscript": script.act}
        for act in runtimes.values():  # warm-up; and all three agree on these observations
            for obs in observations:
                act(obs)
        assert all(onnx.act(o) == sb3.act(o) == script.act(o) for o in observations), "runtimes disagree"
        times: dict[str, list[float]] = {name: [] for name in runtimes}
        for order in rotations(list(runtimes), max(1, args.calls // args.block)):
            for name in order:
                act = runtimes[name]
                for obs in observations:
                    t0 = time.perf_counter()
                    act(obs)
                    times[name].append(time.perf_counter() - t0)
    medians = {name: median(t) * 1e6 for name, t in times.items()}
    base = medians["onnxruntime_controller"]
    for name in runtimes:
        bench.row({"vs_onnx": medians[name] / base},
                  {"median_us": medians[name], "p90_us": float(np.percentile(times[name], 90) * 1e6)},
                  runtime=name, calls=len(times[name]), features=len(onnx.feature_names))
    bench.save()


if __name__ == "__main__":
    main()
