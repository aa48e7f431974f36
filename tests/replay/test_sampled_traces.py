"""Traces at any temperature (``draftrl-trace/2``): K seeded continuations per prompt and sampling class,
decoded by the live engine, the target's signals on the rows that emitted them, resumable collection; the
replay walks any recorded class and reports what ``RoundResult.target_features`` promises; a
``draftrl-trace/1`` directory still loads as the one-continuation greedy case (the law itself:
``test_law.py``)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from choice_traces import costs
from markov_target import NumberTokenizer, markov_target, write_prompts

from draftrl.cli import main
from draftrl.config.env import EnvConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.ngram import NgramDrafter
from draftrl.models.distribution import SamplingParams, logits_to_probs
from draftrl.replay.round_engine import TraceRoundEngine
from draftrl.replay.traces import _V1_ARRAYS, ARRAYS, FORMAT_V1, Traces, collect, recording_seed
from draftrl.signals.features import TARGET_FEATURES

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 6
PROMPTS = ([*range(16), *range(6)], [*range(10, 16), *range(16)])
MIX = {0: 0.5, 0.7: 0.5}


def config_for(prompts: str, **changes) -> EnvConfig:
    base = dict(prompts=prompts, split="tune", languages=("en",), tasks=("chat",), max_new_tokens=BUDGET,
                chat_template=False, ignore_eos=True, drafter="ngram:1:3", depths=(0, 1, 3), width=2,
                verify_sizes=(0, 2), temperature_mix=MIX, seed=3)
    return EnvConfig(**{**base, **changes})


def new_engine(target) -> SpeculativeDecoder:
    return SpeculativeDecoder(target, NgramDrafter(1, 3), EngineConfig(max_new_tokens=BUDGET))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(target, config, traces): a mix of T0 and T0.7, three continuations at T0.7."""
    target = markov_target()
    config = config_for(write_prompts(tmp_path_factory.mktemp("mix"), PROMPTS, BUDGET))
    return target, config, collect(config, new_engine(target), NumberTokenizer(), num_continuations=3)


def test_collect_records_k_seeded_continuations_per_sampled_class(mixed, tmp_path):
    target, config, traces = mixed
    assert [c.label for c in traces.classes] == ["T0", "T0.7"] and traces.num_continuations == (1, 3)
    assert traces.num_recordings == 2 * (1 + 3) and traces.meta["draft_mode"] == "greedy"
    assert traces.recording_class.tolist() == [0, 1, 1, 1] * 2 and traces.recording_k.tolist() == [0, 0, 1, 2] * 2
    cu, cont = traces.cu_num_positions, traces.continuation
    sampled = []
    for r in range(traces.num_recordings):
        p, c, k = (int(a[r]) for a in (traces.recording_prompt, traces.recording_class, traces.recording_k))
        sampling = traces.classes[c]
        seed = recording_seed(config.seed, traces.prompts[p].id, sampling, k)
        assert traces.recording_seed[r] == seed
        # the live engine's own output with that sampling and seed
        live = SpeculativeDecoder(target, NgramDrafter(1, 3), EngineConfig(
            max_new_tokens=BUDGET, temperature=sampling.temperature))
        live.start(list(PROMPTS[p]), seed=seed)
        while not live.finished:
            live.round(4)
        assert live.output_ids == cont[cu[r]:cu[r + 1]].tolist()
        if not sampling.greedy:
            sampled.append(tuple(live.output_ids))
        # the target's signals on the row that emitted each token
        ids = list(PROMPTS[p]) + live.output_ids
        with torch.inference_mode():
            logits = target(input_ids=torch.tensor([ids])).logits[0, len(PROMPTS[p]) - 1:-1]
        params = sampling.params()
        p_rows = logits_to_probs(logits, params)
        tokens = torch.tensor(live.output_ids)
        positions = slice(cu[r], cu[r + 1])
        np.testing.assert_allclose(traces.p_token[positions], p_rows[torch.arange(len(tokens)), tokens], atol=1e-6)
        raw = torch.softmax(logits.double(), -1)
        np.testing.assert_allclose(traces.target_top1_prob[positions], raw.max(-1).values, atol=1e-6)
        assert np.all(traces.target_entropy[positions] > 0)
    assert len(set(sampled)) > 1  # the seeds differ: so do the samples
    again = collect(config, new_engine(target), NumberTokenizer(), num_continuations=3)
    for name in ARRAYS:  # reproducible from the config's seed
        np.testing.assert_array_equal(getattr(again, name), getattr(traces, name), err_msg=name)

    traces.save(tmp_path / "t")
    loaded = Traces.load(tmp_path / "t")
    assert loaded.classes == traces.classes and loaded.num_continuations == (1, 3)
    assert loaded.stop_reasons == traces.stop_reasons and loaded.budgets == [BUDGET, BUDGET]
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(traces, name), err_msg=name)
    assert loaded.config.sampling_classes == config.sampling_classes


