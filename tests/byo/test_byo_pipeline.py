"""The path a user takes with their own models, through the real CLI, in float32 and bfloat16 (CPU):
``draftrl calibrate``, ``collect``, ``train``, ``grid``, ``eval`` and ``export --format vllm`` on a
tiny random Llama target folder with a draft model padded past the tokenizer and EAGLE-3 heads in
both published layouts (conftest.py), each step run to the end and its exactness verdict checked.

What each step's verdict is, by dtype (docs/design.md, "Exactness by dtype"):

- collect: the greedy continuation it records (decoded speculatively, every token checked against the
  argmax of the forward that verified it) against plain decoding (Hugging Face ``generate``) under
  grid's rule: bitwise identical in float32; in bfloat16 identical or diverging at a near-tie only;
- grid and eval: their greedy verdicts (``grid.json`` / ``results.json``, printed): float32 bitwise
  identity with plain decoding on every comparison; bfloat16 the agreement rate, every divergence a
  near-tie, no violation, and eval's per-token argmax check and monitor passed;
- train: the policy is trained on the collected traces (replayed: no decoding); eval then decodes
  with it (``ppo:RUN``) under the checks above;
- export: the bundle stock vLLM runs, the drafter copied so that vLLM reads it as draftrl did
  (tests/byo/test_byo_vllm.py serves the float32 bundles in vLLM).
"""

from __future__ import annotations

import json

import pytest
from byo_steps import DRAFTERS, DTYPES, cli

from draftrl.replay.traces import Traces

PIPELINES = [pytest.param(d, t, id=f"{d}-{t}") for d in DRAFTERS for t in DTYPES]
#: requests per split (byo_models.WORKLOAD) and the grid's drafted cells (conftest.byo_config)
NUM_REQUESTS, GRID_CELLS = 2, ("d2_v0_w1", "d3_v0_w1")


def check_verdict(verdict: dict, dtype: str, comparisons: int) -> None:
    """The greedy verdict of ``dtype``: float32 bitwise identity passed; bfloat16 the agreement rate with
    no violation (near-ties reported)."""
    assert verdict["checked"] and verdict["dtype"] == dtype and verdict["passed"], verdict
    assert verdict["comparisons"] == comparisons
    if dtype == "float32":
        assert verdict["mode"] == "bitwise" and verdict["identical"] == comparisons
        return
    assert verdict["mode"] == "near-tie" and verdict["num_violations"] == 0 and verdict["near_tie_ulps"] == 8.0
    assert verdict["identical"] == round(verdict["agreement_rate"] * comparisons)
    assert verdict["num_divergences"] == verdict["num_near_ties"] == comparisons - verdict["identical"]
    assert all(d["near_tie"] and d["margin_ulps"] <= d["near_tie_ulps"] for d in verdict["divergences"])


def printed_verdict(out: str, dtype: str) -> None:
    mode = "greedy identity with plain decoding (float32, bitwise): passed" if dtype == "float32" else \
        "greedy agreement with plain decoding (bfloat16)"
    assert f"exactness: {mode}" in out, out


@pytest.mark.parametrize("drafter,dtype", PIPELINES)
def test_collect_records_the_targets_greedy_output(byo_pipeline, drafter, dtype):
    from draftrl.eval.agreement import GreedyAgreement
    from draftrl.eval.exactness import hf_greedy
    from draftrl.models import load_model

    p = byo_pipeline(drafter, dtype)
    traces = Traces.load(p.traces)
    assert len(traces) == NUM_REQUESTS and traces.max_depth == 3 and traces.meta["config"]["dtype"] == dtype
    assert traces.meta["drafter"] == json.loads((p.traces / "trace.json").read_text())["config"]["drafter"]
    assert len(traces.node_tokens) > 0  # the drafter proposed trees at the recorded positions
    target = load_model(str(p.target), dtype=dtype)
    agreement = GreedyAgreement(target.model, dtype, raise_at_once=False, tokenizer=target.tokenizer)
    for i, prompt in enumerate(traces.prompts):
        ids = traces.prompt_tokens[traces.cu_num_prompt_tokens[i]:traces.cu_num_prompt_tokens[i + 1]].tolist()
        continuation = traces.continuation[traces.cu_num_positions[i]:traces.cu_num_positions[i + 1]].tolist()
        plain = hf_greedy(target.model, ids, traces.budgets[i], [target.tokenizer.eos_token_id])
        agreement.compare("collect", prompt.id, ids, plain, continuation)
    check_verdict(agreement.verdict(), dtype, NUM_REQUESTS)


