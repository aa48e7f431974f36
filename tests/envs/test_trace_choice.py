"""TraceChoice-v0: the round table's rounds through the gymnasium API, and PPO learning from them."""

from __future__ import annotations

import numpy as np
import pytest
from choice_traces import costs, synthetic
from gymnasium.utils.env_checker import check_env

from draftrl.envs.trace_choice import TraceChoiceEnv
from draftrl.eval.round.headroom import headroom
from draftrl.train.choice import play_choice, train_choice

DEPTHS = (1, 2, 4)


def make_env(seed: int = 1, lengths=(7, 9, 5), head_base: float | None = None) -> TraceChoiceEnv:
    traces = {"ngram": synthetic(seed, 1, lengths), "eagle3": synthetic(seed + 1, 2, lengths)}
    tables = {"ngram": costs(1e-4), "eagle3": costs(4e-3, head_base)}
    return TraceChoiceEnv(traces, DEPTHS, cost_tables=tables, seed=0)


def test_passes_the_gymnasium_checker():
    env = make_env()
    check_env(env, skip_render_check=True)
    assert env.arms[0] == ("none", 0) and len(env.feature_names) == env.observation_space.shape[0]


def test_always_none_is_no_speculation_exactly():
    env = make_env()
    room = headroom(env.table)
    seconds = play_choice(env, lambda obs: 0)
    # no speculation's seconds, plus reading both drafters' signals in every round (what the policy observes)
    watched = [len(tok) * env.table.watched_seconds(0) for tok in env.table.tokens]
    assert env.table.watched_seconds(0) > 0
    assert seconds == pytest.approx(np.add(room.schedules["none:0"], watched), rel=1e-12)
    obs, _ = env.reset(options={"prompt_index": 1})
    rounds = 0
    done = False
    while not done:
        obs, _, done, _, info = env.step(0)
        assert info["num_emitted"] == 1 and info["drafter"] == "none"
        rounds += 1
    assert rounds == len(env.table.tokens[1])


def test_every_arm_and_the_hindsight_schedule_replay_their_seconds():
    env = make_env()
    room = headroom(env.table)
    def watched(name):  # the other drafters' features() time in every round the schedule played
        return [sum(env.table.watched_seconds(a) for a in arms) for arms in room.played[name]]

    for a, (drafter, depth) in enumerate(env.arms):
        name = f"fixed:{drafter}:{depth}"
        assert play_choice(env, lambda obs, a=a: a) == pytest.approx(np.add(room.schedules[name], watched(name)))
    plans = iter([list(arms) for arms in room.played["hindsight"]])
    plan: list[int] = []

    def follow(obs):
        nonlocal plan
        if not plan:
            plan = next(plans)
        return plan.pop(0)

    assert play_choice(env, follow) == pytest.approx(np.add(room.schedules["hindsight"], watched("hindsight")))


def test_bad_actions_and_prompts_are_refused():
    env = make_env()
    env.reset()
    with pytest.raises(ValueError, match="outside"):
        env.step(len(env.arms))
    with pytest.raises(ValueError, match="prompt_index"):
        env.reset(options={"prompt_index": 99})


def test_ppo_learns_to_draft_where_the_signal_says_drafts_pass():
    """The n-gram match feature is each round's true acceptance: PPO must beat no speculation and the
    best fixed arm on prompts it never saw (a policy ignoring the observation cannot beat the latter), though
    it pays for reading the head's signals in every round (cheap here: the test is about learning)."""
    train = lambda: make_env(seed=1, lengths=(12, 15, 10, 14), head_base=1e-4)  # noqa: E731
    held = make_env(seed=7, lengths=(11, 13, 9, 16), head_base=1e-4)
    policy = train_choice(train, total_timesteps=12_000, seed=0, n_envs=4)
    seconds = sum(play_choice(held, policy.act))
    room = headroom(held.table)
    assert seconds < room.total("none:0")
    assert seconds < room.total(room.best_fixed())
    assert np.isfinite(seconds)