def test_collect_resumes_by_prompt_class_and_k(mixed, tmp_path):
    target, config, whole = mixed
    partial = tmp_path / ".partial"
    seen = []

    def interrupt_at_third(index, prompt, seconds, label, k):
        seen.append((prompt.id, label, k))
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(config, new_engine(target), NumberTokenizer(), num_continuations=3, partial_dir=partial,
                progress=interrupt_at_third)
    assert sorted(p.name for p in partial.glob("*.npz")) == ["00000-c0-k0.npz", "00000-c1-k0.npz", "00000-c1-k1.npz"]
    seen.clear()
    resumed = collect(config, new_engine(target), NumberTokenizer(), num_continuations=3, partial_dir=partial,
                      progress=lambda i, prompt, s, label, k: seen.append((i, prompt.id, label, k)))
    assert seen == [(3, "p0", "T0.7", 2), (4, "p1", "T0", 0), (5, "p1", "T0.7", 0), (6, "p1", "T0.7", 1),
                    (7, "p1", "T0.7", 2)]
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(resumed, name), getattr(whole, name), err_msg=name)
    with pytest.raises(ValueError, match="interrupted collection of another config"):
        collect(config, new_engine(target), NumberTokenizer(), num_continuations=4, partial_dir=partial)


def test_sampled_drafts_are_refused_at_temperature(mixed):
    target, config, _ = mixed
    with pytest.raises(ValueError, match="not replayable; train them on the live env"):
        collect(dataclasses.replace(config, draft_sampling=True), new_engine(target), NumberTokenizer())
    with pytest.raises(ValueError, match="num_continuations=0 must be >= 1"):
        collect(config, new_engine(target), NumberTokenizer(), num_continuations=0)


def test_the_replay_walks_the_requested_class_and_continuation(mixed):
    _, config, traces = mixed
    replay = TraceRoundEngine(traces, config, costs(1e-4))
    prompt = list(PROMPTS[1])
    replay.config.max_new_tokens = BUDGET
    with pytest.raises(ValueError, match="needs sampling="):
        replay.start(prompt)
    with pytest.raises(ValueError, match="draftrl collect --set env.temperature=1"):
        replay.start(prompt, sampling=SamplingParams(temperature=1.0))
    cu, cont = traces.cu_num_positions, traces.continuation
    for k in range(5):  # seed % K picks the continuation
        replay.start(prompt, seed=k, sampling=SamplingParams(temperature=0.7))
        assert replay.sampling == SamplingParams(temperature=0.7) and replay.config.temperature == 0.7
        r = replay.recording
        assert (traces.recording_prompt[r], traces.recording_class[r], traces.recording_k[r]) == (1, 1, k % 3)
        while not replay.finished:
            replay.round(0)
        assert replay.output_ids == cont[cu[r]:cu[r + 1]].tolist()
    rng = np.random.default_rng(0)
    drawn = set()
    for _ in range(20):  # no seed: the env's rng picks one
        replay.start(prompt, sampling=SamplingClass(0.7), rng=rng)
        drawn.add(replay.recording)
    assert len(drawn) == 3
    state = rng.bit_generator.state
    replay.start(prompt, sampling=SamplingClass(0.0), rng=rng)  # one greedy continuation: nothing drawn
    assert rng.bit_generator.state == state and replay.sampling.greedy
    greedy_only = TraceRoundEngine(traces, config_for(config.prompts, temperature_mix=None), costs(1e-4))
    assert greedy_only.sampling == SamplingParams()  # the config's one class before any request


