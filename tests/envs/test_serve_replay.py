"""``draftrl/ServeReplay-v1`` without vLLM: exact continuations for every policy, budget 0 = the
no-speculation schedule, the cost model's seconds, and spaces identical to ``ServeVLLM-v1``
(the engine alone: ``tests/replay/test_serve_engine.py``)."""

from __future__ import annotations

import heapq

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from serve_recordings import COST, TOKENS, synthetic_recordings

import draftrl.envs  # noqa: F401  registers the ids
from draftrl.config.serve import ServeConfig
from draftrl.envs.serve_vllm import FEATURE_NAMES, ServeVLLMEnv
from draftrl.replay.serve_calibrate import StepCostModel
from draftrl.replay.serve_engine import ReplayEngine


@pytest.fixture(scope="module")
def recordings():
    return synthetic_recordings()


def make(recordings, **kwargs):
    kwargs.setdefault("max_new_tokens", TOKENS)
    return gym.make("draftrl/ServeReplay-v1", recordings=recordings, calibration=COST, **kwargs)


def rollout(env, choose, seed=0):
    obs, _ = env.reset(seed=seed)
    infos = []
    while True:
        obs, reward, terminated, truncated, info = env.step(choose(env, obs))
        assert env.observation_space.contains(obs) and np.isfinite(reward)
        infos.append(info)
        if terminated or truncated:
            return infos


def fixed(d, b):
    return lambda env, obs: np.array([d, b])


def random_actions(seed):
    rng = np.random.default_rng(seed)
    return lambda env, obs: np.array([rng.integers(7), rng.integers(8)])


POLICIES = {**{f"depth{d}": fixed(d, 7) for d in range(7)}, "budget0": fixed(6, 0), "budget4": fixed(6, 2),
            "random": random_actions(0)}


@pytest.mark.parametrize("arrival", [{"concurrency": 1}, {"concurrency": 5}, {"concurrency": 16},
                                     {"arrival": "poisson", "rate": 20.0}, {"arrival": "burst", "burst_size": 5},
                                     {"concurrency": 12, "max_num_seqs": 4}])
@pytest.mark.parametrize("rule", ["match", "heuristic", "hindsight"])
def test_every_policy_emits_exactly_the_recorded_continuations(recordings, arrival, rule):
    env = make(recordings, rule=rule, **arrival)
    recorded = {r.prompt.id: r.token_ids for r in recordings.requests}
    for name, policy in POLICIES.items():
        infos = rollout(env, policy)
        requests = infos[-1]["requests"]
        assert len(requests) == len(recordings)
        for r in requests:
            assert r.token_ids == recorded[r.prompt_id][:TOKENS], (name, r.prompt_id)
            assert len(r.token_times) == len(r.token_ids) and r.finished
        assert sum(i["num_emitted"] for i in infos) == sum(min(len(t), TOKENS) for t in recorded.values())


@pytest.mark.parametrize("concurrency", [1, 5])
def test_hindsight_drafts_only_what_is_accepted_and_no_less(recordings, concurrency):
    """The ceiling of per-request depth control: no rejected draft is ever verified, and each step
    still gains what the n-gram drafter's full proposal would have (so the same steps, cheaper)."""
    results = {}
    for rule in ("match", "hindsight"):
        infos = rollout(make(recordings, rule=rule, concurrency=concurrency, cost_noise=False), fixed(6, 7))
        results[rule] = ([i["num_emitted"] for i in infos], sum(i["num_verified"] for i in infos),
                         sum(i["num_accepted"] for i in infos), sum(i["seconds"] for i in infos),
                         [r for i in infos for r in i["request_steps"]])
    match, hind = results["match"], results["hindsight"]
    assert hind[0] == match[0]  # the same tokens in every step
    assert hind[2] == match[2] and hind[1] < match[1]  # as many accepted, fewer verified
    # every draft accepted, except past a request's limit in its last step (verified, not emitted)
    assert all(r.num_accepted == r.num_verified for r in hind[4] if not r.finished)
    assert any(r.num_accepted < r.num_verified for r in match[4] if not r.finished)
    assert hind[3] < match[3]


def plain_steps(lengths: list[int], concurrency: int) -> int:
    """Steps of decoding without speculation: each request holds a slot for one step per token."""
    free = [0] * concurrency
    end = 0
    for length in lengths:
        start = heapq.heappop(free)
        end = max(end, start + length)
        heapq.heappush(free, start + length)
    return end


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_budget_zero_reproduces_the_no_speculation_schedule(recordings, concurrency):
    env = make(recordings, concurrency=concurrency, shuffle=False)
    lengths = [min(len(r.token_ids), TOKENS) for r in recordings.requests]
    plain = rollout(env, fixed(0, 0))
    assert len(plain) == plain_steps(lengths, concurrency)
    for depth in range(1, 7):
        infos = rollout(env, fixed(depth, 0))
        assert [i["num_emitted"] for i in infos] == [i["num_emitted"] for i in plain]
        assert [i["seconds"] for i in infos] == [i["seconds"] for i in plain]  # the same seed: the same noise
        assert all(i["num_verified"] == 0 and i["num_proposed"] == 0 for i in infos)
    drafting = rollout(env, fixed(6, 7))
    assert len(drafting) < len(plain)  # and speculation does shorten it on these requests



