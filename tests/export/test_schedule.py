"""An exported policy driving draftrl's own engine (``draftrl generate --policy``): the features
are the training env's, and greedy output is the target's own greedy output."""

from __future__ import annotations

import json

import numpy as np
import pytest

from draftrl.cli import main
from draftrl.decoding.build import build_engine
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.envs.spec_decode import SpecDecodeEnv
from draftrl.export.controller import PolicyController
from draftrl.export.schedule import PolicySchedule

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):"


class ScriptedController:
    """A controller with a real manifest that plays a fixed cycle of depths and records what it saw."""

    def __init__(self, controller: PolicyController, depths: list[int]):
        self.inner, self.script, self.seen = controller, depths, []
        for name in ("kind", "manifest", "feature_names", "width", "depths", "verify_sizes", "path"):
            setattr(self, name, getattr(controller, name))

    def act(self, obs: np.ndarray) -> tuple[int, int]:
        self.seen.append(np.array(obs))
        return self.script[(len(self.seen) - 1) % len(self.script)], 0


def test_schedule_builds_the_training_envs_observations(shared_target, replay_config, replay_exports):
    """Same actions, same engine state: PolicySchedule's observations equal SpecDecode-v2's
    (the measured-cost features aside, which follow each run's own timings)."""
    config = replay_config
    script = [4, 0, 2, 1, 4, 4]
    env_engine, tokenizer = build_engine(config, shared_target)
    env = SpecDecodeEnv(config, engine=env_engine, tokenizer=tokenizer, monitor=False)
    obs, info = env.reset(options={"prompt_index": 0})
    env_obs, done = [], False
    while not done:
        env_obs.append(obs)
        depth = script[(len(env_obs) - 1) % len(script)]
        obs, _, done, _, _ = env.step(np.array([config.depths.index(depth), 0]))

    controller = ScriptedController(PolicyController(replay_exports["onnx"]), script)
    engine, _ = build_engine(config, shared_target)
    engine.config.max_new_tokens = info["max_new_tokens"]
    schedule = PolicySchedule(controller)
    result = schedule.generate(engine, env.request.prompt_ids)
    assert result.token_ids == env_engine.output_ids
    assert len(controller.seen) == len(env_obs)
    names = list(env.feature_names)
    assert names == list(controller.feature_names)
    compared = [i for i, n in enumerate(names) if not n.startswith(("verify_cost", "draft_cost"))]
    np.testing.assert_array_equal(np.stack(controller.seen)[:, compared], np.stack(env_obs)[:, compared])
    costs = [i for i, n in enumerate(names) if n.startswith("verify_cost")]
    assert np.all(np.stack(controller.seen)[:, costs] > 0)
    assert sum(schedule.depth_histogram.values()) == len(env_obs)


def test_trained_policy_keeps_greedy_output(shared_target, replay_config, replay_exports):
    config = replay_config
    tokenizer = shared_target.tokenizer
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    engine, _ = build_engine(config, shared_target)
    engine.config.max_new_tokens = 32
    plain = generate(engine, ids, fixed_schedule(0)).token_ids
    schedule = PolicySchedule(PolicyController(replay_exports["onnx"]))
    result = schedule.generate(engine, ids)
    assert result.token_ids == plain
    scripted = ScriptedController(PolicyController(replay_exports["onnx"]), [4, 2, 4, 1])
    result = PolicySchedule(scripted).generate(engine, ids)
    assert result.token_ids == plain
    assert result.mean_tokens_per_round > 1.0  # the scripted depths did speculate and get accepted


def test_generate_cli_with_policy_matches_plain_decoding(replay_exports, capsys):
    common = ["generate", "--prompt", PROMPT, "--max-new-tokens", "24", "--json", "--no-monitor"]
    assert main(common + ["--depth", "0"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(common + ["--policy", str(replay_exports["onnx"])]) == 0
    captured = capsys.readouterr()
    with_policy = json.loads(captured.out.strip().splitlines()[-1])
    assert with_policy["token_ids"] == plain["token_ids"]
    assert sum(with_policy["policy_depth_histogram"].values()) == with_policy["rounds"]
    assert with_policy["settings"]["policy"] == str(replay_exports["onnx"])
    assert "warning" not in captured.err  # trained with the n-gram drafter, decoding with it


def test_engine_driving_refuses_analytic_policies(analytic_exports, capsys):
    with pytest.raises(ValueError, match="cannot drive an engine"):
        PolicySchedule(PolicyController(analytic_exports["onnx"]))
    assert main(["generate", "--prompt", "x", "--policy", str(analytic_exports["onnx"])]) == 2
    assert "cannot drive an engine" in capsys.readouterr().err
