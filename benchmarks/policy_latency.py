"""Per-decision latency of an exported policy: onnxruntime controller vs SB3 predict vs TorchScript.

One observation per call, the way a decoding loop asks once per round. Each runtime includes its
own normalisation (SB3: ``VecNormalize.normalize_obs`` + ``model.predict(deterministic=True)``,
as ``PPOPolicy.act`` does; exported runtimes: the manifest's statistics). Calls are interleaved
in blocks (a burst of load from another process hits every runtime alike), after a warm-up; the
median over calls is printed in microseconds, ratios to the ONNX controller first. One thread for
every runtime (torch and onnxruntime):

    python benchmarks/policy_latency.py runs/analytic            # trains nothing: give a run dir
    python benchmarks/policy_latency.py --train                  # or train a small analytic policy first
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def train_small(out: Path) -> Path:
    from draftrl.config import load_config
    from draftrl.train import ppo_size
    from draftrl.train.config import TrainConfig

    os.environ.setdefault("WANDB_MODE", "disabled")
    cfg = load_config(TrainConfig, ROOT / "configs" / "analytic_regimes.yaml",
                      ["total_timesteps=2048", "ppo.n_steps=64", "eval_episodes=2", "baselines=[]", "progress_bar=false"])
    ppo_size.train(cfg, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", nargs="?", help="run directory of draftrl train (or its policy.zip)")
    parser.add_argument("--train", action="store_true", help="train a small analytic policy to time")
    parser.add_argument("--calls", type=int, default=20000, help="timed calls per runtime")
    parser.add_argument("--block", type=int, default=200, help="calls per interleaved block")
    args = parser.parse_args()
    if not args.policy and not args.train:
        parser.error("give a run directory or --train")
    torch.set_num_threads(1)

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
        order = list(runtimes)
        for _ in range(max(1, args.calls // args.block)):
            random.shuffle(order)
            for name in order:
                act = runtimes[name]
                for obs in observations:
                    t0 = time.perf_counter()
                    act(obs)
                    times[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    base = median["onnxruntime_controller"]
    for name in runtimes:
        print(f"vs_onnx={median[name] / base:.2f}x  median_us={median[name]:.1f}  "
              f"p90_us={np.percentile(times[name], 90) * 1e6:.1f}  runtime={name}  calls={len(times[name])}  "
              f"features={len(onnx.feature_names)}  cpu={platform.processor() or platform.machine()}  threads=1")


if __name__ == "__main__":
    main()
