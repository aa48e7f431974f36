"""One policy across a temperature mix (issue 45 item 3), CleanRL-style: ``draftrl train`` (``ppo_size``)
runs a few hundred steps of ``configs/mix_cpu.yaml`` on ``draftrl/TraceReplay-v1`` over model-free traces
built here, and its evaluation reports the mix and each class.

The model-free traces here are greedy, so the mix here differs in top-k (T0 and T0:k20: the same
greedy continuations, different request features); the file's own mix (0, 0.7, 1.0) needs traces that
hold its sampled classes (draftrl collect with the mix) and greedy ones are refused naming the first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cost_tables import synthetic_table

from draftrl.config import load_config
from draftrl.train import ppo_size
from draftrl.train.config import TrainConfig
from draftrl.train.evaluation import format_table

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "mix_cpu.yaml"
GREEDY_MIX = "[{temperature: 0, weight: 1}, {temperature: 0, top_k: 20, weight: 1}]"


def traces(directory: Path) -> Path:
    """Four recorded-looking prompts of 24 positions: each position drafts a chain that follows the
    continuation for a random number of levels (0..4), then strays; the draft features vary."""
    from draftrl.prompts import Prompt
    from draftrl.replay.traces import Traces

    rng = np.random.default_rng(0)
    length, num_prompts = 24, 4
    prompts, cont, cu_pos, prompt_tokens, cu_prompt = [], [], [0], [], [0]
    for p in range(num_prompts):
        prompts.append(Prompt(f"en-chat-{p:03d}", "en", "chat", "tune", "hi", length))
        cont += rng.integers(10, 30, length).tolist()
        cu_pos.append(len(cont))
        prompt_tokens += rng.integers(1, 9, 3 + p).tolist()
        cu_prompt.append(len(prompt_tokens))
    tokens, parents, depths, scores, cu_nodes = [], [], [], [], [0]
    for p in range(num_prompts):
        for i in range(cu_pos[p], cu_pos[p + 1]):
            follow = int(rng.integers(0, 5))
            for level in range(1, 5):
                right = i + level - 1 < cu_pos[p + 1] and level <= follow
                tokens.append(cont[i + level - 1] if right else 99)
                parents.append(level - 2), depths.append(level), scores.append(-0.3 * level)
                if not right:
                    break
            cu_nodes.append(len(tokens))
    n = len(cont)
    features = np.column_stack([rng.uniform(0, 1, n), rng.uniform(0, 3, n), rng.integers(0, 5, n),
                                rng.integers(0, 7, n)]).astype(np.float64)
    recorded = Traces(
        prompts=prompts, budgets=[length] * num_prompts, stop_reasons=["length"] * num_prompts,
        prompt_tokens=np.array(prompt_tokens), cu_num_prompt_tokens=np.array(cu_prompt),
        continuation=np.array(cont), cu_num_positions=np.array(cu_pos), draft_features=features,
        cu_num_nodes=np.array(cu_nodes), node_tokens=np.array(tokens), node_parents=np.array(parents),
        node_depths=np.array(depths), node_scores=np.array(scores), max_depth=4, width=1,
        meta={"config": {}, "target": "smollm2-135m", "drafter": "ngram"},
    )
    return recorded.save(directory, cost_table=synthetic_table())


def mix_config(trace_dir: Path, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, CONFIG, [
        f"env.traces={trace_dir}", f"env.eval.traces={trace_dir}", "env.depths=[0,1,2,4]", "env.max_new_tokens=null",
        *overrides])


def test_one_policy_trains_and_is_judged_on_a_mix(tmp_path, monkeypatch):
    from draftrl.policies.ppo import PPOPolicy, read_policy_manifest
    from draftrl.signals.features import feature_names
    from draftrl.train.envs import make_env

    monkeypatch.setenv("WANDB_MODE", "disabled")
    trace_dir = traces(tmp_path / "traces")
    cfg = mix_config(trace_dir, f"env.temperature_mix={GREEDY_MIX}", "total_timesteps=384", "ppo.n_envs=1",
                     "ppo.n_steps=128", "ppo.batch_size=64", "ppo.n_epochs=1", "eval_episodes=8",
                     "baselines=[heuristic]", "progress_bar=false", "checkpoint_every=384")
    assert cfg.env.id == "draftrl/TraceReplay-v1" and cfg.env.mixed
    summary = ppo_size.train(cfg, tmp_path / "run")

    manifest = read_policy_manifest(tmp_path / "run" / "policy.json")
    assert manifest["env_id"] == "draftrl/TraceReplay-v1" and manifest["feature_names"] == list(feature_names(4))
    evaluation = summary["evaluation"]
    split = evaluation["per_sampling"]
    assert set(split) == {"T0", "T0:k20"} and sum(part["episodes"] for part in split.values()) == 8
    fixed = [name for name in evaluation["table"] if name.startswith("fixed")]
    for part in split.values():
        assert part["best_fixed"] in fixed and part["table"][part["best_fixed"]]["ratio_to_best_fixed"] == 1.0
        assert set(part["table"]) == set(evaluation["table"]) and part["table"]["ppo"]["throughput"] > 0
    table = format_table(evaluation)
    assert "sampling=T0:k20" in table and "sampling=T0  " in table

    env = make_env(cfg.env, evaluation=True)  # the saved policy acts per class: reset(options={"sampling": ...})
    policy = PPOPolicy.load(tmp_path / "run", env)
    for label in ("T0", "T0:k20"):
        obs, info = env.reset(seed=0, options={"sampling": label})
        assert info["sampling_class"] == label
        depth, _ = policy.act(obs)
        assert depth in cfg.env.depths


def test_a_per_temperature_policy_is_a_single_class(tmp_path):
    """Dropping the mix (one class) is a per-temperature env: no draw, no per-class split."""
    from draftrl.train.envs import make_env

    cfg = mix_config(traces(tmp_path / "traces"), "env.temperature_mix=null")
    env = make_env(cfg.env)
    _, info = env.reset(seed=0)
    assert not cfg.env.mixed and info["sampling_class"] == "T0"


def test_the_files_own_mix_waits_for_sampled_traces(tmp_path):
    from draftrl.train.envs import make_env

    cfg = mix_config(traces(tmp_path / "traces"))
    assert [c.label for c in cfg.env.sampling_classes] == ["T0", "T0.7", "T1"]
    with pytest.raises(ValueError, match=r"asks for sampling T0\.7 but the traces hold T0; record it"):
        make_env(cfg.env)