@pytest.mark.parametrize("drafter,dtype", PIPELINES)
def test_train_learns_on_the_collected_traces(byo_pipeline, drafter, dtype):
    p = byo_pipeline(drafter, dtype)
    config = json.loads((p.run / "config.json").read_text())
    assert (p.run / config["env"]["traces"]).resolve() == p.traces.resolve()  # stored relative to the run
    assert config["env"]["id"] == "draftrl/TraceReplay-v1" and config["env"]["dtype"] == dtype
    assert config["env"]["drafter"] == json.loads((p.traces / "trace.json").read_text())["config"]["drafter"]
    summary = json.loads((p.run / "train_summary.json").read_text())
    assert summary["num_timesteps"] >= 256 and "ppo" in summary["evaluation"]["table"]
    assert (p.run / "policy.zip").is_file()


@pytest.mark.parametrize("drafter,dtype", PIPELINES)
def test_grid_runs_to_the_end_with_its_verdict(byo_pipeline, drafter, dtype):
    p = byo_pipeline(drafter, dtype)
    grid = json.loads((p.grid / "grid.json").read_text())
    assert set(grid["cells"]) == {"d0_v0_w1", *GRID_CELLS}
    assert grid["exactness"]["passed"]
    check_verdict(grid["exactness"]["greedy_identity"], dtype, NUM_REQUESTS * len(GRID_CELLS))


@pytest.mark.parametrize("drafter,dtype", PIPELINES)
def test_eval_compares_the_trained_policy_with_its_verdict(byo_pipeline, drafter, dtype, tmp_path, capsys):
    p = byo_pipeline(drafter, dtype)
    capsys.readouterr()
    cli("eval", "--config", p.config, "--grid", p.grid / "grid.json", "--policies", f"none,best-grid,ppo:{p.run}",
        "--out", tmp_path / "eval", "--quiet")
    printed_verdict(capsys.readouterr().out, dtype)
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    ex = results["exactness"]
    assert ex["passed"]
    check_verdict(ex["greedy_identity"], dtype, NUM_REQUESTS * 2)  # best-grid and the PPO policy
    check_verdict(ex["grid_greedy_identity"], dtype, NUM_REQUESTS * len(GRID_CELLS))
    assert ex["hf_reference"]["checked"] == 1 and ex["hf_reference"]["passed"]
    assert any(name.startswith("ppo") for name in results["policies"])


@pytest.mark.parametrize("drafter,dtype", PIPELINES)
def test_export_writes_a_bundle_stock_vllm_reads_as_draftrl_trained(byo_pipeline, drafter, dtype, tmp_path):
    from draftrl.drafters.eagle3 import head_config

    p = byo_pipeline(drafter, dtype)
    out = tmp_path / "bundle"
    cli("export", p.run, "--format", "vllm", "--out", out)
    bundle = json.loads((out / "vllm.json").read_text())
    spec = bundle["speculative_config"]
    assert bundle["route"] == "stock" and bundle["target"] == str(p.target)
    assert spec["method"] == ("draft_model" if drafter == "my_draft" else "eagle3") and spec["model"] == "./drafter"
    assert spec["num_speculative_tokens"] == bundle["derivation"]["k1"] >= 1  # depths 1-3: the policy drafts
    assert sorted(q.name for q in out.iterdir()) == ["drafter", "vllm.json"]
    assert str(p.folder.parent) not in bundle["python"] + bundle["serve"]  # the lines run from the bundle
    copied = {q.name for q in (out / "drafter").iterdir()}
    assert copied == {q.name for q in p.folder.iterdir()}
    for name in copied - {"config.json"}:
        assert (out / "drafter" / name).read_bytes() == (p.folder / name).read_bytes(), name
    given, written = (json.loads((d / "config.json").read_text()) for d in (p.folder, out / "drafter"))
    if drafter == "my_speculators_head":  # the one key vLLM reads otherwise than draftrl, stated as draftrl read it
        assert "norm_before_residual" not in given and written == {**given, "norm_before_residual": False}
        assert head_config(out / "drafter") == head_config(p.folder)
        assert any("norm_before_residual=false written" in note for note in bundle["notes"])
    else:
        assert written == given
    # the padded draft scores 1,088 ids, the target 1,024: vLLM's draft_model accepts it with the flag only
    assert spec.get("use_heterogeneous_vocab", False) is (drafter == "my_draft")


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_wrong_acceptance_is_still_caught_on_the_users_models(byo_pipeline, dtype, tmp_path, capsys):
    """Negative control of the verdicts above: ``off-by-one`` (keeps a round's first rejected draft token)
    with the padded draft model, whose drafts the target both accepts and rejects, stops eval with exit 3
    in either dtype: the engine's per-token argmax check, after the partial results were written."""
    from draftrl.cli import main

    p = byo_pipeline("my_draft", dtype)
    out = tmp_path / "eval"
    assert main(["eval", "--config", str(p.config), "--policies", "none,fixed:3", "--sampler", "off-by-one",
                 "--out", str(out), "--quiet"]) == 3
    assert "argmax" in capsys.readouterr().err
    failure = json.loads((out / "results.json").read_text())["exactness"]["failure"]
    assert failure["error"] == "ArgmaxViolation" and failure["evidence"][0]["statistic"] == "argmax"
