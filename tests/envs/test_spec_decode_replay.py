"""TraceReplay-v1 against the real engine, plus ``draftrl collect`` / ``draftrl calibrate``.

The central test: for the same action sequence at temperature 0, the real SpecDecode-v2 (real
SmolLM2, n-gram drafter) and the replay emit identical tokens every round, and see identical
observations apart from the measured-cost features; the replay steps >= 100x faster.
"""

from __future__ import annotations

import copy
import json
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import draftrl.envs  # noqa: F401  registers the env ids (gymnasium.register_envs idiom)
from draftrl.cli import main
from draftrl.config.env import EnvConfig
from draftrl.decoding.build import build_engine
from draftrl.envs.spec_decode import SpecDecodeEnv
from draftrl.envs.spec_decode_depth import SpecDecodeDepthEnv
from draftrl.replay.traces import Traces, collect
from draftrl.signals.costs import CostTable
from draftrl.signals.features import TARGET_FEATURES

WORKLOAD = dict(languages=("en",), tasks=("code_edit",), limit_per_group=2, max_new_tokens=20, depths=(0, 1, 2, 4))
ROUND_KEYS = ("token_ids", "num_emitted", "num_accepted", "num_proposed", "num_verified", "verified_depth",
              "stop_reason", "token_stats", "depth", "verify_size")


def table() -> CostTable:
    return CostTable(
        num_tokens=[1, 2, 4, 8, 16], context_lens=[64, 512],
        verify_seconds=[[0.02, 0.021, 0.024, 0.03, 0.045], [0.025, 0.026, 0.03, 0.037, 0.055]],
        draft_widths=[1, 2, 4], draft_level_seconds=[1e-4, 1.5e-4, 2e-4], draft_base_seconds=2e-4,
        sample_base_seconds=1e-3, sample_token_seconds=2e-4, noise=0.05,
    )


@pytest.fixture(scope="module", params=[1, 2], ids=["chain", "tree"])
def recorded(request, shared_smollm2, tmp_path_factory):
    """(config, engine, tokenizer, trace dir) for width 1 (chain) and width 2 (trees, V in {all, 1, 3})."""
    import torch

    torch.set_num_threads(1)
    width = request.param
    config = EnvConfig(**WORKLOAD, width=width, verify_sizes=(0,) if width == 1 else (0, 1, 3), seed=0)
    engine, tokenizer = build_engine(config, shared_smollm2)
    directory = tmp_path_factory.mktemp(f"traces_w{width}")
    collect(config, engine, tokenizer).save(directory)
    table().save(directory / "cost_table.json")
    return config, engine, tokenizer, directory


def test_real_and_replay_agree_round_by_round(recorded):
    config, engine, tokenizer, directory = recorded
    real = SpecDecodeEnv(config, engine=engine, tokenizer=tokenizer, monitor=False)
    replay = SpecDecodeEnv(engine="replay", traces=directory)
    assert replay.feature_names == real.feature_names  # one env class: the engine changes nothing a policy sees
    assert (replay.observation_space, replay.action_space) == (real.observation_space, real.action_space)
    compared = [i for i, name in enumerate(real.feature_names)
                if not name.startswith(("verify_cost", "draft_cost")) and name not in TARGET_FEATURES]
    # the target's signals: the live verification forward's rows vs the recorded teacher-forced forward's, equal
    # up to float32 summation order
    close = [i for i, name in enumerate(real.feature_names) if name in TARGET_FEATURES]
    rng = np.random.default_rng(7)
    real_seconds, rounds, num_tokens = 0.0, 0, 0
    for prompt in replay.workload.prompts:
        obs_real, info_real = real.reset(options={"prompt_id": prompt.id})
        obs_replay, info_replay = replay.reset(options={"prompt_id": prompt.id})
        assert info_real["num_prompt_tokens"] == info_replay["num_prompt_tokens"]
        np.testing.assert_array_equal(obs_real[compared], obs_replay[compared])
        np.testing.assert_allclose(obs_real[close], obs_replay[close], rtol=1e-4, atol=1e-6)
        done = False
        while not done:
            action = rng.integers(real.action_space.nvec)
            t0 = time.perf_counter()
            obs_real, _, done_real, _, info_real = real.step(action)
            real_seconds += time.perf_counter() - t0
            obs_replay, _, done, _, info_replay = replay.step(action)
            for key in ROUND_KEYS:
                assert info_real[key] == info_replay[key], (prompt.id, rounds, key, action)
            assert done_real == done
            np.testing.assert_array_equal(obs_real[compared], obs_replay[compared])
            np.testing.assert_allclose(obs_real[close], obs_replay[close], rtol=1e-4, atol=1e-6)
            rounds += 1
            num_tokens += info_real["num_emitted"]
    assert num_tokens == 40 and rounds < num_tokens  # n-gram drafts got accepted somewhere

    replay.reset(seed=0)
    t0, steps = time.perf_counter(), 0
    while steps < 2000:
        _, _, done, _, _ = replay.step(replay.action_space.sample())
        steps += 1
        if done:
            replay.reset()
    replay_rate = steps / (time.perf_counter() - t0)
    real_rate = rounds / real_seconds
    assert replay_rate >= 100 * real_rate, f"replay {replay_rate:.0f} steps/s vs real {real_rate:.1f} steps/s"


