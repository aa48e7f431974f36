"""Unit tests of draftrl.decoding.sampling on hand-built logits and distributions (no statistics)."""

from __future__ import annotations

import math

import pytest
import torch

from draftrl.decoding import sampling
from draftrl.decoding.sampling import (
    ChainVerdict,
    agree_expected_deterministic,
    chain_agree_expected,
    target_stats,
    target_stats_batch,
    verify_chain,
    verify_chain_batch,
    verify_node_deterministic,
    verify_node_sampled,
)
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- SamplingParams


def test_sampling_params_defaults_are_greedy():
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.7).greedy
    assert SamplingParams(temperature=1).temperature == 1  # ints from YAML are fine


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"temperature": -0.1}, "temperature=-0.1"),
        ({"temperature": float("nan")}, "temperature=nan"),
        ({"temperature": float("inf")}, "temperature=inf"),
        ({"temperature": "1"}, "temperature='1'"),
        ({"top_k": -1}, "top_k=-1"),
        ({"top_k": 2.5}, "top_k=2.5"),
        ({"top_k": True}, "top_k=True"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_p": float("nan")}, "top_p=nan"),
    ],
)
def test_sampling_params_reject_bad_values_in_one_line(kwargs, needle):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert "use" in str(err.value)  # names the fix


# --------------------------------------------------------------------------- logits_to_probs


def test_greedy_is_one_hot_at_the_lowest_tied_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, -math.inf, 5.0, 5.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0, top_k=1, top_p=0.5))
    assert probs.dtype == torch.float32
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_temperature_is_a_plain_softmax_of_scaled_logits():
    logits = torch.randn(2, 3, 7, generator=gen())
    for t in (0.5, 1.0, 2.0):
        probs = logits_to_probs(logits, SamplingParams(temperature=t))
        assert probs.shape == logits.shape and probs.dtype == torch.float32
        assert torch.allclose(probs, torch.softmax(logits.double() / t, -1).float(), atol=1e-7)


def test_masked_tokens_get_zero_probability():
    logits = torch.tensor([0.0, -math.inf, 1.0, -math.inf])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=3))
    assert probs[1] == 0 and probs[3] == 0
    assert probs.sum().item() == pytest.approx(1.0)


def test_top_k_keeps_k_tokens_with_ties_broken_by_ascending_id():
    logits = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert probs.tolist() == [0.0, 0.5, 0.5, 0.0, 0.0]
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=4))
    assert (probs > 0).tolist() == [False, True, True, True, True]
    assert torch.equal(logits_to_probs(logits, SamplingParams(1.0, top_k=5)),
                       logits_to_probs(logits, SamplingParams(1.0)))


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()

    def kept(top_p):
        return (logits_to_probs(logits, SamplingParams(1.0, top_p=top_p)) > 0).nonzero().flatten().tolist()

    assert kept(0.4) == [0]
    assert kept(0.75) == [0, 1]
    assert kept(0.81) == [0, 1, 2]
    assert kept(0.99) == [0, 1, 2, 3]
    probs = logits_to_probs(logits, SamplingParams(1.0, top_p=0.75))
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0, 0])
    # ties: equal probabilities are taken in ascending id order
    flat = torch.zeros(4)
    assert (logits_to_probs(flat, SamplingParams(1.0, top_p=0.5)) > 0).tolist() == [True, True, False, False]


