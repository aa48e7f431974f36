"""The monitor's statistics from vLLM-style top-N raw logprobs (no vLLM): exact p under top-k, the
tail event at temperature 1, and the monitor's verdict on correct and wrong samplers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftrl.decoding.monitor import ExactnessMonitor, ExactnessViolation
from draftrl.decoding.vllm.guards import _expand_kernel_impl
from draftrl.decoding.vllm.logprobs import TIE_MARGIN, logprobs_needed, token_stats_from_logprobs

VOCAB = 200


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _returned(raw: np.ndarray, x: int, n: int) -> dict[int, float]:
    """What vLLM returns for one token: the top n raw logprobs plus the emitted token's."""
    top = np.argsort(-raw, kind="stable")[:n]
    entry = {int(x): float(raw[x])}
    entry.update({int(t): float(raw[t]) for t in top})
    return entry


def _p(logits: np.ndarray, temperature: float, top_k: int) -> np.ndarray:
    z = logits / temperature
    if top_k:
        z = np.where(logits >= np.sort(logits)[-top_k], z, -np.inf)
    return _softmax(z)


def _stream(rng, temperature: float, top_k: int, n: int, tokens: int, sample_temperature: float):
    """Per position: raw logprobs of a random peaked distribution, a draft (the argmax) and a token
    drawn from the processed p at ``sample_temperature``."""
    out = []
    for _ in range(tokens):
        logits = rng.standard_normal(VOCAB) * 2.5
        raw = np.log(_softmax(logits))
        x = int(rng.choice(VOCAB, p=_p(logits, sample_temperature, top_k)))
        out.append((x, _returned(raw, x, n), int(np.argmax(logits))))
    return out


def _verdict(stream, temperature: float, top_k: int, n: int) -> dict:
    monitor = ExactnessMonitor()
    for x, entry, draft in stream:
        try:
            monitor.update(token_stats_from_logprobs([x], [entry], [draft], temperature=temperature, top_k=top_k,
                                                     num_logprobs=n))
        except ExactnessViolation:
            pass
    return monitor.report()


def test_logprobs_needed_says_which_settings_can_be_checked():
    assert logprobs_needed(0.7, 8, 1.0, 20) == (8 + TIE_MARGIN, "")
    assert logprobs_needed(1.0, 0, 1.0, 20) == (20, "")
    for settings in ((0.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 0, 0.9), (1.0, 17, 1.0)):
        n, why = logprobs_needed(*settings, 20)
        assert n is None and why


def test_top_k_stats_equal_the_exact_distribution():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(VOCAB) * 2.0
    raw = np.log(_softmax(logits))
    p = _p(logits, 0.7, 5)
    order = np.argsort(-p, kind="stable")
    for rank, x in enumerate(order[:5]):
        st = token_stats_from_logprobs([int(x)], [_returned(raw, x, 9)], [int(order[0])], temperature=0.7, top_k=5,
                                       num_logprobs=9)
        assert st.p_token[0] == pytest.approx(p[x], rel=1e-9)
        assert st.mass_before[0] == pytest.approx(p[order[:rank]].sum(), abs=1e-12)
        assert st.entropy[0] == pytest.approx(-(p[p > 0] * np.log(p[p > 0])).sum(), rel=1e-9)
        assert st.drafted[0] and st.agree[0] == float(rank == 0) and st.agree_expected[0] == pytest.approx(p[order[0]])
    outside = int(order[7])  # returned (within the margin) but cut by top-k: impossible
    st = token_stats_from_logprobs([outside], [_returned(raw, outside, 9)], [], temperature=0.7, top_k=5,
                                   num_logprobs=9)
    assert st.p_token[0] == 0.0


def test_temperature_one_lumps_the_tail_into_one_event():
    rng = np.random.default_rng(1)
    raw = np.log(_softmax(rng.standard_normal(VOCAB)))
    order = np.argsort(-raw, kind="stable")
    x = int(order[50])
    st = token_stats_from_logprobs([x], [_returned(raw, x, 20)], [x], temperature=1.0, top_k=0, num_logprobs=20)
    top = np.exp(raw[order[:20]])
    assert st.p_token[0] == pytest.approx(1.0 - top.sum(), rel=1e-9)
    assert st.mass_before[0] == pytest.approx(top.sum(), rel=1e-9)
    assert not st.drafted[0]  # p of a tail draft is not known alone


@pytest.mark.parametrize("temperature,top_k,n", [(1.0, 0, 20), (0.8, 10, 14)])
def test_monitor_passes_correct_sampling_and_rejects_a_temperature_mismatch(temperature, top_k, n):
    rng = np.random.default_rng(2)
    exact = _stream(rng, temperature, top_k, n, 800, sample_temperature=temperature)
    assert _verdict(exact, temperature, top_k, n)["verdict"] == "passed"
    flatter = _stream(rng, temperature, top_k, n, 800, sample_temperature=temperature * 1.5)
    rep = _verdict(flatter, temperature, top_k, n)
    assert rep["verdict"] == "failed"


def test_expand_fills_float_outputs_in_place():
    """vLLM's CPU override wrote into an int64 copy; the guard's expansion writes the tensor itself."""
    temperature = torch.tensor([0.7, 0.0, 1.3])
    out = torch.full((6,), float("nan"))
    _expand_kernel_impl(out, temperature, torch.tensor([2, 3, 6], dtype=torch.int32), 0.0, 1.0)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.3, 1.3, 1.3])
    top_k = torch.tensor([5, 0], dtype=torch.int32)
    out = torch.zeros(3, dtype=torch.int32)
    _expand_kernel_impl(out, top_k, torch.tensor([1, 3]), 0, 99)
    assert out.tolist() == [5, 99, 99]
