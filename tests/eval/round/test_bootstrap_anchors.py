"""Paired bootstrap intervals (resolved / not resolved) and the anchors' summaries, on synthetic runs."""

from __future__ import annotations

import numpy as np
import pytest

from draftrl.eval.bootstrap import format_ci, paired_ratio_ci, requests_needed
from draftrl.eval.round.anchors import AnchorRun, anchor_ngram, anchors_for, summarize_anchors


def synthetic(n: int, speedup: float, noise: float, seed: int = 0):
    """n requests: B takes 1-3 s for 50 tokens, A is ``speedup`` times faster with lognormal noise
    of alternating sign (so that the drawn noise does not shift the mean ratio)."""
    rng = np.random.default_rng(seed)
    tokens = np.full(n, 50.0)
    seconds_b = rng.uniform(1.0, 3.0, n)
    seconds_a = seconds_b / speedup * np.exp(np.abs(rng.normal(0.0, noise, n)) * np.resize([1.0, -1.0], n))
    return tokens, seconds_a, tokens, seconds_b


def test_ratio_is_the_tables_throughput_ratio() -> None:
    ta, sa, tb, sb = synthetic(12, 1.1, 0.05)
    ci = paired_ratio_ci(ta, sa, tb, sb)
    assert ci["ratio"] == pytest.approx((ta.sum() / sa.sum()) / (tb.sum() / sb.sum()))
    assert ci["low"] <= ci["ratio"] <= ci["high"] and ci["num_requests"] == 12


def test_a_clear_difference_is_resolved() -> None:
    ci = paired_ratio_ci(*synthetic(32, 1.10, 0.03))
    assert ci["resolved"] and ci["verdict"] == "faster" and ci["low"] > 1.0
    slower = paired_ratio_ci(*synthetic(32, 0.9, 0.03))
    assert slower["verdict"] == "slower" and slower["high"] < 1.0


def test_a_small_difference_on_few_noisy_requests_is_not_resolved() -> None:
    ci = paired_ratio_ci(*synthetic(8, 1.02, 0.3))
    assert not ci["resolved"] and ci["verdict"] == "not resolved" and ci["low"] <= 1.0 <= ci["high"]
    assert format_ci(ci).endswith("not resolved")


def test_identical_runs_and_edge_cases() -> None:
    ta, sa, _, _ = synthetic(10, 1.0, 0.1)
    same = paired_ratio_ci(ta, sa, ta, sa)
    assert same["ratio"] == pytest.approx(1.0) and not same["resolved"]
    assert paired_ratio_ci([], [], [], [])["ratio"] is None and format_ci(None) == "-"
    assert format_ci({"ratio": 1.0, "reference": True}) == "1.00x (reference)"
    with pytest.raises(ValueError, match="differ in length"):
        paired_ratio_ci([1, 2], [1, 2], [1], [1])


def test_requests_needed_follows_the_normal_approximation() -> None:
    assert requests_needed(0.1, 0.05) == int(np.ceil((1.96 * 0.1 / np.log(1.05)) ** 2)) == 17
    assert requests_needed(0.2, 0.05) > requests_needed(0.1, 0.05)


def run(label: str, prompt: str, task: str, tokens: int, seconds: float, forwards: int, repeat: int = 0) -> AnchorRun:
    return AnchorRun(label, prompt, "en", task, repeat, list(range(tokens)), seconds, forwards)


def test_summarize_anchors_picks_the_best_lookup_gamma_and_median_repeats() -> None:
    runs = [run("hf", "p1", "chat", 10, 2.0, 11), run("hf", "p1", "chat", 10, 9.0, 11, 1),
            run("hf", "p1", "chat", 10, 1.0, 11, 2),  # median of 1, 2, 9 -> 2
            run("hf-lookup:2", "p1", "chat", 10, 1.0, 6), run("hf-lookup:8", "p1", "chat", 10, 1.5, 4)]
    out = summarize_anchors(runs)
    assert out["methods"]["hf"]["tokens_per_second"] == pytest.approx(5.0)
    assert out["best_lookup"] == "hf-lookup:2"
    assert out["methods"]["hf-lookup:8"]["tokens_per_forward"] == pytest.approx(2.5)
    assert out["methods"]["hf"]["per_task"]["chat"]["num_requests"] == 1


