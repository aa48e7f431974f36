"""The serving env, ``draftrl eval --engine vllm`` and ``draftrl calibrate --engine vllm`` on real vLLM
(few requests, few tokens, the process's shared engines)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np

from draftrl.cli import main
from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.control import rule_controller
from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine
from draftrl.envs.serve_vllm import FEATURE_NAMES


def test_serve_env_steps_one_engine_step_and_keeps_the_budget():
    env = gym.make("draftrl/ServeVLLM-v1", num_requests=3, max_new_tokens=12, concurrency=2, seed=0)
    u = env.unwrapped
    assert u.action_lag == 1 and u.feature_names == FEATURE_NAMES and env.observation_space.shape == (23,)
    obs, info = env.reset(seed=1)
    budget_index = u.budgets.index(2)
    done, steps, infos = False, 0, []
    while not done:
        obs, reward, terminated, truncated, info = env.step(np.array([u.depths.index(4), budget_index]))
        assert env.observation_space.contains(obs) and np.isfinite(reward)
        assert info["num_proposed"] <= 2 and info["num_verified"] <= 2 and info["running"] <= 2
        infos.append(info)
        done, steps = terminated or truncated, steps + 1
    requests = info["requests"]
    assert len(requests) == 3 and all(r.finished and len(r.token_ids) <= 12 for r in requests)
    assert sum(i["num_emitted"] for i in infos) == sum(len(r.token_ids) for r in requests)
    assert all(r.ttft is not None and r.ttft >= 0 for r in requests)


def test_poisson_arrivals_wait_for_their_time():
    env = gym.make("draftrl/ServeVLLM-v1", num_requests=3, max_new_tokens=6, arrival="poisson", rate=0.5, seed=0)
    _, info = env.reset(seed=0)
    arrivals = info["arrivals"]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    done = False
    while not done:
        _, _, done, _, info = env.step(np.array([0, 0]))
    for r in info["requests"]:
        assert r.admitted >= r.arrival - 1e-9
    assert info["idle_seconds"] > 0  # at 0.5 requests/s the engine waited for arrivals


def _untrained_ppo(path):
    """A PPO policy on ServeVLLM-v1's spaces (untrained: it exercises the ppo:PATH path, not learning)."""
    from stable_baselines3 import PPO

    from draftrl.config.serve import ServeConfig
    from draftrl.envs.serve_vllm import FEATURE_NAMES, OBSERVATION
    from draftrl.train.loop import Learned, save_trained

    class Spaces(gym.Env):
        observation_space = gym.spaces.Box(np.array([lo for _, lo, _ in OBSERVATION], dtype=np.float32),
                                           np.array([hi for _, _, hi in OBSERVATION], dtype=np.float32))
        action_space = gym.spaces.MultiDiscrete([7, 8])
        depths, verify_sizes, feature_names = ServeConfig().depths, ServeConfig().budgets, FEATURE_NAMES

    save_trained(Learned(PPO("MlpPolicy", Spaces(), n_steps=8, seed=0), None), path, kind="size",
                 env_id="draftrl/ServeVLLM-v1", grids_env=Spaces(), extra={})
    return path


def test_eval_engine_vllm_writes_the_documented_results(tmp_path):
    from draftrl.decoding.vllm.engine import held_engines, release_engines

    release_engines()  # an engine an earlier test left held could open a load without a build
    out = tmp_path / "serve"
    ppo = _untrained_ppo(tmp_path)
    other = "vllm-class:draftrl.decoding.vllm.proposer.DraftrlProposer:3"  # any custom_class proposer, run as vLLM's
    code = main(["eval", "--engine", "vllm", "--policies", f"none,vllm-ngram:2,fixed:4,heuristic,{other},ppo:{ppo}",
                 "--concurrency", "1,2",
                 "--set", "env.num_requests=2", "--set", "env.max_new_tokens=12", "--out", str(out), "--quiet"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["exactness"]["passed"] is True
    for level in ("1", "2"):
        table = results["concurrency"][level]["policies"]
        assert set(table) == {"none", "vllm-ngram:2", "fixed:4", "heuristic", other, "ppo"}
        for p in table.values():
            assert p["tokens_per_second"] > 0 and p["itl_p50"] is not None and p["num_tokens"] > 0
            assert p["tokens_per_cpu_second"] > 0 and p["cpu_speedup_vs_none"] > 0  # the engine thread's CPU clock
            assert set(p["per_language"]) and set(p["per_task"])
        assert table["fixed:4"]["greedy_identical_requests"] == table[other]["greedy_identical_requests"] == 2
    # one engine at a time: four engines, each built once per load but where a load opens on the last
    # one's engine, and one left held at the end
    assert sorted(map(sorted, results["engine_groups"])) == sorted(
        [["none"], ["vllm-ngram:2"], ["fixed:4", "heuristic", "ppo"], [other]])
    assert results["engine_builds"] == 2 * 4 - 1 and len(held_engines()) == 1


def test_engines_build_after_an_ngram_engine():
    """vLLM 0.32's kernel scan crashed on numba's llvmlite after an ngram engine (guard_llvmlite);
    and an ngram step must leave torch's thread count as configured (numba reset it to every CPU)."""
    import torch

    from draftrl.decoding.vllm.engine import guard_llvmlite

    ngram = shared_engine(VLLMEngineConfig(method="ngram", num_speculative_tokens=2))
    ngram.add_request("ngram-threads", [5, 6, 7, 5, 6, 7, 5, 6], 6)
    while ngram.has_unfinished_requests():
        ngram.step()
        assert torch.get_num_threads() == ngram.config.threads
    import llvmlite.binding.ffi as ffi

    guard_llvmlite()
    assert isinstance(vars(ffi.lib), dict)
    engine = shared_engine(VLLMEngineConfig(method="draftrl", max_num_seqs=2))  # a config no other test builds
    engine.add_request("after-ngram", list(range(600, 620)), 4)
    while engine.has_unfinished_requests():
        engine.step()


def test_calibrate_fill_rule_verifies_exactly_the_depth():
    from draftrl.replay.serve_calibrate import calibrate

    engine = shared_engine(VLLMEngineConfig(method="draftrl"))
    engine.set_controller(rule_controller("fill"))
    try:
        for i in range(2):
            engine.add_request(f"fill{i}", list(range(500, 520)), 20)
        drafted = [engine.step(StepAction(3)).num_verified for _ in range(3)]
        assert drafted == [0, 6, 6]  # prefill, then 2 sequences x 3 drafts every step
    finally:
        engine.abort_all()
        engine.set_controller(rule_controller("match"))
    result = calibrate(engine, batch_sizes=(1, 2), depths=(0, 2), steps=3, warmup=1, prefill_lens=(16,), rounds=2,
                       prefill_batch_sizes=(2,))
    decode = [p for p in result["points"] if p["kind"] == "decode"]
    assert [(p["num_seqs"], p["depth"], p["tokens_verified"]) for p in decode] == \
        [(1, 0, 1), (1, 2, 3), (2, 0, 2), (2, 2, 6)]
    prefill = [p for p in result["points"] if p["kind"] == "prefill"]
    assert [(p["num_seqs"], p["prompt_len"], p["prompt_tokens"], p["tokens_verified"]) for p in prefill] == \
        [(2, 16, 32, 0)]
    assert all(p["samples"] == 3 and p["seconds_median"] > 0 for p in result["points"])
    assert np.isfinite(result["fit"]["per_token"]) and engine.proposer.controller.rule == "match"  # put back
