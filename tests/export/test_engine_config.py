"""Engine configs derived from a policy (vLLM, SGLang): the cost-model rule and the files' keys."""

from __future__ import annotations

import json

import pytest

from draftrl.cli import main
from draftrl.export import engine_config as ec


# ----------------------------------------------------------------------------- the policy's summary
def test_the_depth_summary_and_the_vllm_table():
    assert ec.weighted_median({0: 11, 5: 8, 10: 2}) == 0 and ec.weighted_median({0: 9, 5: 10, 10: 2}) == 5
    assert ec.runs([3, 3, 2, 0, 0]) == [[1, 2, 3], [3, 3, 2], [4, 5, 0]]


# ----------------------------------------------------------------------------- files
def check_table(table, max_batch, k_max):
    assert table[0][0] == 1 and table[-1][1] == max_batch
    for (s0, e0, k0), (s1, e1, k1) in zip(table, table[1:]):
        assert s1 == e0 + 1 and k1 < k0  # contiguous, strictly shallower from range to range
    for start, end, k in table:
        assert isinstance(k, int) and 0 <= k <= k_max and start <= end


def test_a_refused_bundle_export_leaves_nothing_behind(analytic_run, tmp_path, capsys):
    """The analytic policy's network exports, then the engine check refuses it: no file may stay."""
    out = tmp_path / "bundle"
    assert main(["export", str(analytic_run), "--format", "vllm", "--out", str(out), "--check-observations", "16"]) == 2
    assert "cannot drive an engine" in capsys.readouterr().err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(analytic_run), "--format", "vllm", "--out", str(out), "--check-observations", "16"]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and len(list(tmp_path.iterdir())) == 1


def test_vllm_config_has_the_expected_keys(analytic_run, tmp_path):
    out = tmp_path / "vllm.json"
    assert main(["export", str(analytic_run), "--format", "vllm", "--out", str(out)]) == 0
    config = json.loads(out.read_text())
    assert config["format"] == ec.FORMAT and config["engine"] == "vllm" and config["engine_version"] == ec.VLLM_VERSION
    summary = json.loads((analytic_run / "train_summary.json").read_text())
    derivation = config["derivation"]
    assert derivation["depth_histogram"] == summary["evaluation"]["results"]["ppo"]["depth_histogram"]
    assert 0.0 <= derivation["cost_model"]["alpha"] <= 1.0 and derivation["cost_model"]["draft_cost"] == 0.1
    assert derivation["rule"] == ec.RULE
    spec = config["speculative_config"]
    if derivation["k1"] == 0:
        assert spec is None
    else:
        k = spec["num_speculative_tokens"]
        assert isinstance(k, int) and 1 <= k <= 12 and k == derivation["k1"]
        assert spec["method"] == "ngram" and spec["prompt_lookup_min"] <= spec["prompt_lookup_max"]
        check_table(spec["num_speculative_tokens_per_batch_size"], 512, k)
        assert spec["num_speculative_tokens_per_batch_size"][0][2] == k
    custom = config["custom_class_speculative_config"]
    assert custom == {"method": "custom_class", "model": ec.PROPOSER_CLASS, "num_speculative_tokens": 12}
    assert "DRAFTRL_PROPOSER_CONFIG" in config["custom_class_env"]
    check_table(derivation["policy_cap_by_batch"], 512, 12)
    assert derivation["policy_cap_by_batch"][0][2] == 12


