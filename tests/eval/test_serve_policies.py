"""``draftrl eval --engine vllm``'s baselines are ``draftrl.policies.Policy`` objects that read features by name."""

from __future__ import annotations

import numpy as np
import pytest

from draftrl.config.serve import ServeConfig
from draftrl.envs.serve_vllm import FEATURE_NAMES, ServeVLLMEnv
from draftrl.eval.policy_names import ENGINE_KINDS, parse_policies
from draftrl.eval.serve_policies import build_serving_policy, check_policies, proposer_rule
from draftrl.policies import DynamicSD, Policy
from serve_recordings import COST, TOKENS, synthetic_recordings


#: One name of every serving kind that needs no trained policy or vLLM proposer class.
BASELINES = ("none,fixed:4,fixed:2:8,heuristic,ngram:4,eagle3:4,class:ref_lookup.RefLookupLatest:4,dsd,dsd:1-1:8,2-16:2,"
             "head:3,sam:2:4:t0.6")


@pytest.fixture(scope="module")
def env():
    return ServeVLLMEnv(ServeConfig(max_new_tokens=TOKENS, shuffle=False, seed=0), engine="replay",
                        recordings=synthetic_recordings(4), calibration=COST)


def test_every_serving_baseline_is_a_policy(env):
    specs = parse_policies(BASELINES, engine="vllm")
    assert {s.kind for s in specs} == set(ENGINE_KINDS["vllm"]) - {"ppo"}
    for spec in specs:
        policy = build_serving_policy(spec, env)
        assert isinstance(policy, Policy) and policy.name == spec.label
        depth, budget = policy.act(env.reset(seed=0)[0])
        assert depth in env.depths and budget in env.budgets
    plays = {s.label: build_serving_policy(s, env).act(np.zeros(len(FEATURE_NAMES), np.float32)) for s in specs}
    assert plays["none"][0] == plays["ngram:4"][0] == plays["eagle3:4"][0] == 0
    assert plays["fixed:2:8"] == (2, 8) and plays["fixed:4"] == (4, max(env.budgets))
    assert plays["heuristic"] == (max(env.depths), max(env.budgets))
    assert [proposer_rule(s) for s in specs if s.kind == "heuristic"] == ["heuristic"]
    assert plays["head:3"] == (3, max(env.budgets)) and plays["sam:2:4:t0.6"] == (4, max(env.budgets))
    assert proposer_rule(specs[-1]) == "confidence:0.6"


def test_dynamic_sd_reads_the_running_batch_by_name():
    """The same table on features in another order: the policy follows the name, not the position."""
    table = ((1, 1, 8), (2, 4, 3), (5, 16, 1))
    shuffled = tuple(reversed(FEATURE_NAMES))
    for names in (FEATURE_NAMES, shuffled):
        policy = DynamicSD(ServeConfig().depths, ServeConfig().budgets, names, table=table, max_num_seqs=16)
        for running, k in ((1, 8), (3, 3), (16, 1)):
            obs = np.zeros(len(names), np.float32)
            obs[names.index("running")] = running / 16
            assert policy.act(obs) == (k, max(ServeConfig().budgets))
    with pytest.raises(ValueError, match="running"):
        DynamicSD((0, 1), (0, 8), ("waiting",), table=table)
    with pytest.raises(ValueError, match="batch size 1"):
        DynamicSD((0, 1), (0, 8), FEATURE_NAMES, table=((2, 4, 1),))


def test_a_fixed_setting_off_the_serving_grid_is_refused_before_any_engine():
    config = ServeConfig()
    check_policies(parse_policies("fixed:4:16", engine="vllm"), config)
    for bad in ("fixed:5", "fixed:4:5"):
        with pytest.raises(ValueError, match="off the serving grid"):
            check_policies(parse_policies(bad, engine="vllm"), config)


def test_eagle3_without_a_loadable_head_is_refused_before_any_engine(tmp_path, monkeypatch):
    """No ``env.head`` and no head shipped for the target, a folder without the files, a config of
    another kind: one line each, naming the fix. The shipped head is the default."""
    from draftrl.drafters import packaged
    from draftrl.drafters.eagle3 import CONFIG_FILE, WEIGHTS_FILE

    specs = parse_policies("eagle3:4", engine="vllm")
    check_policies(specs, ServeConfig())  # the head draftrl ships for smollm2-135m
    monkeypatch.setattr(packaged, "HEADS_DIR", tmp_path / "none")
    with pytest.raises(ValueError, match=r"needs an EAGLE-3 head folder; pass --head DIR \(sets env.head\).*distill"):
        check_policies(specs, ServeConfig())
    with pytest.raises(FileNotFoundError, match="no EAGLE-3 head folder"):
        check_policies(specs, ServeConfig(head=str(tmp_path)))
    (tmp_path / CONFIG_FILE).write_text('{"speculators_model_type": "medusa"}')
    (tmp_path / WEIGHTS_FILE).write_bytes(b"")
    with pytest.raises(ValueError, match="no EAGLE-3 head's config .*Eagle3Head.save_pretrained") as err:
        check_policies(specs, ServeConfig(head=str(tmp_path)))
    assert "\n" not in str(err.value)
