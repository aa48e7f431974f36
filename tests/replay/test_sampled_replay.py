"""Sampled serving recordings and their replay (issue 46) without vLLM: recordings made at each
request's own sampling (the fix of a silent mismatch: every request used to be decoded greedily
whatever the config said), the format's versions, each replayed request following a continuation of
its own class, and the coupling's law on a bigram target against vLLM's one-hot rejection sampler
(``tests/real_vllm/test_serve_sampled_law.py`` checks it against vLLM itself)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_recordings import (
    COST,
    TOKENS,
    accepted_law_test,
    bigram_probs,
    markov_target,
    one_hot_verification_steps,
    replayed_steps,
    sample_chain,
    synthetic_recordings,
)

from draftrl.config.serve import ServeConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.interface import EngineStep, RequestStep
from draftrl.decoding.vllm.proposer import serving_drafter
from draftrl.prompts import Prompt
from draftrl.replay.recordings import (
    FORMAT_V1,
    Proposals,
    Recording,
    Recordings,
    continuation_seed,
    record,
    record_workload,
)
from draftrl.replay.serve_engine import ReplayEngine


class FakeEngine:
    """A serving engine that decodes every request in one step: greedy requests emit ``100 + i``, sampled
    ones tokens drawn from their seed, so a recording shows which sampling each request was added with."""

    def __init__(self):
        self.added: list[dict] = []

    def has_unfinished_requests(self):
        return any(not a["done"] for a in self.added)

    def abort_all(self):
        self.added.clear()

    def add_request(self, request_id, prompt_ids, max_new_tokens, *, temperature=0.0, top_k=0, top_p=1.0, seed=None):
        self.added.append({"id": request_id, "n": max_new_tokens, "temperature": temperature, "top_k": top_k,
                           "top_p": top_p, "seed": seed, "done": False})

    def step(self, action=None):
        out = []
        for a in self.added:
            if not a["done"]:
                a["done"] = True
                if a["temperature"] == 0:
                    tokens = [100 + i for i in range(a["n"])]
                else:
                    tokens = np.random.default_rng(a["seed"]).integers(0, 50, a["n"]).tolist()
                out.append(RequestStep(a["id"], tokens, 0, 0, True))
        return EngineStep(0.01, out, 0, 0, 0)


class FakeTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 50 for c in text[:12]]}


def test_record_workload_decodes_at_the_configs_temperature():
    """The bug this fixes: ``--set env.temperature=0.7`` decoded greedily and wrote 0.7 into the meta."""
    engine = FakeEngine()
    config = ServeConfig(temperature=0.7, top_p=0.9, max_new_tokens=6, limit_per_group=1, seed=3,
                         chat_template=False)
    recs = record_workload(config, engine=engine, tokenizer=FakeTokenizer(), continuations=3)
    assert {(a["temperature"], a["top_k"], a["top_p"]) for a in engine.added} == {(0.7, 0, 0.9)}
    assert all(a["seed"] is not None for a in engine.added)
    assert len(recs) == 3 * len(recs.prompts)
    assert recs.meta["sampling"] == [{"temperature": 0.7, "top_k": 0, "top_p": 0.9, "continuations": 3}]
    assert recs.meta["config"]["temperature"] == 0.7
    for r in recs.requests:
        assert (r.temperature, r.top_k, r.top_p) == (0.7, 0, 0.9) and r.sample in (0, 1, 2)
        assert r.seed == continuation_seed(3, r.prompt.id, r.sampling, r.sample)
        assert r.token_ids == np.random.default_rng(r.seed).integers(0, 50, len(r.token_ids)).tolist()


def test_a_mix_records_each_class_greedy_once_and_sampled_k_times():
    engine = FakeEngine()
    config = ServeConfig(temperature_mix={0: 0.3, 0.7: 0.4, 1.0: 0.3}, max_new_tokens=4, limit_per_group=1,
                         chat_template=False)
    recs = record_workload(config, engine=engine, tokenizer=FakeTokenizer(), continuations=2)
    per_prompt = {}
    for r in recs.requests:
        per_prompt.setdefault(r.prompt.id, []).append((r.sampling.label, r.sample, r.seed is None))
    for entries in per_prompt.values():
        assert sorted(entries) == [("T0", 0, True), ("T0.7", 0, False), ("T0.7", 1, False), ("T1", 0, False),
                                   ("T1", 1, False)]
    assert [r.token_ids[:2] for r in recs.requests if r.temperature == 0][0] == [100, 101]
    seeds = [r.seed for r in recs.requests if r.seed is not None]
    assert len(set(seeds)) == len(seeds)  # every sampled continuation has its own seed


def test_continuation_seeds_are_reproducible_and_distinct():
    c7, c1 = SamplingClass(0.7), SamplingClass(1.0)
    assert continuation_seed(0, "p1", c7, 0) == continuation_seed(None, "p1", c7, 0)
    seeds = {continuation_seed(s, p, c, k) for s in (0, 1) for p in ("p1", "p2") for c in (c7, c1) for k in range(4)}
    assert len(seeds) == 32 and all(0 <= s < 2**31 for s in seeds)
    with pytest.raises(ValueError, match="continuations=0"):
        record(FakeEngine(), [], continuations=0)


def test_sampled_recordings_round_trip(tmp_path):
    recs = record(FakeEngine(), [(Prompt("p", "en", "qa", "tune", "x", 4), [1, 2, 3], 4)],
                  sampling=(SamplingClass(0.0), SamplingClass(0.7, 20, 0.8)), continuations=2, lookahead=2)
    recs.save(tmp_path)
    loaded = Recordings.load(tmp_path)
    assert loaded.requests == recs.requests and loaded.meta["sampling"] == recs.meta["sampling"]
    assert loaded.prompts == [recs.requests[0].prompt]  # each prompt once


def test_first_format_loads_as_greedy_and_a_sampled_workload_is_refused_naming_the_fix(tmp_path):
    recs = synthetic_recordings(4)
    recs.save(tmp_path)
    data = json.loads((tmp_path / "recordings.json").read_text())
    data["format"] = FORMAT_V1
    data["meta"]["config"]["temperature"] = 0.7  # what the first format wrote while decoding greedily
    for r in data["requests"]:
        for key in ("temperature", "top_k", "top_p", "sample", "seed"):
            del r[key]
    (tmp_path / "recordings.json").write_text(json.dumps(data))
    loaded = Recordings.load(tmp_path)
    assert [r.token_ids for r in loaded.requests] == [r.token_ids for r in recs.requests]
    assert all(r.temperature == 0 and r.sample == 0 for r in loaded.requests)
    assert loaded.meta["format_loaded"] == FORMAT_V1
    ReplayEngine.for_config(ServeConfig(), loaded, COST)  # greedy: replays
    with pytest.raises(ValueError, match=r"hold T0 continuations, not T0\.7.*draftrl collect --engine vllm") as err:
        ReplayEngine.for_config(ServeConfig(temperature=0.7), loaded, COST)
    assert "\n" not in str(err.value)
    data["format"] = "draftrl-serve-recordings/0"
    (tmp_path / "recordings.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a serving recording"):
        Recordings.load(tmp_path)


def mixed_recordings(num: int = 4, k: int = 3) -> Recordings:
    """The synthetic greedy recordings plus ``k`` continuations at T0.7 per prompt, token ids offset
    by 1000 * (sample + 1), so which one a request follows shows in its tokens."""
    base = synthetic_recordings(num)
    extra = [Recording(r.prompt, r.prompt_ids, r.max_new_tokens, [t + 1000 * (s + 1) for t in r.token_ids],
                       r.lookahead, 0.7, 0, 1.0, s, 10 + s) for r in base.requests for s in range(k)]
    return Recordings(base.requests + extra, base.meta)


def test_each_request_follows_a_continuation_of_its_own_class():
    recs = mixed_recordings()
    engine = ReplayEngine(recs, COST, max_depth=4)
    rec = recs.requests[1]
    engine.add_request("g", rec.prompt_ids, TOKENS)
    engine.add_request("s4", rec.prompt_ids, TOKENS, temperature=0.7, seed=4)  # 4 % 3 -> continuation 1
    engine.add_request("s0", rec.prompt_ids, TOKENS, temperature=0.7)  # no seed: continuation 0
    tokens = {"g": [], "s4": [], "s0": []}
    while engine.has_unfinished_requests():
        for r in engine.step().requests:
            tokens[r.request_id] += r.token_ids
    assert tokens["g"] == rec.token_ids[:TOKENS]
    assert tokens["s4"] == [t + 2000 for t in rec.token_ids[:TOKENS]]
    assert tokens["s0"] == [t + 1000 for t in rec.token_ids[:TOKENS]]
    with pytest.raises(ValueError, match=r"samples with T1, but its prompt was recorded with T0, T0\.7 only"):
        engine.add_request("x", rec.prompt_ids, TOKENS, temperature=1.0, seed=1)


def test_the_replay_env_draws_each_requests_class_from_the_mix():
    from draftrl.envs.serve_vllm import ServeVLLMEnv

    recs = mixed_recordings(8)
    config = ServeConfig(temperature_mix={0: 0.5, 0.7: 0.5}, max_new_tokens=TOKENS, concurrency=4, num_requests=40)
    env = ServeVLLMEnv(config, engine="replay", recordings=recs, calibration=COST)
    env.reset(seed=0)
    while True:
        *_, done, _, info = env.step(np.array([4, 7]))
        if done:
            break
    by_prompt = {r.prompt.id: r for r in recs.requests if r.temperature == 0}
    labels = []
    for timeline in info["requests"]:
        labels.append(timeline.sampling.label)
        rec = by_prompt[timeline.prompt_id]
        offsets = {(a - b) for a, b in zip(timeline.token_ids, rec.token_ids)}
        assert len(offsets) == 1 and offsets <= ({0} if timeline.sampling.greedy else {1000, 2000, 3000})
    assert 8 <= labels.count("T0") <= 32  # both classes drawn (40 requests, p = 0.5 each)
    with pytest.raises(ValueError, match=r"not T1.*draftrl collect --engine vllm"):
        ServeVLLMEnv(ServeConfig(temperature=1.0), engine="replay", recordings=recs, calibration=COST)


# ------------------------------------------------------------ the coupling's law on a bigram target
LAW_DEPTH = 4
LAW_TOKENS = 48


@pytest.fixture(scope="module")
def bigram():
    """A 10-token bigram target, 60 prompts sampled from it at T=1 (so the n-gram drafter finds matches)."""
    logits = markov_target()
    rng = np.random.default_rng(7)
    prompts = [sample_chain(bigram_probs(logits, 1.0), int(rng.integers(10)), 24, rng) for _ in range(60)]
    return logits, prompts


def _recordings_at(logits, prompts, temperature: float, seed: int) -> Recordings:
    """One continuation per prompt sampled at ``temperature`` without speculation (0: the greedy one)."""
    rng, probs = np.random.default_rng(seed), bigram_probs(logits, temperature)
    n = LAW_TOKENS + LAW_DEPTH + 1
    return Recordings([Recording(Prompt(f"b{i}", "en", "qa", "tune", "", LAW_TOKENS), p, LAW_TOKENS,
                                 sample_chain(probs, p[-1], n, rng), LAW_DEPTH + 1, temperature)
                       for i, p in enumerate(prompts)])


def _vllm_steps(logits, prompts, temperature: float, seed: int) -> list[list[tuple[int, int]]]:
    rng, probs, drafter = np.random.default_rng(seed), bigram_probs(logits, temperature), serving_drafter()
    return [one_hot_verification_steps(probs, p, LAW_TOKENS, LAW_DEPTH, drafter, rng) for p in prompts]


def _replay_steps(logits, prompts, temperature: float, seed: int) -> list[list[tuple[int, int]]]:
    recs = _recordings_at(logits, prompts, temperature, seed)
    return replayed_steps(recs, Proposals(recs, LAW_DEPTH), LAW_TOKENS, LAW_DEPTH)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_replayed_acceptance_follows_vllms_one_hot_law(bigram, temperature):
    """Accepted drafts per verified step, n-gram drafter, depth 4: the replay of continuations sampled
    without speculation vs vLLM's rule (accept d with p(d), else the residual) on the same 60 prompts,
    independent draws: the chi-square homogeneity statistic, its p value by swapping requests
    (``accepted_law_test``), does not reject at alpha = 0.001. Power, the controls: the same test on
    the same requests rejects the greedy continuation replayed at T > 0 and the recordings of the
    other temperature (T = 0.7 against 1.0: a recording made at a temperature other than the
    request's, the bug this issue fixes), both at p < 0.001 (none of 4000 swaps reaches them)."""
    logits, prompts = bigram
    vllm = _vllm_steps(logits, prompts, temperature, seed=1)
    replay = _replay_steps(logits, prompts, temperature, seed=2)
    statistic, pvalue, dof = accepted_law_test(vllm, replay, LAW_DEPTH)
    verified = [sum(d > 0 for steps in side for d, _ in steps) for side in (vllm, replay)]
    print(f"T={temperature}: {verified} verified steps, chi2={statistic:.1f} dof={dof} p={pvalue:.3f}")
    assert min(verified) >= 600
    assert pvalue > 1e-3
    greedy = _replay_steps(logits, prompts, 0.0, seed=2)
    assert accepted_law_test(vllm, greedy, LAW_DEPTH)[1] < 1e-3
    other = _replay_steps(logits, prompts, 1.7 - temperature, seed=2)
    assert accepted_law_test(vllm, other, LAW_DEPTH)[1] < 1e-3


def test_replay_and_vllm_rule_agree_at_temperature_zero(bigram):
    """At T = 0 the two are the same deterministic schedule, step for step (a sanity check of the harness)."""
    logits, prompts = bigram
    assert _vllm_steps(logits, prompts, 0.0, seed=1) == _replay_steps(logits, prompts, 0.0, seed=2)


def test_the_evaluation_serves_a_mix_checking_each_class_its_own_way(tmp_path):
    """``run_eval`` on a mix: every request keeps its class under every policy (the env's seeded draws),
    greedy identity covers the greedy requests only, each sampled class gets its own monitor
    (``POLICY@CLASS``; the replay returns no logprobs, so it reads unchecked), rows per class."""
    from draftrl.envs.serve_vllm import ServeVLLMEnv
    from draftrl.eval.serve.compare import run_eval

    recs = mixed_recordings(8)
    config = ServeConfig(temperature_mix={0: 0.5, 0.7: 0.5}, max_new_tokens=TOKENS, shuffle=False, seed=0)
    results = run_eval(tmp_path, policies="none,fixed:4", concurrency=[4], config=config,
                       make_env=lambda cfg, spec: ServeVLLMEnv(cfg, engine="replay", recordings=recs,
                                                               calibration=COST))
    ex = results["exactness"]
    assert ex["passed"] and ex["sampling"] == ["T0", "T0.7"] and ex["greedy_identity"]["checked"]
    assert set(ex["monitor"]["policies"]) == {"none@T0.7", "fixed:4@T0.7"}
    assert all(v["verdict"] == "unchecked" for v in ex["monitor"]["policies"].values())
    table = results["concurrency"]["4"]["policies"]
    rows = table["fixed:4"]["per_sampling"]
    assert set(rows) == {"T0", "T0.7"} and sum(r["num_requests"] for r in rows.values()) == 8
    assert table["fixed:4"]["greedy_identical_requests"] == rows["T0"]["num_requests"]
    assert {k: r["num_requests"] for k, r in table["none"]["per_sampling"].items()} == \
        {k: r["num_requests"] for k, r in rows.items()}  # the same requests in each class under every policy
    report = (tmp_path / "report.md").read_text()
    assert "Per sampling class" in report and "| fixed:4 | " in report.split("Per sampling class")[1]
    assert "Exactness: PASSED (mix T0, T0.7," in report and "fixed:4@T0.7 unchecked" in report


def test_collect_refuses_continuations_below_one(tmp_path, capsys):
    """``--continuations`` (traces and serving recordings alike) must be >= 1, refused in one line before anything
    loads."""
    from draftrl.cli import main

    for argv, message in ((["collect", "--continuations", "0", "--out", str(tmp_path / "t")],
                           "--continuations 0 must be >= 1"),
                          (["collect", "--engine", "vllm", "--continuations", "0", "--out", str(tmp_path / "r")],
                           "--continuations 0 must be >= 1")):
        assert main(argv) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()