def test_replay_passes_the_checkers(recorded):
    *_, directory = recorded
    env = gym.make("draftrl/TraceReplay-v1", traces=str(directory), cost_noise=0.1)
    gym_check_env(env.unwrapped)
    sb3_check_env(env.unwrapped)


def test_replay_is_reproducible_from_the_seed(recorded):
    *_, directory = recorded

    def episode(seed):
        env = SpecDecodeEnv(engine="replay", traces=directory, cost_noise=0.1, reward="throughput")
        env.action_space.seed(0)
        _, info = env.reset(seed=seed)
        rewards, done = [], False
        while not done:
            _, reward, done, _, _ = env.step(env.action_space.sample())
            rewards.append(reward)
        return info["prompt_id"], rewards

    assert episode(3) == episode(3)
    assert episode(3)[1] != episode(4)[1]


def test_replay_seconds_come_from_the_cost_table(recorded):
    *_, directory = recorded
    env = SpecDecodeEnv(engine="replay", traces=directory)
    _, info = env.reset(seed=0)
    _, _, _, _, step = env.step(np.array([env.depths.index(2), 0]))
    t = table()
    ctx = info["num_prompt_tokens"] - 1
    assert step["verify_seconds"] == pytest.approx(t.verify(1 + step["num_verified"], ctx))
    assert step["draft_seconds"] == pytest.approx(t.draft(2, env.config.width))
    assert step["sample_seconds"] == pytest.approx(t.sample(step["num_emitted"]))


def test_cost_jitter_moves_costs_per_episode_never_tokens(recorded):
    """Each episode plays another machine: the verify growth and draft seconds move, the plain
    step and every token stay; the cost features follow, so a policy can learn to read them."""
    *_, directory = recorded
    t = table()

    def episode(env, seed):
        """(verify growth factor, draft factor, tokens, cost features) of the first round that verified drafts."""
        _, info = env.reset(seed=seed)
        ctx, tokens = info["num_prompt_tokens"] - 1, []
        while True:
            _, _, done, _, step = env.step(np.array([env.depths.index(2), 0]))
            tokens += list(step["token_ids"])
            if step["num_verified"] > 0 or done:
                break
            ctx += step["num_emitted"]
        assert step["num_verified"] > 0, "no round drafted anything"
        one = t.verify(1, ctx)
        growth = (step["verify_seconds"] - one) / (t.verify(1 + step["num_verified"], ctx) - one)
        return growth, step["draft_seconds"] / t.draft(2, env.config.width), tokens, env.features.costs.features()

    plain = SpecDecodeEnv(engine="replay", traces=directory)
    jittered = SpecDecodeEnv(engine="replay", traces=directory, cost_jitter=0.3)
    base = episode(plain, 0)
    assert base[:2] == pytest.approx((1.0, 1.0))
    runs = [episode(jittered, seed) for seed in range(40)]
    growths, scales = np.array([r[0] for r in runs]), np.array([r[1] for r in runs])
    assert all(r[2] == episode(plain, seed)[2] for seed, r in enumerate(runs))
    # mean-one lognormal(0.3): log-factors have sd 0.3, so 40 draws put it well inside 0.15..0.5
    assert 0.15 < np.log(growths).std() < 0.5 and 0.15 < np.log(scales).std() < 0.5
    assert abs(np.log(growths).mean() + 0.045) < 4 * 0.3 / np.sqrt(40)
    assert len({round(r[3][-1], 9) for r in runs}) > 30  # draft_cost_level differs between episodes
    with pytest.raises(ValueError, match="cost_jitter"):
        SpecDecodeEnv(engine="replay", traces=directory, cost_jitter=-0.1)