def test_anchor_labels_and_ngram() -> None:
    assert [a.label for a in anchors_for((4, 1, 4))] == ["hf", "hf-lookup:1", "hf-lookup:4"]
    assert anchor_ngram("ngram") == 3 and anchor_ngram("ngram:1:5") == 5 and anchor_ngram("layerskip:8") == 3


def test_eval_times_the_grids_best_lookup_gamma_only() -> None:
    import dataclasses

    from draftrl.eval.round.compare import eval_anchors
    from draftrl.eval.round.config import EvalConfig

    config = EvalConfig()
    assert [a.label for a in eval_anchors(config, None)] == ["hf", "hf-lookup:1", "hf-lookup:2", "hf-lookup:4",
                                                              "hf-lookup:8"]
    grid = {"anchors": {"best_lookup": "hf-lookup:4", "methods": {}}}
    assert [a.label for a in eval_anchors(config, grid)] == ["hf", "hf-lookup:4"]
    config.eval = dataclasses.replace(config.eval, anchors=False)
    assert eval_anchors(config, grid) == []
    with pytest.raises(ValueError, match="anchor_gammas"):
        dataclasses.replace(config.eval, anchor_gammas=(0, 2))


@pytest.mark.parametrize("gamma", [0, 2])
def test_anchors_decode_past_eos_when_the_engine_ignores_it(gamma) -> None:
    """``env.ignore_eos`` gives the anchors no EOS ids: HF generate runs to ``max_new_tokens`` past the
    model's EOS, token for token as draftrl's plain decoding does (it used to fail on an empty list);
    with the EOS ids it stops there, EOS included."""
    from types import SimpleNamespace

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.decoding.generate import fixed_schedule, generate
    from draftrl.eval.round.anchors import Anchor, run_anchor

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    request = SimpleNamespace(prompt_ids=[1, 2, 3, 4], max_new_tokens=12,
                              prompt=SimpleNamespace(id="p", language="en", task="chat"))
    engine = SpeculativeDecoder(model, None, EngineConfig(max_new_tokens=12), eos_token_ids=[])
    plain = generate(engine, request.prompt_ids, fixed_schedule(0)).token_ids
    eos = plain[1]  # the model's EOS: a token it writes early
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    ignored = run_anchor(model, Anchor(gamma), request, eos_token_ids=[])
    assert ignored.token_ids == plain and len(plain) == 12
    stopped = run_anchor(model, Anchor(gamma), request, eos_token_ids=[eos])
    assert stopped.token_ids == plain[:2]


def test_the_hf_reference_decodes_past_eos_when_the_engine_ignores_it() -> None:
    """``eval``'s check against HF ``generate`` (``hf_greedy``) with no EOS ids runs to ``max_new_tokens`` as
    the engine does under ``env.ignore_eos``, past the EOS the model's config names; with EOS ids it stops there."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.decoding.generate import fixed_schedule, generate
    from draftrl.eval.exactness import hf_greedy

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    engine = SpeculativeDecoder(model, None, EngineConfig(max_new_tokens=12), eos_token_ids=[])
    plain = generate(engine, [1, 2, 3, 4], fixed_schedule(0)).token_ids
    model.config.eos_token_id = model.generation_config.eos_token_id = plain[1]
    assert hf_greedy(model, [1, 2, 3, 4], 12, []) == plain and len(plain) == 12
    assert hf_greedy(model, [1, 2, 3, 4], 12, [plain[1]]) == plain[:2]
