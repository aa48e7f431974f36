"""grid and eval on a user's own target in bfloat16 (a tiny random Llama folder, CPU): they run to the end
and print the greedy verdict; a genuine mismatch still stops them in either dtype.

Negative controls: the ``off-by-one`` sampler (keeps a round's first rejected draft token) is caught
by the engine's per-token argmax check in bfloat16 (exit 3); with that check removed (a deliberately
broken engine) the comparison with plain decoding still raises: ``GreedyMismatch`` in float32
(bitwise identity, as always) and ``AgreementViolation`` in bfloat16 (its margins are far above the
near-tie tolerance), after the partial results were written.
"""

from __future__ import annotations

import json

import pytest
import torch

from draftrl.cli import main

SETTINGS = ["env.languages=[en]", "env.tasks=[code_edit,chat]", "env.limit_per_group=1", "env.max_new_tokens=24",
            "env.kernels=stock", "env.drafter=ngram", "grid.depths=[0,2,4]", "grid.repeats=1", "eval.anchors=false",
            "eval.greedy_reference=1", "eval.policies=[none,fixed:2,fixed:4,heuristic]", "threads=1"]
COMMON = [arg for item in SETTINGS for arg in ("--set", item)]


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("DRAFTRL_CACHE", str(tmp_path / "cache"))  # the kernel plan of a temporary model


@pytest.fixture(scope="module")
def my_target(tmp_path_factory):
    """"My target": a random 4-layer Llama saved with save_pretrained, SmolLM2's tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from draftrl.models.fetch import fetch_model

    tokenizer = AutoTokenizer.from_pretrained(fetch_model("smollm2-135m", quiet=True))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("my-target")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _config(target: str, dtype: str, *extra: str):
    from draftrl.config import load_config
    from draftrl.eval.round.config import EvalConfig

    return load_config(EvalConfig, None, [*SETTINGS, f"env.target={target}", f"env.dtype={dtype}", *extra])


def test_bfloat16_grid_and_eval_run_to_the_end_and_print_the_verdict(my_target, tmp_path, capsys):
    grid_out, eval_out = tmp_path / "grid", tmp_path / "eval"
    assert main(["grid", "--target", my_target, "--dtype", "bfloat16", "--out", str(grid_out), "--quiet", *COMMON]) == 0
    printed = capsys.readouterr().out
    assert "exactness: greedy agreement with plain decoding (bfloat16)" in printed
    verdict = json.loads((grid_out / "grid.json").read_text())["exactness"]["greedy_identity"]
    assert verdict["mode"] == "near-tie" and verdict["dtype"] == "bfloat16" and verdict["passed"]
    assert verdict["comparisons"] == 4 and set(verdict["per_setting"]) == {"d2_v0_w1", "d4_v0_w1"}
    assert verdict["near_tie_ulps"] == 8.0 and verdict["num_violations"] == 0

    assert main(["eval", "--target", my_target, "--dtype", "bfloat16", "--grid", str(grid_out / "grid.json"),
                 "--out", str(eval_out), "--quiet", *COMMON]) == 0
    printed = capsys.readouterr().out
    assert "greedy agreement with plain decoding (bfloat16)" in printed
    results = json.loads((eval_out / "results.json").read_text())
    ex = results["exactness"]
    assert ex["passed"] and ex["greedy_identity"]["mode"] == "near-tie"
    assert ex["greedy_identity"]["comparisons"] == 2 * 3  # 2 requests x (fixed:2, fixed:4, heuristic)
    assert ex["grid_greedy_identity"]["comparisons"] == 4
    assert ex["hf_reference"]["checked"] == 1 and ex["hf_reference"]["passed"]
    report = (eval_out / "report.md").read_text()
    assert "Greedy agreement with plain decoding (held-out split), bfloat16: passed." in report
    assert "Greedy agreement of the grid's cells with plain decoding (tune split)" in report


def test_off_by_one_is_caught_by_the_engine_in_bfloat16(my_target, tmp_path, capsys):
    code = main(["eval", "--target", my_target, "--dtype", "bfloat16", "--sampler", "off-by-one",
                 "--out", str(tmp_path / "eval"), "--quiet", *COMMON])
    assert code == 3
    assert "argmax" in capsys.readouterr().err
    failure = json.loads((tmp_path / "eval" / "results.json").read_text())["exactness"]["failure"]
    assert failure["error"] == "ArgmaxViolation" and failure["evidence"][0]["statistic"] == "argmax"


@pytest.fixture
def broken_engine(monkeypatch):
    """The engine without its per-token argmax check: the off-by-one acceptance then reaches the output."""
    import draftrl.decoding.engine as engine

    monkeypatch.setattr(engine, "check_argmax", lambda *args, **kwargs: None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_genuine_mismatch_still_stops_the_evaluation(my_target, tmp_path, broken_engine, dtype):
    from draftrl.eval.agreement import AgreementViolation
    from draftrl.eval.exactness import GreedyMismatch
    from draftrl.eval.round.compare import run_eval

    config = _config(my_target, dtype, "eval.sampler=off-by-one", "eval.policies=[none,fixed:4]")
    with pytest.raises(GreedyMismatch) as err:
        run_eval(config, tmp_path)
    assert isinstance(err.value, AgreementViolation) == (dtype == "bfloat16")
    saved = json.loads((tmp_path / "results.json").read_text())["exactness"]
    assert saved["passed"] is False and saved["greedy_identity"]["passed"] is False
    if dtype == "bfloat16":
        evidence = saved["failure"]["evidence"]
        assert not evidence["near_tie"] and evidence["margin_ulps"] > evidence["near_tie_ulps"]


def test_a_bfloat16_grid_violation_is_raised_after_grid_json_is_written(my_target, tmp_path, broken_engine,
                                                                         monkeypatch):
    import draftrl.eval.round.grid as grid
    from draftrl.eval.agreement import AgreementViolation

    plain = grid.run_fixed

    def off_by_one(engine, request, depth, *args, **kwargs):  # every drafted cell runs the control
        engine.config.sampler = "off-by-one" if depth else "correct"
        return plain(engine, request, depth, *args, **kwargs)

    monkeypatch.setattr(grid, "run_fixed", off_by_one)
    with pytest.raises(AgreementViolation):
        grid.run_grid(_config(my_target, "bfloat16"), tmp_path)
    verdict = json.loads((tmp_path / "grid.json").read_text())["exactness"]
    assert verdict["passed"] is False and verdict["greedy_identity"]["num_violations"] >= 1
