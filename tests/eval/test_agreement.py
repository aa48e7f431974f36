"""``draftrl.eval.agreement``: greedy agreement with plain decoding, bitwise in float32, a rate with near-ties below.

A tiny random Llama in bfloat16 gives real logits: a divergence planted at the position where the
target's top two logits are closest is a near-tie under a tolerance between the two extreme
margins, one planted where they are farthest apart is a violation (raised, or recorded and raised
after the caller wrote its files); float32 raises on any difference, as it always has.
"""

from __future__ import annotations

import pytest
import torch

from draftrl.eval.agreement import (
    AgreementViolation,
    GreedyAgreement,
    default_near_tie_ulps,
    divergence_margin,
    logit_ulp,
    raise_first_violation,
    verdict_lines,
)
from draftrl.eval.exactness import GreedyMismatch

PROMPT = [1, 2, 3, 4]
LENGTH = 12

pytestmark = pytest.mark.usefixtures("one_thread")


def _llama(dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # logits of a few units, as a trained model's
    return model.to(dtype)


@pytest.fixture(scope="module")
def bf16():
    return _llama(torch.bfloat16)


@torch.inference_mode()
def _greedy(model) -> tuple[list[int], list[torch.Tensor]]:
    """Plain greedy continuation and, per position, the row of one full forward over prompt + prefix."""
    ids, rows = list(PROMPT), []
    for _ in range(LENGTH):
        row = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        rows.append(row)
        ids.append(int(row.argmax()))
    return ids[len(PROMPT):], rows


def _ulps(row: torch.Tensor) -> float:
    top = row.topk(2).values
    return float(top[0] - top[1]) / logit_ulp("bfloat16", float(top.abs().max()))


def test_the_ulp_is_the_dtype_spacing_at_the_logit():
    assert logit_ulp("bfloat16", 20.0) == 0.125 and logit_ulp("bfloat16", -20.0) == 0.125
    assert logit_ulp("bfloat16", 1.0) == 2.0 ** -7 and logit_ulp("bfloat16", 0.3) == 2.0 ** -9
    assert logit_ulp("float16", 20.0) == 2.0 ** -6
    x = torch.tensor(20.0, dtype=torch.bfloat16)
    assert float(x + 0.125) == 20.125 and float(x + 0.05) == 20.0  # 0.125 apart: the next bfloat16 number
    assert default_near_tie_ulps("float32") is None and default_near_tie_ulps("bfloat16") > 0


def test_float32_demands_bitwise_identity():
    model = _llama(torch.float32)
    reference, _ = _greedy(model)
    check = GreedyAgreement(model, "float32", near_tie_ulps=1e9)  # the tolerance is not read in float32
    assert check.compare("d2", "p0", PROMPT, reference, list(reference)) is None
    wrong = reference[:5] + [(reference[5] + 1) % 64] + reference[6:]
    with pytest.raises(GreedyMismatch, match="output position 5"):
        check.compare("d2", "p1", PROMPT, reference, wrong)
    assert check.verdict()["mode"] == "bitwise"


def test_low_precision_reports_near_ties_and_raises_on_large_margins(bf16):
    reference, rows = _greedy(bf16)
    margins = [_ulps(r) for r in rows]
    near, far = min(range(LENGTH), key=margins.__getitem__), max(range(LENGTH), key=margins.__getitem__)
    assert margins[far] > margins[near] + 2  # enough room for a tolerance between them
    ulps = (margins[near] + margins[far]) / 2

    def planted(at: int) -> list[int]:
        second = int(rows[at].topk(2).indices[1])
        return reference[:at] + [second] + reference[at + 1:]

    check = GreedyAgreement(bf16, "bfloat16", near_tie_ulps=ulps)
    assert check.compare("d4", "p0", PROMPT, reference, list(reference)) is None
    record = check.compare("d4", "p1", PROMPT, reference, planted(near))
    assert record["near_tie"] and record["position"] == near and record["reference_token"] == reference[near]
    direct = divergence_margin(bf16, PROMPT + reference[:near], reference[near], record["output_token"])
    assert record["margin"] == direct["margin"] == pytest.approx(float(rows[near].topk(2).values.diff().neg()))
    assert record["margin_ulps"] <= ulps and record["tolerance"] == pytest.approx(ulps * record["resolution"])
    with pytest.raises(AgreementViolation, match=f"output position {far}") as err:
        check.compare("d2", "p2", PROMPT, reference, planted(far))
    assert isinstance(err.value, GreedyMismatch) and err.value.evidence["margin_ulps"] > ulps

    verdict = check.verdict()
    assert verdict["mode"] == "near-tie" and not verdict["passed"]
    assert verdict["comparisons"] == 3 and verdict["identical"] == 1
    assert verdict["agreement_rate"] == pytest.approx(1 / 3)
    assert verdict["token_agreement"] == pytest.approx((LENGTH + near + far) / (3 * LENGTH))
    assert (verdict["num_near_ties"], verdict["num_violations"]) == (1, 1)
    assert verdict["per_setting"]["d4"]["identical"] == 1 and verdict["per_setting"]["d2"]["identical"] == 0
    assert verdict["divergences"][0]["near_tie"] is False  # violations first
    text = "\n".join(verdict_lines(verdict))
    assert "1/3 identical" in text and "VIOLATION" in text and "near-tie" in text and f"{far}" in text
    table = verdict_lines(verdict, markdown=True)
    assert table[2].startswith("| setting |") and len(table) == 4 + 2  # head, blank, header, rule, 2 rows


def test_a_recorded_violation_is_raised_by_the_caller_after_writing(bf16):
    reference, rows = _greedy(bf16)
    far = max(range(LENGTH), key=lambda t: _ulps(rows[t]))
    wrong = reference[:far] + [int(rows[far].topk(2).indices[1])] + reference[far + 1:]
    check = GreedyAgreement(bf16, "bfloat16", near_tie_ulps=0.5, raise_at_once=False)
    record = check.compare("d4", "p0", PROMPT, reference, wrong)
    assert not record["near_tie"]
    verdict = check.verdict()
    assert not verdict["passed"]
    with pytest.raises(AgreementViolation, match="above the near-tie tolerance"):
        raise_first_violation(verdict)
    raise_first_violation({"checked": True, "mode": "bitwise", "passed": True})  # nothing to raise


def test_outputs_that_differ_only_in_length_raise_in_low_precision(bf16):
    reference, _ = _greedy(bf16)
    with pytest.raises(GreedyMismatch):
        GreedyAgreement(bf16, "bfloat16").compare("d2", "p0", PROMPT, reference, reference[:-2])


def test_the_tolerance_setting_is_validated():
    from draftrl.eval.round.config import PolicyEvalConfig

    assert PolicyEvalConfig(near_tie_ulps=4).near_tie_ulps == 4
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="eval.near_tie_ulps"):
            PolicyEvalConfig(near_tie_ulps=bad)