def test_sglang_config_has_the_expected_keys(analytic_run, tmp_path):
    out = tmp_path / "sglang.json"
    assert main(["export", str(analytic_run), "--format", "sglang", "--out", str(out), "--algorithm", "eagle3",
                 "--max-batch-size", "256"]) == 0
    config = json.loads(out.read_text())
    assert config["engine"] == "sglang"
    derivation = config["derivation"]
    args = config["server_args"]
    if derivation["k1"] == 0:
        assert args is None
        return
    assert args["speculative_algorithm"] == "EAGLE3" and args["speculative_num_steps"] == derivation["k1"]
    assert args["speculative_eagle_topk"] == 1 and args["speculative_num_draft_tokens"] == derivation["k1"] + 1
    assert args["speculative_adaptive"] is True
    adaptive = json.loads((tmp_path / "sglang.json.adaptive.json").read_text())
    assert adaptive == config["adaptive_config"] and args["speculative_adaptive_config"].endswith(".adaptive.json")
    tiers = {k: v for k, v in adaptive.items() if k.isdigit()}
    assert adaptive["strategy"] == "ema" and "1" in tiers
    for tier in tiers.values():
        steps = tier["candidate_steps"]
        assert steps == sorted(set(steps)) and all(isinstance(s, int) and 0 <= s <= 12 for s in steps)
    assert derivation["k1"] in tiers["1"]["candidate_steps"]
    assert "--speculative-adaptive" in config["launch_args"] and "--speculative-num-steps" in config["launch_args"]
    # EAGLE3 loads a separate draft model: the key is there, and the notes say what to put in it
    assert args["speculative_draft_model_path"] == "<EAGLE draft model path>"
    assert ("--speculative-draft-model-path" in config["launch_args"]
            and "speculative_draft_model_path" in config["notes"][0])
    # the n-gram default: SGLang's adaptive mode needs EAGLE, so it is switched off and the file says why
    main(["export", str(analytic_run), "--format", "sglang", "--out", str(tmp_path / "ngram.json")])
    ngram = json.loads((tmp_path / "ngram.json").read_text())
    assert ngram["server_args"]["speculative_algorithm"] == "NGRAM"
    assert ngram["server_args"]["speculative_adaptive"] is False and "EAGLE" in ngram["notes"][0]
    assert ngram["server_args"]["speculative_draft_model_path"] is None  # NGRAM drafts from the context


def test_sglang_standalone_gets_the_draft_model_path():
    derivation = {"k1": 3, "width": 1, "verify_size": 0, "drafter": "/models/smollm2-135m",
                  "depth_by_batch": [[1, 512, 3]], "deepest_common_by_batch": [[1, 512, 4]], "common_depths": [2, 3]}
    args = ec.sglang_config(derivation)["server_args"]
    assert args["speculative_algorithm"] == "STANDALONE"
    assert args["speculative_draft_model_path"] == "/models/smollm2-135m"


def test_replay_policy_configs_follow_its_drafter(replay_run, tmp_path):
    derivation = ec.derive(replay_run)
    assert derivation["drafter"] == "ngram" and derivation["cost_model"]["source"].startswith("cost table")
    config = ec.vllm_config(derivation)
    if config["speculative_config"] is not None:
        assert config["speculative_config"]["method"] == "ngram"
        assert config["speculative_config"]["prompt_lookup_max"] == 3


def test_checkpoint_depths_come_from_a_rollout(analytic_run):
    derivation = ec.derive(analytic_run / "checkpoints" / "ppo_1024_steps.zip", episodes=2)
    assert derivation["source"].startswith("rollout of 2 episodes")
    assert derivation["num_rounds"] > 0 and sum(derivation["depth_histogram"].values()) == derivation["num_rounds"]


def test_bad_arguments_are_refused(analytic_run):
    with pytest.raises(ValueError, match="saturation_tokens"):
        ec.derive(analytic_run, saturation_tokens=0)


def test_training_costs_read_the_analytic_envs_cost_model():
    """The exported cost model is the one the Analytic env trained with: its g(n) mapping, its
    defaults where the config left them out, and the env's error for a mapping that lacks a size."""
    from types import SimpleNamespace

    def trained(analytic: dict) -> SimpleNamespace:
        return SimpleNamespace(env_id="draftrl/Analytic-v0",
                               train_config={"env": {"id": "draftrl/Analytic-v0", "analytic": analytic}})

    costs = ec.training_costs(trained({"draft_cost": 0.2, "verify_cost": {1: 1.1, 2: 1.3}}), max_depth=2)
    assert costs["draft_cost"] == 0.2 and costs["verify_cost"] == [1.0, 1.1, 1.3]
    costs = ec.training_costs(trained({}), max_depth=3)
    assert costs["draft_cost"] == 0.05 and costs["verify_cost"] == [1.0] * 4
    with pytest.raises(ValueError, match=r"verify_cost mapping lacks sizes \[3\] reachable with the policy's depths"):
        ec.training_costs(trained({"verify_cost": {1: 1.1, 2: 1.3}}), max_depth=3)
