"""ChoiceSchedule: a per-round (drafter, depth) chooser driving the real engine sees what it saw in training
(TraceChoice-v0 over traces of the same drafters), and a chooser that never drafts is plain decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from choice_traces import costs
from tiny_eagle3 import WordTokenizer, tiny_pair

from draftrl.config.env import EnvConfig
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.drafters.mixed import MixedDrafter
from draftrl.drafters.ngram import NgramDrafter
from draftrl.envs.trace_choice import TraceChoiceEnv
from draftrl.policies.choice import ChoiceSchedule
from draftrl.replay.traces import collect

BUDGET = 14
DEPTHS = (1, 2, 3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.manual_seed(0)
    target, head = tiny_pair()
    prompts = tmp_path_factory.mktemp("choice") / "p.jsonl"
    prompts.write_text('{"id": "x", "language": "en", "task": "chat", "split": "tune", "prompt": '
                       '"to be or not to be that is the question to be or not", "max_new_tokens": 14}\n')
    config = EnvConfig(prompts=str(prompts), split="tune", languages=("en",), tasks=("chat",),
                       max_new_tokens=BUDGET, depths=(0,) + DEPTHS, chat_template=False, ignore_eos=True)
    traces = {}
    with torch.inference_mode():
        for name, drafter in (("ngram", NgramDrafter(1, 3, first="latest")), ("eagle3", Eagle3Drafter(head, target))):
            engine = SpeculativeDecoder(target, drafter, EngineConfig(max_new_tokens=BUDGET, max_depth=8))
            traces[name] = collect(config, engine, WordTokenizer())
    env = TraceChoiceEnv(traces, DEPTHS, cost_tables={"ngram": costs(1e-4), "eagle3": costs(4e-3)}, seed=0)
    mixed = MixedDrafter(NgramDrafter(1, 3, first="latest"), Eagle3Drafter(head, target), 2)
    engine = SpeculativeDecoder(target, mixed, EngineConfig(max_new_tokens=BUDGET, max_depth=3))
    return env, engine, mixed, traces["ngram"].prompt_tokens.tolist(), target


def run_engine(engine, mixed, env, prompt, choose):
    schedule = ChoiceSchedule(mixed, env.arms, choose)
    schedule.start(BUDGET)
    with torch.inference_mode():
        result = generate(engine, prompt, schedule, on_round=schedule.on_round)
    return result, schedule


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_shows_the_chooser_the_observations_of_the_trace_env(setup, seed):
    env, engine, mixed, prompt, _ = setup
    arms = np.random.default_rng(seed).integers(0, len(env.arms), size=64).tolist()
    seen_engine, seen_env = [], []

    def chooser(seen):
        it = iter(arms)

        def choose(obs):
            seen.append(obs.copy())
            return next(it)
        return choose

    result, schedule = run_engine(engine, mixed, env, prompt, chooser(seen_engine))
    choose = chooser(seen_env)
    obs, _ = env.reset(options={"prompt_index": 0})
    emitted, done = [], False
    while not done:
        obs, _, done, _, info = env.step(choose(obs))
        emitted.append(info["num_emitted"])
    assert [r.num_emitted for r in result.rounds] == emitted
    assert len(seen_engine) == len(seen_env)
    np.testing.assert_allclose(np.stack(seen_engine), np.stack(seen_env), rtol=1e-4, atol=1e-5)
    # each round drafted with the arm's drafter: the mixed drafter reports which
    checked = set()
    for rnd, (name, depth) in zip(result.rounds, schedule.played):
        if name != "none" and rnd.depth > 0 and rnd.num_proposed:
            assert rnd.draft_features.get("drafter_lookup") == float(name == "ngram")
            checked.add(name)
    assert checked == {"ngram", "eagle3"}


def test_a_chooser_that_never_drafts_is_plain_decoding(setup):
    env, engine, mixed, prompt, target = setup
    result, _ = run_engine(engine, mixed, env, prompt, lambda obs: 0)
    plain = SpeculativeDecoder(target, None, EngineConfig(max_new_tokens=BUDGET))
    with torch.inference_mode():
        reference = generate(plain, prompt, fixed_schedule(0))
    assert result.token_ids == reference.token_ids
    assert all(r.depth == 0 and r.num_proposed == 0 and r.num_emitted == 1 for r in result.rounds)


def test_arms_of_other_drafters_are_refused(setup):
    env, _, mixed, _, _ = setup
    with pytest.raises(ValueError, match="arms name drafters"):
        ChoiceSchedule(mixed, [("none", 0), ("layerskip", 2)], lambda obs: 0)
