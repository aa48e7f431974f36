"""The round replay engine (``draftrl.replay.round_engine.TraceRoundEngine``) without models: it is a
``RoundEngine`` as the live engine is, the env takes either by one keyword, a prompt recorded twice
replays its one continuation, and what it cannot replay is refused naming the fix (the env over it,
against the live engine: ``tests/envs/test_spec_decode_replay.py``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from choice_traces import costs, synthetic

from draftrl.config.env import EnvConfig
from draftrl.decoding.interface import RoundEngine
from draftrl.envs.spec_decode import SpecDecodeEnv
from draftrl.envs.spec_decode_depth import SpecDecodeDepthEnv
from draftrl.replay.round_engine import TraceRoundEngine

CONFIG = EnvConfig(depths=(0, 1, 2, 4), width=1, temperature=0.0, drafter="ngram", max_new_tokens_cap=16)


def engine(traces=None, **changes) -> TraceRoundEngine:
    return TraceRoundEngine(traces or synthetic(3, 1), dataclasses.replace(CONFIG, **changes), costs(1e-4))


def test_the_replay_is_a_round_engine_the_envs_take_by_one_keyword():
    replay = engine()
    assert isinstance(replay, RoundEngine) and not isinstance(object(), RoundEngine)
    assert not replay.samples and replay.drafts_levels
    env = SpecDecodeEnv(CONFIG, engine=replay)  # a prebuilt replay needs no tokenizer: it brings its workload
    obs, info = env.reset(seed=0)
    assert info["sampling_seed"] is None and info["prefill_seconds"] == 0.0
    assert env.observation_space.contains(obs) and callable(env.lookahead_action)
    made = SpecDecodeEnv(CONFIG, engine="replay", traces=synthetic(3, 1), cost_table=costs(1e-4))
    assert made.reset(seed=0)[0].tolist() == obs.tolist()
    depth = SpecDecodeDepthEnv(CONFIG, engine="replay", traces=synthetic(3, 1), cost_table=costs(1e-4))
    assert callable(depth.lookahead_action)
    with_sizes = SpecDecodeDepthEnv(CONFIG, engine="replay", traces=synthetic(3, 1), cost_table=costs(1e-4),
                                    size_policy=lambda obs, tree: 0)
    assert with_sizes.lookahead_action is None  # no fixed size to find the best depth for


def test_levels_replay_the_recorded_tree_and_charge_the_table():
    replay = engine()
    workload = replay.workload(CONFIG)
    request = workload.request(0)
    replay.config.max_new_tokens = request.max_new_tokens
    replay.start(request.prompt_ids, rng=np.random.default_rng(0))
    builder = replay.begin_levels(1)
    grown = 0
    while builder.step():
        grown += 1
        assert builder.step_seconds == costs(1e-4).draft_level(1)  # no noise configured
        assert builder.level_features()["level"] == grown and len(builder.tree) == grown  # a chain
    assert builder.step_seconds == 0.0  # nothing past the recorded levels, nothing charged
    rnd = replay.round_from_tree(builder.tree, None, draft_seconds=0.5, depth=grown, width=1)
    assert rnd.draft_seconds == 0.5 + costs(1e-4).draft_base_seconds and rnd.num_proposed == grown


def test_a_prompt_recorded_twice_replays_its_longer_recording():
    traces = synthetic(3, 1)
    first = traces.prompt_tokens[: traces.cu_num_prompt_tokens[1]].copy()
    twice = dataclasses.replace(traces, prompt_tokens=np.concatenate(
        [first, first, traces.prompt_tokens[traces.cu_num_prompt_tokens[2]:]]))
    with pytest.raises(ValueError, match="same tokens but different greedy continuations"):
        engine(twice)  # prompts 0 and 1 now share tokens but not their continuations
    cont = traces.continuation.copy()
    a, b = traces.cu_num_positions[:2]
    c = traces.cu_num_positions[1]
    cont[c:c + (b - a)] = cont[a:b]  # prompt 1 continues like prompt 0 (and further): one greedy continuation
    agreeing = engine(dataclasses.replace(twice, continuation=cont))
    workload = agreeing.workload(CONFIG)
    request = workload.request(0)
    agreeing.config.max_new_tokens = request.max_new_tokens
    agreeing.start(request.prompt_ids, rng=np.random.default_rng(0))
    emitted = []
    while not agreeing.finished:
        emitted += agreeing.round(0).tokens
    assert emitted == cont[a:b].tolist()  # the longer recording, cut at prompt 0's budget


def test_what_cannot_be_replayed_is_refused():
    with pytest.raises(ValueError, match="engine='vllm' is unknown"):
        SpecDecodeEnv(CONFIG, engine="vllm")
    with pytest.raises(ValueError, match="pass engine='replay'"):
        SpecDecodeEnv(CONFIG, traces=synthetic(3, 1))
    with pytest.raises(ValueError, match="pass traces=DIR"):
        SpecDecodeEnv(CONFIG, engine="replay")
    with pytest.raises(ValueError, match="need a drafter"):
        engine(drafter="none")
    with pytest.raises(ValueError, match="built for another EnvConfig"):
        SpecDecodeEnv(dataclasses.replace(CONFIG, cost_noise=0.1), engine=engine())
    with pytest.raises(ValueError, match="not among the 3 recorded"):
        engine().start([99, 98], rng=np.random.default_rng(0))