@pytest.mark.parametrize("reward", ["ratio", "throughput"])
def test_lookahead_action_is_the_best_round_in_hindsight(recorded, reward):
    """From the same state, no action of the grid gets a better round reward than the lookahead's;
    and it is not a constant: it changes its choice along the episode."""
    *_, directory = recorded
    env = SpecDecodeEnv(engine="replay", traces=directory, depths=(0, 1, 2, 4), cost_jitter=0.3, reward=reward)
    env.reset(seed=5)
    actions = [np.array([i, j]) for i in range(len(env.depths)) for j in range(len(env.verify_sizes))]
    chosen, done = [], False
    while not done and len(chosen) < 12:
        best = env.lookahead_action()
        rewards = [copy.deepcopy(env).step(a)[1] for a in actions]
        lookahead_reward = copy.deepcopy(env).step(best)[1]
        assert lookahead_reward >= max(rewards) - 1e-9 * abs(max(rewards))
        chosen.append(env.depths[best[0]])
        _, _, done, _, _ = env.step(best)
    assert len(set(chosen)) > 1, chosen


def test_lookahead_baseline_runs_on_replay_envs(recorded):
    from draftrl.policies import LookAhead

    *_, directory = recorded
    for env in (SpecDecodeEnv(engine="replay", traces=directory, depths=(0, 1, 2, 4)),
                SpecDecodeDepthEnv(engine="replay", traces=directory, depths=(0, 1, 2, 4))):
        policy = LookAhead.for_env(env)
        obs, _ = env.reset(seed=0)
        done = False
        while not done:
            action = policy.act_step(obs) if isinstance(env, SpecDecodeDepthEnv) else policy.to_action(*policy.act(obs))
            obs, _, done, _, _ = env.step(np.asarray(action, dtype=np.int64))
    with pytest.raises(TypeError, match="lookahead_action"):  # sizes chosen at STOP: no fixed size to plan for
        LookAhead.for_env(SpecDecodeDepthEnv(engine="replay", traces=directory, size_policy=lambda obs, tree: 0))


def test_policy_evaluation_visits_every_recorded_prompt(recorded):
    """evaluate_policy visits the prompts in turn: with shuffle off, per-episode seeds alone
    would restart the env's order and make every episode the first prompt."""
    from draftrl.policies import Fixed, evaluate_policy

    *_, directory = recorded
    seen: list[str] = []

    class Prompts(gym.Wrapper):
        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            seen.append(info["prompt_id"])
            return obs, info

    env = Prompts(SpecDecodeEnv(engine="replay", traces=directory, shuffle=False))
    n = len(env.unwrapped.workload.prompts)
    assert n >= 2
    result = evaluate_policy(Fixed.for_env(env, depth=2), env, episodes=2 * n, seed=3)
    assert seen == [p.id for p in env.unwrapped.workload.prompts] * 2
    assert len(set(result["episode_tokens"])) > 1 or len(set(result["episode_seconds"])) > 1


