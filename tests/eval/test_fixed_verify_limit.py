"""``fixed:D:V`` means the same on both engines: V is the most drafted tokens one step verifies
(hf: the request's V best tree nodes in a round; vllm: the batch's V best draft positions in an
engine step, here on the replay of vLLM's proposer), and ``fixed:D`` has no limit. Each test
has its negative control: without V the same policy verifies more than V in some step, so a
limit that did nothing would fail the test."""

from __future__ import annotations

import pytest
from serve_recordings import COST, TOKENS, synthetic_recordings

from draftrl.config.serve import ServeConfig
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.eval.policy_names import parse_policies
from draftrl.eval.serve.policies import build_serving_policy


def _verified(env, policy) -> tuple[list[int], list[int]]:
    """``(num_verified of every step, the tokens emitted)`` of one episode of ``policy`` on ``env``."""
    obs, _ = env.reset(seed=0)
    verified, emitted = [], 0
    while True:
        obs, _, terminated, truncated, info = env.step(policy.to_action(*policy.act(obs)))
        verified.append(int(info["num_verified"]))
        emitted += int(info["num_emitted"])
        if terminated or truncated:
            return verified, emitted


def test_v_limits_the_drafts_one_engine_step_verifies_on_the_serving_replay():
    """vLLM's semantics without vLLM: four requests in flight at depth 4; ``fixed:4:4`` verifies at
    most 4 draft tokens over the whole batch each step (and reaches 4), ``fixed:4`` more."""
    env = ServeVLLMEnv(ServeConfig(max_new_tokens=TOKENS, shuffle=False, seed=0, concurrency=4), engine="replay",
                       recordings=synthetic_recordings(8), calibration=COST)
    runs = {name: _verified(env, build_serving_policy(parse_policies(name, engine="vllm")[-1], env))
            for name in ("fixed:4:4", "fixed:4")}
    limited, unlimited = runs["fixed:4:4"][0], runs["fixed:4"][0]
    assert max(limited) == 4
    assert max(unlimited) > 4  # the negative control: the limit binds only with V
    assert runs["fixed:4:4"][1] == runs["fixed:4"][1]  # the same tokens either way


@pytest.mark.usefixtures("one_thread")
def test_v_limits_the_drafts_one_round_verifies_on_the_hf_engine(smollm2):
    """The real engine, drafting with the target itself (every draft is accepted at temperature 0,
    so every round drafts its full depth): ``fixed:4:2`` verifies at most 2 drafted tokens a round
    (and reaches 2), ``fixed:4`` all 4; both emit plain decoding's tokens."""
    from draftrl.config.env import EnvConfig
    from draftrl.eval.round.policies import build_policy

    base = EnvConfig(drafter="self", languages=("en",), tasks=("chat",), limit_per_group=1, split="heldout",
                     max_new_tokens=12, shuffle=False, seed=0)
    runs = {}
    for name in ("none", "fixed:4:2", "fixed:4"):
        env, policy = build_policy(parse_policies(name)[-1], base, smollm2)
        runs[name] = _verified(env, policy)
    limited, unlimited = runs["fixed:4:2"][0], runs["fixed:4"][0]
    assert max(limited) == 2 and max(unlimited) == 4  # the negative control: 4 without V
    assert runs["none"][0] == [0] * len(runs["none"][0])
    assert runs["fixed:4:2"][1] == runs["fixed:4"][1] == runs["none"][1]


@pytest.mark.usefixtures("one_thread")
def test_a_policy_drafts_with_its_own_drafter_on_the_hf_engine(smollm2):
    """``fixed:4@self`` drafts with the target itself whatever the run's drafter (here n-gram
    lookup): every round but the last verifies 4 accepted drafts, where ``fixed:4`` (the run's
    n-gram drafter, which often finds no match in a chat answer) does not."""
    from draftrl.config.env import EnvConfig
    from draftrl.eval.round.policies import build_policy

    base = EnvConfig(drafter="ngram", languages=("en",), tasks=("chat",), limit_per_group=1, split="heldout",
                     max_new_tokens=12, shuffle=False, seed=0)
    runs = {}
    for name in ("fixed:4@self", "fixed:4"):
        env, policy = build_policy(parse_policies(name)[-1], base, smollm2)
        assert policy.name == name
        runs[name] = _verified(env, policy)
    assert set(runs["fixed:4@self"][0][:-1]) == {4}
    assert set(runs["fixed:4"][0][:-1]) != {4}  # the negative control: the run's drafter
    assert runs["fixed:4@self"][1] == runs["fixed:4"][1]
