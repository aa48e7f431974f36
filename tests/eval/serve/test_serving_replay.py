"""``draftrl.eval.serve.compare.run_eval`` on the serving replay (``make_env``): the runner of
``draftrl eval --engine vllm`` and ``benchmarks/serve_sweep.py``, without vLLM."""

from __future__ import annotations

import pytest
from serve_recordings import COST, TOKENS, synthetic_recordings

from draftrl.config.serve import ServeConfig
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.eval.serve.compare import run_eval


def replay_env(recordings):
    """``make_env`` for the runner: ``ServeReplay-v1`` on ``recordings``."""
    return lambda cfg, spec: ServeVLLMEnv(cfg, engine="replay", recordings=recordings, calibration=COST)


def test_policies_in_the_replay_under_load(tmp_path):
    recordings = synthetic_recordings(8)
    config = ServeConfig(max_new_tokens=TOKENS, shuffle=False, seed=0)
    results = run_eval(tmp_path, policies="none,fixed:1,fixed:4:4,heuristic,dsd", concurrency=[1, 4],
                               rates=[3.0], repeats=2, config=config,
                               make_env=replay_env(recordings))
    assert results["exactness"]["passed"]  # every policy emitted the recorded continuations
    for section, key in (("concurrency", "1"), ("concurrency", "4"), ("rates", "3")):
        table = results[section][key]["policies"]
        assert set(table) == {"none", "fixed:1", "fixed:4:4", "heuristic", "dsd"}
        assert table["none"]["speedup_vs_none"] == 1.0 and table["none"]["num_verified"] == 0
        assert table["fixed:1"]["num_verified"] > 0
        assert table["fixed:1"]["tokens_per_cpu_second"] is None  # the replay has no CPU clock
        assert all(t["num_tokens"] == table["none"]["num_tokens"] for t in table.values())
    four = results["concurrency"]["4"]["policies"]
    assert four["fixed:4:4"]["num_verified"] <= 4 * four["fixed:4:4"]["num_steps"]  # the budget binds
    assert results["concurrency"]["4"]["policies"]["none"]["mean_batch"] > \
        results["concurrency"]["1"]["policies"]["none"]["mean_batch"] == pytest.approx(1.0)
    assert results["repeats"] == 2
    with pytest.raises(ValueError, match="repeats=0"):
        run_eval(tmp_path, policies="none", concurrency=[1], repeats=0, config=config,
                         make_env=replay_env(recordings))


def test_dsd_grid_search_scores_tables_as_the_evaluation_does(tmp_path):
    """A constant table is the fixed depth: its score is the geometric mean of run_eval's
    speedups of fixed:K at the same loads; only tables whose K never grows are searched."""
    import numpy as np

    from draftrl.eval.serve.dsd_search import search_dsd

    recordings = synthetic_recordings(8)
    config = ServeConfig(max_new_tokens=TOKENS, shuffle=False, seed=0)
    make_env = replay_env(recordings)
    scored = search_dsd(make_env, config, [{"concurrency": 1}, {"concurrency": 8}], ranges=((1, 1), (2, 16)),
                        ks=(0, 2, 8))
    assert sorted(r["label"] for r in scored) == sorted(
        f"dsd:1-1:{a},2-16:{b}" for a in (0, 2, 8) for b in (0, 2, 8) if a >= b)
    assert [r["score"] for r in scored] == sorted((r["score"] for r in scored), reverse=True)
    results = run_eval(tmp_path, policies="none,fixed:2,fixed:8", concurrency=[1, 8], config=config,
                               make_env=make_env)
    for k in (0, 2, 8):
        entry = next(r for r in scored if r["label"] == f"dsd:1-1:{k},2-16:{k}")
        if k == 0:
            assert entry["score"] == pytest.approx(1.0)
            continue
        speedups = [results["concurrency"][c]["policies"][f"fixed:{k}"]["speedup_vs_none"] for c in ("1", "8")]
        assert entry["score"] == pytest.approx(float(np.exp(np.mean(np.log(speedups)))))
    with pytest.raises(ValueError, match="contiguous"):
        search_dsd(make_env, config, [{"concurrency": 1}], ranges=((1, 1), (3, 16)))


def test_class_policies_name_a_proposer_class_and_k():
    """``vllm-class:MODULE.Class:K`` evaluates another custom_class proposer (a reference) in vLLM."""
    from draftrl.decoding.vllm.engine import VLLMEngineConfig
    from draftrl.eval.policy_names import parse_policies

    spec = parse_policies("none,vllm-class:ref_lookup.RefLookupLatest:4", engine="vllm")[1]
    assert (spec.kind, spec.path, spec.depth) == ("vllm-class", "ref_lookup.RefLookupLatest", 4)
    for bad in ("vllm-class:RefLookupLatest:4", "vllm-class:ref_lookup.RefLookupLatest",
                "vllm-class:ref_lookup.RefLookupLatest:0"):
        with pytest.raises(ValueError, match="vllm-class:MODULE.Class:K"):
            parse_policies(bad, engine="vllm")
    config = VLLMEngineConfig(method="custom_class", proposer="ref_lookup.RefLookupLatest", num_speculative_tokens=4)
    assert config.speculative_config() == {"method": "custom_class", "model": "ref_lookup.RefLookupLatest",
                                           "num_speculative_tokens": 4}
    for method, proposer in (("custom_class", None), ("ngram", "ref_lookup.RefLookupLatest")):
        with pytest.raises(ValueError, match="custom_class"):
            VLLMEngineConfig(method=method, proposer=proposer)