def test_policy_evaluation_skips_draft_steps_and_takes_the_callers_prompt(recorded):
    """On a step-level env the one loop hands ``on_round`` verified rounds only (the env also takes
    draft steps, counted here through a wrapper: the control that there were steps to skip), and
    ``options`` picks the request instead of the loop's own prompt order."""
    from draftrl.policies import Fixed, evaluate_policy

    *_, directory = recorded
    steps = []

    class Steps(gym.Wrapper):
        def step(self, action):
            out = self.env.step(action)
            steps.append("num_emitted" in out[4])
            return out

    env = Steps(SpecDecodeDepthEnv(engine="replay", traces=directory, depths=(0, 1, 2, 4)))
    last = env.unwrapped.workload.prompts[-1].id
    resets, rounds = [], []
    res = evaluate_policy(Fixed.for_env(env, depth=2), env, episodes=1, seed=0, options={"prompt_id": last},
                          on_reset=lambda info: resets.append(info["prompt_id"]), on_round=rounds.append)
    assert resets == [last]
    assert steps.count(False) > 0 and len(rounds) == steps.count(True) == res["num_rounds"]
    assert all("num_emitted" in info for info in rounds)


def test_traces_roundtrip(recorded):
    config, *_, directory = recorded
    traces = Traces.load(directory)
    assert traces.config == config
    assert traces.max_depth == 4 and traces.width == config.width and len(traces) == 2
    assert traces.cu_num_positions[-1] == len(traces.continuation) == 40
    assert traces.cu_num_nodes[-1] == len(traces.node_tokens) > 0
    header = json.loads((directory / "trace.json").read_text())
    assert header["hardware"]["torch"] and header["prompts"][0]["id"] == traces.prompts[0].id


def test_replay_refuses_what_it_cannot_replay(recorded):
    config, *_, directory = recorded
    with pytest.raises(ValueError, match="width"):
        SpecDecodeEnv(engine="replay", traces=directory, width=config.width + 1)
    with pytest.raises(ValueError, match="hold trees of 4 levels"):
        SpecDecodeEnv(engine="replay", traces=directory, depths=(0, 8))
    with pytest.raises(ValueError, match=r"asks for sampling T0.5 but the traces hold T0.*--set env.temperature=0.5"):
        SpecDecodeEnv(engine="replay", traces=directory, temperature=0.5)
    with pytest.raises(ValueError, match="drafter='layerskip:4' differs"):
        SpecDecodeEnv(engine="replay", traces=directory, drafter="layerskip:4")
    traces = Traces.load(directory)
    with pytest.raises(ValueError, match="draftrl calibrate"):
        SpecDecodeEnv(engine="replay", traces=traces)  # no cost table anywhere
    with pytest.raises(FileNotFoundError, match="draftrl collect"):
        SpecDecodeEnv(engine="replay", traces=directory / "nothing")