def test_select_cuts_a_prompt_subset_that_replays_as_the_whole(mixed, tmp_path):
    """``Traces.select``: the chosen prompts' recordings, re-indexed, saved and loaded whole; a replayed
    request of the subset walks what the full traces walk (benchmarks/learning_curve.py's nested sets)."""
    _, config, traces = mixed
    part = Traces.load(traces.select([1]).save(tmp_path / "part"))
    assert len(part) == 1 and part.prompts == [traces.prompts[1]] and part.num_recordings == 4
    assert part.recording_prompt.tolist() == [0] * 4 and part.num_continuations == traces.num_continuations
    whole, cut = TraceRoundEngine(traces, config, costs(1e-4)), TraceRoundEngine(part, config, costs(1e-4))
    for k in range(3):
        walked = []
        for replay in (whole, cut):
            replay.config.max_new_tokens = BUDGET
            replay.start(list(PROMPTS[1]), seed=k, sampling=SamplingParams(temperature=0.7))
            rounds = []
            while not replay.finished:
                features = replay.features()
                result = replay.round(3, 2, 2)
                rounds.append((features, result.num_accepted, result.num_emitted))
            walked.append((replay.output_ids, rounds))
        assert walked[0] == walked[1]
    assert np.array_equal(traces.select([1, 0]).recording_prompt, [0] * 4 + [1] * 4)
    with pytest.raises(ValueError, match="distinct prompt indices"):
        traces.select([0, 0])


def test_replayed_rounds_report_the_recorded_rows(mixed):
    """``target_features`` (the contract with the observation) and ``TokenStats`` come from the stored rows:
    raw top-1/entropy where the round's last token was emitted, the mean p of its accepted drafts, and
    E[agree] = p of the verified children at each drafted node of the walk."""
    _, config, traces = mixed
    replay = TraceRoundEngine(traces, config, costs(1e-4))
    rng = np.random.default_rng(1)
    checked = accepted_rounds = 0
    for prompt in PROMPTS:
        for k in range(3):
            replay.config.max_new_tokens = BUDGET
            replay.start(list(prompt), seed=k, sampling=SamplingParams(temperature=0.7), rng=rng)
            start = traces.cu_num_positions[replay.recording]
            while not replay.finished:
                t = len(replay.output_ids)
                best = replay.lookahead((0, 1, 3), (0, 2), lambda tokens, seconds: tokens / seconds)
                assert best.shape == (2,)
                rnd = replay.round(int(rng.choice([1, 3])), int(rng.choice([0, 2])) or None, 2)
                a, b = start + t, start + t + rnd.num_emitted
                assert tuple(rnd.target_features) == TARGET_FEATURES
                assert rnd.target_features["target_top1_prob"] == traces.target_top1_prob[b - 1]
                assert rnd.target_features["target_entropy"] == traces.target_entropy[b - 1]
                mean_p = traces.p_token[a:a + rnd.num_accepted].mean() if rnd.num_accepted else 0.0
                assert rnd.target_features["accepted_mean_p"] == pytest.approx(mean_p)
                stats = rnd.token_stats
                np.testing.assert_array_equal(stats.p_token, traces.p_token[a:b])
                np.testing.assert_array_equal(stats.entropy, traces.p_entropy[a:b])
                assert np.all((stats.agree_expected >= 0) & (stats.agree_expected <= 1 + 1e-9))
                assert np.all(stats.agree_expected[stats.agree > 0] >= stats.p_token[stats.agree > 0] - 1e-6)
                assert np.all(stats.agree_expected[~stats.drafted] == 0)
                checked += 1
                accepted_rounds += rnd.num_accepted > 0
    assert checked > 10 and accepted_rounds > 0


def test_what_the_traces_cannot_replay_is_refused(mixed):
    _, config, traces = mixed
    with pytest.raises(ValueError, match=r"asks for sampling T1 but the traces hold T0, T0.7.*env.temperature=1"):
        TraceRoundEngine(traces, config_for(config.prompts, temperature_mix={0.7: 0.5, 1.0: 0.5}), costs(1e-4))
    with pytest.raises(ValueError, match="draft_sampling=True draws drafts from q"):
        TraceRoundEngine(traces, config_for(config.prompts, draft_sampling=True), costs(1e-4))


