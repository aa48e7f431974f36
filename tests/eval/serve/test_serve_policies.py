"""``draftrl eval --engine vllm``'s baselines are ``draftrl.policies.Policy`` objects that read features by name."""

from __future__ import annotations

import numpy as np
import pytest
from serve_recordings import COST, TOKENS, synthetic_recordings

from draftrl.config.serve import ServeConfig
from draftrl.envs.serve_vllm import FEATURE_NAMES, ServeVLLMEnv
from draftrl.eval.policy_names import ENGINE_KINDS, parse_policies
from draftrl.eval.serve.policies import build_serving_policy, check_policies, proposer_rule
from draftrl.policies import DynamicSD, Policy

#: One name of every serving kind that needs no trained policy or vLLM proposer class.
BASELINES = ("none,fixed:4,fixed:2:8,heuristic,vllm-ngram:4,vllm-eagle3:4,vllm-class:ref_lookup.RefLookupLatest:4,dsd,"
             "dsd:1-1:8,2-16:2,fixed:3@eagle3,stop:4:t0.6@sam:2")


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
    assert plays["none"][0] == plays["vllm-ngram:4"][0] == plays["vllm-eagle3:4"][0] == 0
    assert plays["fixed:2:8"] == (2, 8) and plays["fixed:4"] == (4, max(env.budgets))
    assert plays["heuristic"] == (max(env.depths), max(env.budgets))
    assert [proposer_rule(s) for s in specs if s.kind == "heuristic"] == ["heuristic"]
    assert plays["fixed:3@eagle3"] == (3, max(env.budgets)) and plays["stop:4:t0.6@sam:2"] == (4, max(env.budgets))
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
    """No head in the drafter and none shipped for the target, a folder without the files, a config of
    another kind: one line each, naming the fix, for vLLM's own EAGLE-3 and the head in draftrl's
    proposer alike. The shipped head is the default."""
    from draftrl.drafters import packaged
    from draftrl.drafters.eagle3 import CONFIG_FILE, WEIGHTS_FILE

    for names in ("vllm-eagle3:4", "fixed:4@eagle3", "stop:4:t0.6@sam:2"):
        specs = parse_policies(names, engine="vllm")
        check_policies(specs, ServeConfig())  # the head draftrl ships for smollm2-135m
    monkeypatch.setattr(packaged, "HEADS_DIR", tmp_path / "none")
    for names in ("vllm-eagle3:4", "fixed:4@eagle3"):
        with pytest.raises(ValueError, match=r"needs an EAGLE-3 head folder; name one with @eagle3:DIR or --drafter "
                                             r"eagle3:DIR \(sets env.drafter\).*distill"):
            check_policies(parse_policies(names, engine="vllm"), ServeConfig())
    specs = parse_policies("vllm-eagle3:4", engine="vllm")
    with pytest.raises(FileNotFoundError, match="no EAGLE-3 head folder"):
        check_policies(specs, ServeConfig(drafter=f"eagle3:{tmp_path}"))
    (tmp_path / CONFIG_FILE).write_text('{"speculators_model_type": "medusa"}')
    (tmp_path / WEIGHTS_FILE).write_bytes(b"")
    for names, config in (("vllm-eagle3:4", ServeConfig(drafter=f"sam:2:{tmp_path}")),
                          (f"fixed:2@eagle3:{tmp_path}", ServeConfig())):
        with pytest.raises(ValueError, match="no EAGLE-3 head's config .*Eagle3Head.save_pretrained") as err:
            check_policies(parse_policies(names, engine="vllm"), config)
        assert "\n" not in str(err.value)


def test_a_drafter_vllms_proposer_cannot_run_or_a_head_rule_without_a_head_is_refused():
    """Drafters that need the target in-process (layerskip, self, a draft model) cannot run inside
    vLLM's proposer; ``stop`` and ``:bB`` read a head, so they need an ``eagle3`` or ``sam`` drafter;
    ``env.drafter`` refuses the first kind itself. One line each, naming the fix."""
    for names, why in (("fixed:4@layerskip:8", "'layerskip:8', which vLLM's proposer cannot run"),
                       ("heuristic@self", "'self', which vLLM's proposer cannot run"),
                       ("stop:4:t0.6", r"stops on its head's confidence, but its drafter 'ngram:1:3:latest' "
                                       r"runs no head; draft with one: stop:4:t0.6@eagle3\[:DIR\]"),
                       ("fixed:4:b1@ngram:1:3",
                        r"limits its head to small steps \(:bB\), but its drafter 'ngram:1:3'")):
        with pytest.raises(ValueError, match=why) as err:
            check_policies(parse_policies(names, engine="vllm"), ServeConfig())
        assert "\n" not in str(err.value)
    check_policies(parse_policies("stop:4:t0.6,fixed:4:b1", engine="vllm"), ServeConfig(drafter="eagle3"))
    for bad in ("layerskip:8", "none", "self", "smollm2-135m"):
        with pytest.raises(ValueError, match=f"env.drafter={bad!r} cannot run inside vLLM's proposer"):
            ServeConfig(drafter=bad)


def test_the_earlier_head_key_is_refused_naming_the_drafter():
    from draftrl.config.serve import load_serve_config

    for make in (lambda: load_serve_config(None, ["env.head=runs/head"]),
                 lambda: ServeVLLMEnv({"head": "runs/head"}, engine="replay", recordings=synthetic_recordings(2),
                                      calibration=COST)):
        with pytest.raises(ValueError, match=r"env.head is gone|head is gone") as err:
            make()
        assert "drafter: eagle3:DIR" in str(err.value) and "\n" not in str(err.value)


def test_the_serving_env_builds_its_engine_with_the_configs_drafter(monkeypatch):
    """``ServeVLLM-v1`` without an engine builds vLLM with draftrl's proposer drafting with
    ``config.drafter`` (a head one runs the head proposer), not always n-gram lookup."""
    from draftrl.envs.serve_vllm import ServeVLLMEnv

    seen = []

    class Built(Exception):
        pass

    def shared_engine(config, *args, **kwargs):
        seen.append(config)
        raise Built

    monkeypatch.setattr("draftrl.decoding.vllm.engine.shared_engine", shared_engine)
    for drafter in ("ngram:1:3:latest", "sam:2"):
        with pytest.raises(Built):
            ServeVLLMEnv(ServeConfig(drafter=drafter))
    assert [(c.method, c.drafter, c.runs_head) for c in seen] == [("draftrl", "ngram:1:3:latest", False),
                                                                  ("draftrl", "sam:2", True)]