def test_collect_and_calibrate_commands(shared_smollm2, tmp_path, capsys):
    costs = tmp_path / "costs.json"
    assert main(["calibrate", "--num-tokens", "1,2,4", "--contexts", "32,64", "--widths", "1,2", "--levels", "2",
                 "--repeats", "1", "--threads", "1", "--json", "--out", str(costs)]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed["g"]["32"][0] == 1.0 and "g(2)=" in err and "hardware=" in err
    loaded = CostTable.load(costs)
    assert loaded.meta["threads"] == 1 and loaded.meta["hardware"]["cpu"] and loaded.verify_seconds.shape == (2, 3)

    out_dir = tmp_path / "traces"
    assert main(["collect", "--config", "configs/tiny_cpu.yaml", "--out", str(out_dir), "--cost-table", str(costs),
                 "--set", "env.limit_per_group=1", "--set", "env.tasks=[code_edit]",
                 "--set", "env.max_new_tokens=6"]) == 0
    assert "prompts=1 recordings=1 classes=T0x1 positions=6" in capsys.readouterr().out
    env = gym.make("draftrl/TraceReplay-v1", traces=str(out_dir))  # finds the copied cost table
    env.reset(seed=0)
    assert env.unwrapped.depths == (0, 1, 2, 4)  # the config recorded with the traces

    mixed = tmp_path / "mixed"  # a temperature mix: one greedy recording, --continuations sampled ones
    assert main(["collect", "--config", "configs/tiny_cpu.yaml", "--out", str(mixed), "--set", "env.limit_per_group=1",
                 "--set", "env.tasks=[code_edit]", "--set", "env.max_new_tokens=4",
                 "--set", "env.temperature_mix={0: 0.5, 0.7: 0.5}", "--continuations", "2"]) == 0
    out, err = capsys.readouterr()
    assert "prompts=1 recordings=3 classes=T0x1,T0.7x2 positions=12" in out
    assert "T0 k=0" in err and "T0.7 k=1" in err  # progress names (prompt, class, k)
    assert [c.label for c in Traces.load(mixed).classes] == ["T0", "T0.7"]

    assert main(["collect", "--out", str(tmp_path / "x"), "--set", "env.depht=[0]"]) == 2
    assert "did you mean 'env.depths'" in capsys.readouterr().err


def test_real_and_replay_depth_envs_agree(recorded):
    config, engine, tokenizer, directory = recorded
    real = SpecDecodeDepthEnv(config, engine=engine, tokenizer=tokenizer, monitor=False)
    replay = SpecDecodeDepthEnv(engine="replay", traces=directory)
    assert replay.feature_names == real.feature_names
    assert (replay.observation_space, replay.action_space) == (real.observation_space, real.action_space)
    compared = [i for i, name in enumerate(real.feature_names)
                if not name.startswith(("verify_cost", "draft_cost")) and name not in TARGET_FEATURES]
    # the target's signals: the live verification forward's rows vs the recorded teacher-forced forward's, equal
    # up to float32 summation order
    close = [i for i, name in enumerate(real.feature_names) if name in TARGET_FEATURES]
    rng = np.random.default_rng(11)
    num_tokens = 0
    for prompt in replay.workload.prompts:
        obs_real, _ = real.reset(options={"prompt_id": prompt.id})
        obs_replay, _ = replay.reset(options={"prompt_id": prompt.id})
        done = False
        while not done:
            np.testing.assert_array_equal(obs_real[compared], obs_replay[compared])
            np.testing.assert_allclose(obs_real[close], obs_replay[close], rtol=1e-4, atol=1e-6)
            action = int(rng.random() < 0.7)  # CONTINUE more often than STOP
            obs_real, _, done_real, _, info_real = real.step(action)
            obs_replay, _, done, _, info_replay = replay.step(action)
            assert info_real["phase"] == info_replay["phase"] and info_real["level"] == info_replay["level"]
            if info_real["phase"] == "verify":
                for key in ROUND_KEYS:
                    assert info_real[key] == info_replay[key], (prompt.id, key)
                num_tokens += info_real["num_emitted"]
            assert done_real == done
    assert num_tokens == 40
    env = gym.make("draftrl/TraceReplayDepth-v1", traces=str(directory), depth_shaping=True)
    gym_check_env(env.unwrapped)
    sb3_check_env(env.unwrapped)


def test_collect_keeps_finished_prompts_and_resumes(shared_smollm2, tmp_path):
    """A SIGINT during collect loses no work: each finished prompt is kept in the partial
    directory; the next run decodes only the rest and yields the same traces as one whole run."""
    import dataclasses

    from draftrl.replay.traces import ARRAYS

    config = EnvConfig(**WORKLOAD, seed=0)
    engine, tokenizer = build_engine(config, shared_smollm2)
    partial = tmp_path / "out" / ".partial"

    def interrupt_after_first(index, prompt, seconds, label, k):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(config, engine, tokenizer, partial_dir=partial, progress=interrupt_after_first)
    assert sorted(p.name for p in partial.glob("*.npz")) == ["00000-c0-k0.npz"]
    seen = []
    resumed = collect(config, engine, tokenizer, partial_dir=partial,
                      progress=lambda i, p, s, label, k: seen.append((i, label, k)))
    assert seen == [(1, "T0", 0)]  # the finished prompt was not decoded again
    whole = collect(config, engine, tokenizer)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(resumed, name), getattr(whole, name))
    assert resumed.budgets == whole.budgets and resumed.stop_reasons == whole.stop_reasons
    with pytest.raises(ValueError, match="interrupted collection of another config"):
        collect(dataclasses.replace(config, max_new_tokens=12), engine, tokenizer, partial_dir=partial)
    resumed.save(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["trace.json", "trace.npz"]  # partial gone