def test_version_1_traces_load_as_one_greedy_continuation(tmp_path):
    """A directory in the ``draftrl-trace/1`` layout (written here as that version wrote it) loads as K = 1 at
    T = 0 and replays; the raw-softmax signals it never stored leave ``target_features`` empty. Another
    format is refused naming the fix."""
    directory = tmp_path / "v1"
    directory.mkdir()
    arrays = dict(prompt_tokens=np.array([1, 2, 3]), cu_num_prompt_tokens=np.array([0, 3]),
                  continuation=np.array([7, 8, 9]), cu_num_positions=np.array([0, 3]),
                  draft_features=np.zeros((3, 4)), cu_num_nodes=np.array([0, 2, 3, 3]),
                  node_tokens=np.array([7, 8, 5]), node_parents=np.array([-1, 0, -1]),
                  node_depths=np.array([1, 2, 1]), node_scores=np.array([-0.1, -0.2, -0.1]))
    assert set(arrays) == set(_V1_ARRAYS)
    np.savez_compressed(directory / "trace.npz", trace_id=np.array("abc"), **arrays)
    header = {"format": FORMAT_V1, "trace_id": "abc", "max_depth": 2, "width": 1,
              "draft_feature_names": ["draft_top1_prob", "draft_entropy", "ngram_match_len", "ngram_num_matches"],
              "prompts": [{"id": "en-chat-000", "language": "en", "task": "chat", "split": "tune", "prompt": "hi",
                           "max_new_tokens": 3}],
              "budgets": [3], "stop_reasons": ["length"], "config": {"drafter": "ngram", "depths": [0, 1, 2]},
              "target": "smollm2-135m", "drafter": "ngram"}
    (directory / "trace.json").write_text(json.dumps(header))
    traces = Traces.load(directory)
    assert traces.meta["read_format"] == FORMAT_V1 and traces.classes == (SamplingClass(),)
    assert traces.num_continuations == (1,) and traces.num_recordings == 1 and traces.one_per_prompt
    assert traces.p_token.tolist() == [1, 1, 1] and np.isnan(traces.target_top1_prob).all()
    assert traces.node_p.tolist() == [1.0, 1.0, 0.0]  # 7 then 8 follow the continuation; 5 does not
    config = EnvConfig(drafter="ngram", depths=(0, 1, 2), width=1)
    replay = TraceRoundEngine(traces, config, costs(1e-4))
    replay.config.max_new_tokens = 3
    replay.start([1, 2, 3], rng=np.random.default_rng(0))
    rnd = replay.round(2)
    assert rnd.tokens == [7, 8, 9] and rnd.num_accepted == 2 and rnd.target_features == {}
    traces.save(tmp_path / "v2")  # saved again: the current format
    assert json.loads((tmp_path / "v2" / "trace.json").read_text())["format"] == "draftrl-trace/2"
    assert Traces.load(tmp_path / "v2").node_p.tolist() == [1.0, 1.0, 0.0]

    header["format"] = "draftrl-trace/9"
    (directory / "trace.json").write_text(json.dumps(header))
    with pytest.raises(ValueError, match=r"format 'draftrl-trace/9'.*draftrl collect .*--overwrite"):
        Traces.load(directory)


def test_collect_refuses_zero_continuations_before_loading_models(tmp_path, capsys):
    assert main(["collect", "--out", str(tmp_path / "t"), "--continuations", "0"]) == 2
    assert "--continuations 0 must be >= 1" in capsys.readouterr().err


def test_greedy_only_readers_refuse_sampled_traces(mixed):
    from draftrl.replay.round_table import round_table

    _, _, traces = mixed
    with pytest.raises(ValueError, match="drafter-choice table.*reads greedy traces.*T0, T0.7 with 8 recordings"):
        round_table({"ngram": traces}, {"ngram": costs(1e-4)}, (1, 2))


def test_trace_replay_env_over_sampled_traces(mixed):
    """``draftrl/TraceReplay-v1`` over traces of one sampled class: the env's RNG picks the continuation,
    a seed fixes the episode, the lookahead walks the same continuation, and the checkers pass."""
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import draftrl.envs  # noqa: F401  registers the env ids
    from draftrl.envs.spec_decode import SpecDecodeEnv

    target, config, _ = mixed
    hot = config_for(config.prompts, temperature_mix=None, temperature=0.7)
    traces = collect(hot, new_engine(target), NumberTokenizer(), num_continuations=3)

    def episode(seed):
        env = SpecDecodeEnv(engine="replay", traces=traces, cost_table=costs(1e-4))
        env.action_space.seed(0)
        _, info = env.reset(seed=seed, options={"prompt_index": 0})
        tokens, done = [], False
        while not done:
            assert env.lookahead_action().shape == (2,)
            _, _, done, _, step = env.step(env.action_space.sample())
            tokens += step["token_ids"]
        return env.engine.recording, tokens

    assert episode(3) == episode(3)
    walked = {episode(seed)[0] for seed in range(12)}
    assert walked == {0, 1, 2}  # the env's RNG reaches all three continuations of prompt 0
    check_env(gym.make("draftrl/TraceReplay-v1", traces=traces, cost_table=costs(1e-4)).unwrapped)