def test_policies_are_grouped_by_engine_and_passes_reuse_the_engine_they_end_on():
    """One engine at a time: policies that share a vLLM config run back to back on it; each pass
    opens with the group the previous one closed with (no rebuild there); over as many passes as
    groups every group takes every place once, and every policy every place in its group."""
    from draftrl.eval.policy_names import parse_policies
    from draftrl.eval.serve.compare import engine_groups, pass_order

    names = "none,fixed:2,vllm-ngram:2,heuristic,vllm-ngram:4,dsd,fixed:4:8,fixed:2@eagle3,stop:4:t0.6@eagle3"
    specs = parse_policies(names, engine="vllm")
    groups = engine_groups(specs, ServeConfig())
    labels = [[s.label for s in g] for g in groups]
    assert labels == [["none"], ["fixed:2", "heuristic", "dsd", "fixed:4:8"], ["vllm-ngram:2"], ["vllm-ngram:4"],
                      ["fixed:2@eagle3", "stop:4:t0.6@eagle3"]]  # one drafter, one engine
    assert [[s.label for s in g] for g in engine_groups(specs)] == [[s.label] for s in specs]  # the replay
    n = len(groups)
    orders = [[s.label for s in pass_order(groups, i)] for i in range(2 * n)]
    group_of = {label: gi for gi, group in enumerate(labels) for label in group}
    for order in orders:
        assert sorted(order) == sorted(names.split(","))
        runs = [group_of[label] for label in order]
        assert [g for i, g in enumerate(runs) if i == 0 or g != runs[i - 1]] == list(dict.fromkeys(runs))  # contiguous
    for before, after in zip(orders, orders[1:]):
        assert group_of[before[-1]] == group_of[after[0]]  # the engine the pass ended on opens the next
    firsts = [group_of[order[0]] for order in orders[:n]]
    assert sorted(firsts) == list(range(n))  # every group opens a pass once in n passes
    fixed = [[label for label in order if group_of[label] == 1] for order in orders[:4]]
    assert sorted(f[0] for f in fixed) == sorted(labels[1])  # and inside a group every policy leads once


def test_the_replay_drafts_with_the_policys_drafter_or_refuses_it(tmp_path):
    """Each episode's env gets the policy's drafter (``@DRAFTER``, else the run's) in its config: the
    replay maps a head drafter to the head it replays, and refuses, in one line, a drafter whose
    proposals it does not hold (here: no head proposals; another n-gram drafter than the
    proposer's) instead of replaying n-gram lookup under its name."""
    from draftrl.replay.serve_engine import replay_drafter

    recordings = synthetic_recordings(4)
    config = ServeConfig(max_new_tokens=TOKENS, shuffle=False, seed=0)
    assert replay_drafter(config) == "ngram" and replay_drafter(config, "hindsight") == "hindsight"
    assert replay_drafter(ServeConfig(drafter="eagle3:runs/head")) == "eagle3"
    assert (replay_drafter(ServeConfig(drafter="sam:3")) == replay_drafter(ServeConfig(drafter="sam:3"), "sam:3")
            == "sam:3")
    for drafter, given in (("ngram:1:4", "ngram"), ("sam:2", "eagle3")):
        with pytest.raises(ValueError, match=f"drafter={drafter!r} cannot be replayed with drafter={given!r}"):
            replay_drafter(ServeConfig(drafter=drafter), given)
    seen = []

    def make_env(cfg, spec):
        seen.append((spec.label, cfg.drafter))
        return ServeVLLMEnv(cfg, engine="replay", recordings=recordings, calibration=COST)

    with pytest.raises(ValueError, match="drafter='eagle3' replays the head: pass head_proposals"):
        run_eval(tmp_path, policies="none,fixed:2,fixed:2@eagle3", concurrency=[1],
                         config=config, make_env=make_env)
    assert ("fixed:2", "ngram:1:3:latest") in seen and seen[-1] == ("fixed:2@eagle3", "eagle3")


def test_fixed_k_is_searched_on_the_mix_and_per_class_under_the_hindsight_ceiling():
    """On a mix whose hotter classes accept the n-gram drafts less: the search scores every K on the
    mix (best first) and per class, a greedy request gains more from deep drafts than a T=1 one, and
    the replay's hindsight ceiling is above every fixed K at every load."""
    from serve_recordings import synthetic_mix_recordings

    from draftrl.eval.serve.dsd_search import hindsight_bound, search_fixed

    config = ServeConfig(temperature_mix={0: 0.4, 0.7: 0.3, 1.0: 0.3}, max_new_tokens=TOKENS, shuffle=False, seed=0,
                         num_requests=12)
    make_env = replay_env(synthetic_mix_recordings(12, 2))
    loads = [{"concurrency": 1}, {"concurrency": 8}]
    found = search_fixed(make_env, config, loads, ks=(1, 2, 8))
    assert sorted(r["label"] for r in found["scores"]) == ["fixed:1", "fixed:2", "fixed:8"]
    assert [r["score"] for r in found["scores"]] == sorted((r["score"] for r in found["scores"]), reverse=True)
    assert found["best"] == found["scores"][0]["label"]
    assert set(found["per_class"]) == {"T0", "T0.7", "T1"}
    for cls, best in found["per_class"].items():
        assert best["score"] == max(r["class_scores"][cls] for r in found["scores"])
    deep = next(r for r in found["scores"] if r["label"] == "fixed:8")["class_scores"]
    assert deep["T0"] > deep["T1"]
    bound = hindsight_bound(make_env, config, loads)
    assert list(bound) == ["concurrency=1", "concurrency=8"]
    for name, ceiling in bound.items():
        assert ceiling > max(r["speedups"][name] for r in found["scores"])