def test_spaces_and_features_are_serve_vllms(recordings):
    replay = make(recordings).unwrapped
    real = ServeVLLMEnv(ServeConfig(), engine=ReplayEngine(recordings, COST), tokenizer=object())
    assert replay.action_space == real.action_space and replay.observation_space == real.observation_space
    assert replay.feature_names == real.feature_names == FEATURE_NAMES
    assert (replay.depths, replay.budgets, replay.action_lag) == (real.depths, real.budgets, real.action_lag) == \
        ((0, 1, 2, 3, 4, 6, 8), (0, 2, 4, 8, 16, 32, 64, 128), 1)
    check_env(make(recordings, concurrency=4).unwrapped, skip_render_check=True)


def test_step_seconds_follow_the_cost_model_with_jitter_and_noise(recordings):
    env = make(recordings, concurrency=4, cost_noise=False).unwrapped
    infos = rollout(env, fixed(4, 7))
    running = [i["decoding"] for i in infos]
    assert all(s >= COST.base + COST.per_seq * b for s, b in zip([i["seconds"] for i in infos], running))
    assert infos[-1]["clock"] == pytest.approx(sum(i["seconds"] for i in infos))
    jittered = make(recordings, concurrency=4, cost_jitter=0.3).unwrapped
    factors = []
    for seed in range(200):
        jittered.reset(seed=seed)
        factors += [jittered.engine.cost.jitter_fixed, jittered.engine.cost.jitter_token]
    assert np.mean(factors) == pytest.approx(1.0, abs=0.06) and np.std(np.log(factors)) == pytest.approx(0.3, rel=0.15)
    a, b = rollout(jittered, fixed(4, 7), seed=3), rollout(jittered, fixed(4, 7), seed=3)
    assert [i["seconds"] for i in a] == [i["seconds"] for i in b]  # deterministic given the seed


def test_a_prefill_step_is_charged_per_prompt_token(recordings):
    cost = StepCostModel(base=0.03, per_seq=0.002, per_token=0.0005, per_prefill_token=0.0001)
    env = gym.make("draftrl/ServeReplay-v1", recordings=recordings, calibration=cost, max_new_tokens=TOKENS,
                   concurrency=3, shuffle=False, cost_noise=False).unwrapped
    infos = rollout(env, fixed(4, 7))
    prompts = [len(r.prompt_ids) for r in recordings.requests]
    assert infos[0]["seconds"] == pytest.approx(0.03 + 0.002 * 3 + 0.0001 * sum(prompts[:3]))
    # every prompt is charged once, in the step that admits it, on top of the decode cost
    free = gym.make("draftrl/ServeReplay-v1", recordings=recordings, calibration=COST, max_new_tokens=TOKENS,
                    concurrency=3, shuffle=False, cost_noise=False).unwrapped
    plain = rollout(free, fixed(4, 7))
    assert [i["num_emitted"] for i in plain] == [i["num_emitted"] for i in infos]
    extra = [a["seconds"] - b["seconds"] for a, b in zip(infos, plain)]
    assert sum(extra) == pytest.approx(0.0001 * sum(prompts))
    assert min(extra) > -1e-12 and sum(e > 1e-12 for e in extra) > 1


def test_errors_name_the_fix(recordings):
    with pytest.raises(ValueError, match="temperature"):
        make(recordings, temperature=0.7)
    with pytest.raises(ValueError, match="calibrate --engine vllm"):
        gym.make("draftrl/ServeReplay-v1", recordings=recordings, calibration="/nonexistent.json")



def test_loads_are_drawn_per_episode_and_the_lookahead_acts_in_the_grid(recordings):
    loads = [{"concurrency": 1}, {"arrival": "poisson", "rate": 50.0}, {"concurrency": 8}]
    env = make(recordings, loads=loads).unwrapped
    seen = {}
    for seed in range(12):
        _, info = env.reset(seed=seed)
        seen[(info["load"]["arrival"], info["load"]["concurrency"], info["load"]["rate"])] = True
        if info["load"]["concurrency"] == 8 and info["load"]["arrival"] == "fixed":
            env.step(np.array([0, 0]))
            assert env.engine.request_counts()[0] == 8
    assert len(seen) == 3
    with pytest.raises(ValueError, match="loads may set only"):
        make(recordings, loads=[{"max_num_seqs": 4}])
    env.reset(seed=0)
    before = [(r.generated, r.history.last_proposed) for r in env.engine.running]
    action = env.lookahead_action()
    assert env.action_space.contains(action)
    assert [(r.generated, r.history.last_proposed) for r in env.engine.running] == before  # explored on copies