def test_top_p_applies_to_the_renormalised_top_k_distribution():
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # after top-k=2: (4/7, 3/7); top_p=0.5 keeps only token 0 (4/7 >= 0.5); on the full softmax it would keep 0, 1
    probs = logits_to_probs(logits, SamplingParams(1.0, top_k=2, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]


def reference_filter(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Straightforward full-sort reference of temperature -> top-k -> top-p, ties by ascending id."""
    x = logits.double()
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices
    xs = x.gather(-1, order)
    if params.top_k:
        xs[..., params.top_k:] = -math.inf
    ps = torch.softmax(xs / params.temperature, dim=-1)
    cum = ps.cumsum(-1)
    keep = (cum - ps) < params.top_p
    keep[..., 0] = True
    ps = torch.where(keep, ps, 0.0)
    out = torch.zeros_like(ps).scatter_(-1, order, ps)
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("vocab", [5, 64, 200, 5000])
@pytest.mark.parametrize("top_k, top_p", [(0, 0.5), (0, 0.9), (0, 0.999), (3, 1.0), (50, 0.95), (0, 1e-6)])
def test_top_k_top_p_fast_paths_match_a_full_sort(vocab, top_k, top_p):
    g = gen(vocab)
    logits = torch.randn(4, vocab, generator=g)
    logits[1] = torch.randint(0, 3, (vocab,), generator=g).float()  # heavy ties
    logits[2] = 0.0  # all tied: the candidate set must grow to the whole vocabulary
    params = SamplingParams(temperature=0.9, top_k=top_k, top_p=top_p)
    got = logits_to_probs(logits, params)
    want = reference_filter(logits, params)
    assert torch.equal(got > 0, want > 0)
    assert torch.allclose(got.double(), want, atol=1e-6)


@pytest.mark.parametrize(
    "bad, needle",
    [
        (torch.tensor([[0.0, float("nan"), 1.0]]), "NaN"),
        (torch.tensor([[0.0, float("inf"), 1.0]]), "+inf"),
        (torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]]), "-inf everywhere"),
    ],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_invalid_logits_raise_one_line(bad, needle, temperature):
    with pytest.raises(ValueError) as err:
        logits_to_probs(bad, SamplingParams(temperature=temperature))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_integer_logits_are_a_type_error():
    with pytest.raises(TypeError):
        logits_to_probs(torch.tensor([1, 2, 3]), SamplingParams(1.0))


# --------------------------------------------------------------------------- sample


def test_sample_shapes_dtype_and_zero_probability_tokens():
    probs = torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0]).expand(2, 3, 50_000, 5)
    tokens = sample(probs, gen())
    assert tokens.shape == (2, 3, 50_000) and tokens.dtype == torch.long
    assert set(tokens.unique().tolist()) == {1, 3}  # never a zero-probability token, also at the edges
    one_hot = torch.zeros(6, 8).scatter_(-1, torch.arange(6).unsqueeze(-1), 1.0)
    assert sample(one_hot, gen()).tolist() == list(range(6))


def test_sample_is_reproducible_and_accepts_unnormalised_rows():
    probs = torch.tensor([[2.0, 1.0, 1.0]]).expand(10, 3)
    assert torch.equal(sample(probs, gen(5)), sample(probs, gen(5)))


@pytest.mark.parametrize("bad", [torch.tensor([0.5, -0.1, 0.6]), torch.zeros(3),
                                 torch.tensor([1.0, float("nan"), 0.0])])
def test_sample_rejects_invalid_rows(bad):
    with pytest.raises(ValueError):
        sample(bad, gen())


# --------------------------------------------------------------------------- chain verification, per round


P3 = torch.tensor([0.5, 0.3, 0.2])
Q3 = torch.tensor([0.2, 0.5, 0.3])


def test_verify_chain_returns_python_values():
    target = torch.stack([P3, P3, P3])
    verdict = verify_chain(target, torch.tensor([0, 1]), torch.stack([Q3, Q3]), gen())
    assert isinstance(verdict, ChainVerdict)
    assert isinstance(verdict.num_accepted, int) and isinstance(verdict.next_token, int)
    assert isinstance(verdict.recovered, bool)
    assert 0 <= verdict.num_accepted <= 2 and verdict.num_emitted == verdict.num_accepted + 1
    assert verdict.recovered == (verdict.num_accepted < 2)


def test_verify_chain_with_no_draft_tokens_is_a_plain_target_step():
    verdict = verify_chain(torch.tensor([[0.0, 1.0, 0.0]]), torch.zeros(0, dtype=torch.long), None, gen())
    assert verdict == ChainVerdict(num_accepted=0, next_token=1, recovered=False)


def test_verify_chain_greedy_is_deterministic():

    def one_hot(i):
        return torch.nn.functional.one_hot(torch.tensor(i), 4).float()

    target = torch.stack([one_hot(2), one_hot(0), one_hot(3)])
    for seed in range(20):
        assert verify_chain(target, torch.tensor([2, 0]), None, gen(seed)) == ChainVerdict(2, 3, False)
        assert verify_chain(target, torch.tensor([2, 1]), None, gen(seed)) == ChainVerdict(1, 0, True)
        assert verify_chain(target, torch.tensor([1, 1]), torch.stack([one_hot(1), one_hot(1)]), gen(seed)) == (
            ChainVerdict(0, 2, True)
        )


def test_verify_chain_never_recovers_the_rejected_token():
    # p(x) < q(x): x can be rejected, and the residual max(p - q, 0) is 0 at x
    batch = 20_000
    num_accepted, next_token, recovered = verify_chain_batch(
        torch.stack([P3, P3]).expand(batch, 2, 3), torch.ones(batch, 1, dtype=torch.long), Q3.expand(batch, 1, 3), gen()
    )
    assert bool(recovered.any()) and not bool((next_token[recovered] == 1).any())
    assert set(next_token[recovered].tolist()) == {0}  # residual (1, 0, 0)


def test_verify_chain_consumes_a_fixed_number_of_uniforms():
    target = torch.stack([P3, P3, P3])
    for draft in ([0, 0], [1, 2]):
        g = gen(3)
        verify_chain(target, torch.tensor(draft), torch.stack([Q3, Q3]), g)
        reference = gen(3)
        torch.rand(3, dtype=torch.float64, generator=reference)  # k acceptance uniforms + 1 for sampling
        assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=reference))


@pytest.mark.parametrize(
    "target, draft, q, needle",
    [
        (torch.rand(2, 3), torch.tensor([0, 1]), None, r"k\+1 rows"),
        (torch.rand(3, 3), torch.tensor([0, 1]), torch.rand(2, 4), "draft_probs has shape"),
        (torch.rand(3), torch.tensor([0, 1]), None, r"expected target_probs \[k\+1, V\]"),
    ],
)
def test_verify_chain_shape_errors_name_the_fix(target, draft, q, needle):
    with pytest.raises(ValueError, match=needle):
        verify_chain(target, draft, q, gen())


def test_unknown_methods_are_rejected():
    with pytest.raises(ValueError, match="method='wrong'"):
        verify_chain(torch.stack([P3, P3]), torch.tensor([0]), Q3[None], gen(), method="wrong")
    with pytest.raises(ValueError, match="no-residual-update"):
        verify_node_sampled(P3, torch.tensor([0]), Q3, gen(), method="wrong")
    with pytest.raises(ValueError, match="resample-from-p"):
        verify_node_deterministic(P3, torch.tensor([0]), gen(), method="wrong")


def test_residual_guard_returns_p_instead_of_zero_over_zero():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]], dtype=torch.float64)
    res = sampling._residual(p, q)
    assert torch.equal(res[0], p[0])  # Z = 0
    assert torch.allclose(res[1], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert bool(torch.isfinite(res).all())


def test_chain_agree_expected():
    target = torch.stack([P3, torch.tensor([0.1, 0.1, 0.8]), P3])
    draft = torch.tensor([1, 2])
    q = torch.stack([Q3, torch.tensor([0.2, 0.2, 0.6])])
    assert chain_agree_expected(target, draft, q).tolist() == pytest.approx([0.3 / 0.5, 1.0])
    assert chain_agree_expected(target, draft, None).tolist() == pytest.approx([0.3, 0.8])


# --------------------------------------------------------------------------- tree nodes, per round


def test_verify_node_deterministic_values():
    p = torch.tensor([0.0, 0.0, 1.0, 0.0])
    assert verify_node_deterministic(p, torch.tensor([3, 2]), gen()) == (1, 2)
    assert verify_node_deterministic(p, torch.tensor([0, 1]), gen()) == (-1, 2)
    assert agree_expected_deterministic(torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([3, 1])) == pytest.approx(0.6)


def test_verify_node_sampled_values():
    index, token, agree = verify_node_sampled(P3, torch.tensor([0, 0]), Q3, gen())
    assert (index, token) == (0, 0) and agree == 1.0  # p(0) > q(0): always accepted
    index, token, agree = verify_node_sampled(
        torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0, 1]), torch.tensor([0.5, 0.5, 0.0]), gen()
    )
    assert (index, token, agree) == (-1, 2, 0.0)  # reachable only through the final residual


# --------------------------------------------------------------------------- target_stats


def test_target_stats_on_hand_built_distributions():
    p = torch.tensor([0.1, 0.4, 0.1, 0.4])
    entropy = -(2 * 0.1 * math.log(0.1) + 2 * 0.4 * math.log(0.4))
    assert target_stats(p, 1) == pytest.approx((0.4, 0.0, entropy))
    assert target_stats(p, 3) == pytest.approx((0.4, 0.4, entropy))  # tie with token 1, which ranks first
    assert target_stats(p, 0) == pytest.approx((0.1, 0.8, entropy))
    assert target_stats(p, 2) == pytest.approx((0.1, 0.9, entropy))
    assert target_stats(torch.tensor([0.0, 1.0, 0.0]), 1) == (1.0, 0.0, 0.0)
    assert target_stats(torch.tensor([0.0, 1.0, 0.0]), 2) == (0.0, 1.0, 0.0)
    uniform = torch.full((8,), 1 / 8)
    assert target_stats(uniform, 5) == pytest.approx((0.125, 5 * 0.125, math.log(8)))


def test_target_stats_batch_matches_the_scalar_version():
    p = torch.softmax(torch.randn(5, 30, generator=gen()), -1)
    tokens = torch.tensor([0, 7, 29, 3, 3])
    batch = target_stats_batch(p, tokens)
    for i in range(5):
        assert target_stats(p[i], int(tokens[i])) == pytest.approx(tuple(float(t[i]) for t in batch))
