"""Statistical exactness tests of draftrl.decoding.sampling, each with a negative control.

Every test compares observed frequencies with the exact target distribution using
``check_frequencies`` (the selftest's criterion: every cell within z standard errors, with
sqrt(e (1 - e) / n) the standard error of a cell of probability e). Tests over many cells use a
Bonferroni z so that the family-wise false-failure rate stays below 1e-3. Each negative control is a
known-wrong rule that the *same* check must reject; trial counts are chosen so that the controls
miss by many standard errors (see the margins asserted below), and seeds are fixed.

Chains are checked on the joint distribution of the first ``LENGTH`` emitted tokens of a full
speculative decoding loop (several rounds, rejections, recovered and bonus tokens) over a synthetic
first-order Markov "model" with vocabulary ``VOCAB``: it must equal the target's own
autoregressive distribution.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import norm

from draftrl.decoding.sampling import (
    agree_expected_deterministic,
    verify_chain_batch,
    verify_node_deterministic_batch,
    verify_node_sampled,
    verify_node_sampled_batch,
)
from draftrl.decoding.selftest import VECTORS, check_frequencies, run_selftest
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample

VOCAB = 6
LENGTH = 3  # emitted tokens checked per trial: VOCAB**LENGTH joint cells
DEPTH = 2  # draft tokens per round
TRIALS = 200_000
#: joint cells expected fewer times than this are pooled (normal approximation of a binomial count)
MIN_EXPECTED_COUNT = 25
#: a control must miss by at least this many standard errors, so it fails whatever the seed
CONTROL_MARGIN = 8.0


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def bonferroni_z(num_cells: int, alpha: float = 1e-3) -> float:
    """z such that num_cells two-sided tests together fail a correct sampler with probability <= alpha."""
    return float(norm.isf(alpha / (2 * num_cells)))


def max_abs_z(result: dict) -> float:
    return max(abs(z) for z in result["z"])


# --------------------------------------------------------------------------- synthetic Markov models


def markov_logits(seed: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits [VOCAB+1, VOCAB]: row s is the next-token logits after token s, row VOCAB the start."""
    g = torch.Generator().manual_seed(seed)
    target = 1.5 * torch.randn(VOCAB + 1, VOCAB, generator=g)
    draft = target + noise * torch.randn(VOCAB + 1, VOCAB, generator=g)
    return target, draft


def joint_distribution(target_probs: torch.Tensor, length: int = LENGTH) -> list[float]:
    """Exact P(t_1..t_length) of autoregressive sampling from target_probs, flattened in base-VOCAB order."""
    p = target_probs.double() / target_probs.double().sum(-1, keepdim=True)
    joint = p[VOCAB]
    for _ in range(length - 1):
        last = torch.arange(joint.shape[0]) % VOCAB  # last token of each prefix
        joint = (joint.unsqueeze(-1) * p[last]).reshape(-1)
    return joint.tolist()


def speculative_sequences(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    trials: int,
    seed: int,
    *,
    method: str = "correct",
    proposal: str = "sampled",
    verify_target: torch.Tensor | None = None,
    verify_draft: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run speculative decoding for ``trials`` independent sequences; returns [trials, LENGTH] tokens.

    proposal "sampled": draft tokens ~ draft_probs, verified with q = draft_probs (or verify_draft, a
    deliberately wrong q). proposal "greedy": the draft proposes its argmax deterministically and is
    verified with q = None (one-hot), or with verify_draft when given (the known bias bug).
    verify_target replaces the target's distribution in verification only (wrong-p controls).
    """
    g = torch.Generator().manual_seed(seed)
    verify_target = target_probs if verify_target is None else verify_target
    rows = torch.arange(trials)
    out = torch.full((trials, LENGTH + DEPTH + 1), -1, dtype=torch.long)
    num_out = torch.zeros(trials, dtype=torch.long)
    last = torch.full((trials,), VOCAB, dtype=torch.long)  # start state
    while bool((num_out < LENGTH).any()):
        active = num_out < LENGTH
        state, drafts = last, []
        for _ in range(DEPTH):
            x = sample(draft_probs[state], g) if proposal == "sampled" else draft_probs[state].argmax(-1)
            drafts.append(x)
            state = x
        draft_tokens = torch.stack(drafts, dim=1)  # [trials, DEPTH]
        prev = torch.cat([last.unsqueeze(1), draft_tokens], dim=1)  # state before each position
        q_table = verify_draft if verify_draft is not None else (draft_probs if proposal == "sampled" else None)
        q = None if q_table is None else q_table[prev[:, :DEPTH]]
        num_accepted, next_token, _ = verify_chain_batch(verify_target[prev], draft_tokens, q, g, method)
        for j in range(DEPTH + 1):
            token = next_token if j == DEPTH else torch.where(j < num_accepted, draft_tokens[:, j], next_token)
            write = active & (j <= num_accepted)
            out[rows[write], (num_out + j)[write]] = token[write]
        num_out = torch.where(active, num_out + num_accepted + 1, num_out)
        last = out[rows, num_out - 1]
    return out[:, :LENGTH]


def pool_rare(counts: list[int], expected: list[float], trials: int) -> tuple[list[int], list[float]]:
    """Merge cells expected fewer than MIN_EXPECTED_COUNT times into one, where the normal approximation holds.

    Zero-probability cells stay separate: they must be observed exactly 0 times.
    """
    rare = [i for i, e in enumerate(expected) if 0 < e * trials < MIN_EXPECTED_COUNT]
    keep = [i for i in range(len(expected)) if i not in set(rare)]
    return (
        [counts[i] for i in keep] + [sum(counts[i] for i in rare)],
        [expected[i] for i in keep] + [sum(expected[i] for i in rare)],
    )


def check_joint(tokens: torch.Tensor, target_probs: torch.Tensor) -> dict:
    """Joint frequencies of the first LENGTH tokens vs the target's autoregressive distribution."""
    codes = torch.zeros(tokens.shape[0], dtype=torch.long)
    for i in range(LENGTH):
        codes = codes * VOCAB + tokens[:, i]
    counts = torch.bincount(codes, minlength=VOCAB**LENGTH).tolist()
    counts, expected = pool_rare(counts, joint_distribution(target_probs), tokens.shape[0])
    return check_frequencies(counts, expected, tokens.shape[0], z=bonferroni_z(len(expected)))


def assert_exact(result: dict) -> None:
    assert result["passed"], f"max |z| = {max_abs_z(result):.2f}"


def assert_rejected(result: dict) -> None:
    assert not result["passed"]
    assert max_abs_z(result) > CONTROL_MARGIN, f"control only {max_abs_z(result):.2f} SE off: raise the trials"


# --------------------------------------------------------------------------- seed vectors (selftest)


@pytest.fixture(scope="module")
def selftest_correct() -> dict:
    return run_selftest(trials=TRIALS, seed=0, method="correct")


@pytest.fixture(scope="module")
def selftest_wrong() -> dict:
    return run_selftest(trials=TRIALS, seed=0, method="resample-from-p")


def test_seed_vectors_pass_within_4_standard_errors(selftest_correct):
    assert [v["name"] for v in selftest_correct["vectors"]] == [v.name for v in VECTORS]
    for v in selftest_correct["vectors"]:
        assert v["passed"], v["name"]
        assert all(abs(z) <= 4 for z in v["z"]), v["name"]
        assert abs(v["agree"]["z"]) <= 4, v["name"]
    assert selftest_correct["passed"]
    three = selftest_correct["vectors"][0]
    assert max(abs(o - e) for o, e in zip(three["observed"], three["expected"])) < 0.004
    assert three["stderr"][0] == pytest.approx(0.00112, abs=1e-5)  # sqrt(0.25 / 200000), as in the article
    p_equals_q = next(v for v in selftest_correct["vectors"] if v["name"] == "p-equals-q")
    assert p_equals_q["agree"]["observed"] == 1.0  # never rejected


def test_resample_from_p_is_rejected_by_the_same_check(selftest_wrong):
    assert not selftest_wrong["passed"]
    by_name = {v["name"]: v for v in selftest_wrong["vectors"]}
    for name in ("three-symbols", "four-tokens", "one-hot-draft", "q-zero-where-p-positive", "tree-node-sampled"):
        assert not by_name[name]["passed"], name
        assert max(abs(z) for z in by_name[name]["z"]) > CONTROL_MARGIN, name
    # ... and it converges to the distributions the articles predict for the wrong rule
    three = by_name["three-symbols"]
    assert check_frequencies([round(o * TRIALS) for o in three["observed"]], [0.35, 0.39, 0.26], TRIALS)["passed"]
    four = by_name["four-tokens"]
    assert check_frequencies([round(o * TRIALS) for o in four["observed"]], [0.45, 0.15, 0.15, 0.25], TRIALS)["passed"]
    # vectors with no rejection path cannot tell the rules apart
    assert by_name["p-equals-q"]["passed"] and by_name["tree-node-deterministic"]["passed"]


# --------------------------------------------------------------------------- chains, sampled q


CHAIN_PARAMS = {
    "temperature-1": SamplingParams(temperature=1.0),
    "temperature-0.6": SamplingParams(temperature=0.6),
    "temperature-1.7": SamplingParams(temperature=1.7),
    "top-k-3": SamplingParams(temperature=1.0, top_k=3),
    "top-p-0.7": SamplingParams(temperature=1.0, top_p=0.7),
    "all-three": SamplingParams(temperature=0.8, top_k=4, top_p=0.9),
}


@pytest.mark.parametrize("name", list(CHAIN_PARAMS))
def test_chain_with_sampled_q_matches_target_joint(name):
    params = CHAIN_PARAMS[name]
    target_logits, draft_logits = markov_logits(seed=1, noise=1.0)
    p, q = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    assert_exact(check_joint(speculative_sequences(p, q, TRIALS, seed=2), p))
    # negative control: on rejection sample from p instead of the residual
    assert_rejected(check_joint(speculative_sequences(p, q, TRIALS, seed=2, method="resample-from-p"), p))


@pytest.mark.parametrize("name", ["temperature-0.6", "temperature-1.7", "top-k-3", "top-p-0.7", "all-three"])
def test_chain_rejects_q_that_was_not_the_sampled_distribution(name):
    """Negative control for the contract: q in the ratio must be after temperature/top-k/top-p."""
    params = CHAIN_PARAMS[name]
    target_logits, draft_logits = markov_logits(seed=1, noise=1.0)
    p, q = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    q_raw = logits_to_probs(draft_logits, SamplingParams(temperature=1.0))  # softmax of the raw logits
    tokens = speculative_sequences(p, q, TRIALS, seed=3, verify_draft=q_raw)
    assert_rejected(check_joint(tokens, p))


def test_chain_with_one_hot_q_matches_target_joint():
    """Greedy (deterministic) draft proposals, sampled target: q = one-hot, acceptance p(x)."""
    target_logits, draft_logits = markov_logits(seed=4, noise=1.0)
    params = SamplingParams(temperature=1.0)
    p, q = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    assert_exact(check_joint(speculative_sequences(p, q, TRIALS, seed=5, proposal="greedy"), p))
    # negative control: the known bias bug, proposing greedily but using the draft's softmax as q
    tokens = speculative_sequences(p, q, TRIALS, seed=5, proposal="greedy", verify_draft=q)
    assert_rejected(check_joint(tokens, p))
    # negative control: resample-from-p with one-hot proposals
    tokens = speculative_sequences(p, q, TRIALS, seed=5, proposal="greedy", method="resample-from-p")
    assert_rejected(check_joint(tokens, p))


def test_chain_p_equals_q_always_accepts_and_matches_target():
    target_logits, _ = markov_logits(seed=6, noise=0.0)
    p = logits_to_probs(target_logits, SamplingParams(temperature=1.0))
    batch = 50_000
    g = torch.Generator().manual_seed(7)
    rows = p[torch.randint(0, VOCAB + 1, (batch, DEPTH + 1), generator=g)]
    draft = sample(rows[:, :DEPTH], g)
    num_accepted, next_token, recovered = verify_chain_batch(rows, draft, rows[:, :DEPTH], g)
    assert bool((num_accepted == DEPTH).all()) and not bool(recovered.any())  # Z = 0: never rejected
    assert_exact(check_joint(speculative_sequences(p, p, TRIALS, seed=7), p))


def test_chain_reaches_tokens_the_draft_never_proposes():
    """q(x) = 0 < p(x): x must come out through the residual, with the right frequency."""
    target_logits, draft_logits = markov_logits(seed=8, noise=0.5)
    target_logits[:, 0] = target_logits.mean(-1) + 0.5  # p(0) is substantial everywhere ...
    draft_logits[:, 0] = -math.inf  # ... but the draft never proposes token 0
    params = SamplingParams(temperature=1.0)
    p, q = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    assert float(q[:, 0].max()) == 0.0 and float(p[:, 0].min()) > 0.02
    tokens = speculative_sequences(p, q, TRIALS, seed=9)
    assert bool((tokens == 0).any())
    assert_exact(check_joint(tokens, p))
    assert_rejected(check_joint(speculative_sequences(p, q, TRIALS, seed=9, method="resample-from-p"), p))


# --------------------------------------------------------------------------- greedy


def greedy_reference(target_logits: torch.Tensor) -> list[int]:
    """The target's own greedy decoding from the start state: argmax, lowest id among ties."""
    tokens, state = [], VOCAB
    for _ in range(LENGTH):
        row = target_logits[state]
        state = int(torch.nonzero(row == row.max())[0])
        tokens.append(state)
    return tokens


@pytest.mark.parametrize("tie", [False, True])
def test_greedy_is_token_for_token_the_target_greedy_decoding(tie):
    target_logits, draft_logits = markov_logits(seed=10, noise=1.5)
    if tie:  # exact ties in the target: the lowest id must win, in both models
        target_logits[:, 4] = target_logits.max(-1).values + 1.0
        target_logits[:, 2] = target_logits[:, 4]
        draft_logits[:, 2] = draft_logits.max(-1).values + 1.0
    params = SamplingParams(temperature=0.0)
    p, q = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    reference = torch.tensor(greedy_reference(target_logits))
    if tie:
        assert reference.tolist() == [2, 2, 2]
    for proposal in ("sampled", "greedy"):  # q one-hot from logits_to_probs, or q = None
        tokens = speculative_sequences(p, q, 2_000, seed=11, proposal=proposal)
        assert bool((tokens == reference).all()), proposal
    # negative control: verifying against the raw softmax instead of the greedy one-hot
    p_raw = logits_to_probs(target_logits, SamplingParams(temperature=1.0))
    tokens = speculative_sequences(p, q, 2_000, seed=11, verify_target=p_raw)
    assert not bool((tokens == reference).all(dim=1).all())


# --------------------------------------------------------------------------- tree nodes


NODE_P = torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10])
NODE_Q = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.15, 0.15])


def test_tree_node_with_deterministic_children_is_exact():
    children = torch.topk(NODE_Q, 3).indices  # top-3 of the draft: tokens 1, 3, then 4 or 5
    g = torch.Generator().manual_seed(12)
    index, token = verify_node_deterministic_batch(NODE_P.expand(TRIALS, -1), children.expand(TRIALS, -1), g)
    result = check_frequencies(torch.bincount(token, minlength=VOCAB).tolist(), NODE_P.tolist(), TRIALS)
    assert_exact(result)
    is_child = index >= 0
    assert bool((children[index[is_child]] == token[is_child]).all())
    assert not bool(torch.isin(token[~is_child], children).any())
    agree = check_frequencies([int(is_child.sum())], [agree_expected_deterministic(NODE_P, children)], TRIALS)
    assert_exact(agree)
    # negative control: treating deterministic top-k children as if they were sampled from q
    _, token, _ = verify_node_sampled_batch(NODE_P.expand(TRIALS, -1), children.expand(TRIALS, -1),
                                            NODE_Q.expand(TRIALS, -1), g)
    assert_rejected(check_frequencies(torch.bincount(token, minlength=VOCAB).tolist(), NODE_P.tolist(), TRIALS))
    # negative control: the engine's --sampler resample-from-p on deterministic children
    _, token = verify_node_deterministic_batch(
        NODE_P.expand(TRIALS, -1), children.expand(TRIALS, -1), g, method="resample-from-p"
    )
    assert_rejected(check_frequencies(torch.bincount(token, minlength=VOCAB).tolist(), NODE_P.tolist(), TRIALS))


@pytest.mark.parametrize("num_children", [2, 4])
def test_tree_node_with_sampled_children_is_exact(num_children):
    g = torch.Generator().manual_seed(13)
    children = sample(NODE_Q.expand(TRIALS, num_children, -1), g)  # i.i.d. from q, duplicates included
    assert bool((children[:, 0] == children[:, 1]).any())
    p, q = NODE_P.expand(TRIALS, -1), NODE_Q.expand(TRIALS, -1)
    index, token, agree_expected = verify_node_sampled_batch(p, children, q, g)
    assert_exact(check_frequencies(torch.bincount(token, minlength=VOCAB).tolist(), NODE_P.tolist(), TRIALS))
    accepted = index >= 0
    assert bool((children[accepted, index[accepted]] == token[accepted]).all())
    # the monitor's statistic: agree - agree_expected sums independent zero-mean terms
    agree = (token.unsqueeze(-1) == children).any(-1).double()
    stderr = math.sqrt(float((agree_expected * (1 - agree_expected)).sum())) / TRIALS
    assert abs(float(agree.mean() - agree_expected.mean())) <= 4 * stderr
    assert bool((agree == accepted.double()).all())  # the fallback never lands on a rejected child
    # negative control: no residual update between children
    _, token, _ = verify_node_sampled_batch(p, children, q, g, method="no-residual-update")
    assert_rejected(check_frequencies(torch.bincount(token, minlength=VOCAB).tolist(), NODE_P.tolist(), TRIALS))
    # negative control: resample from p after the last rejection; the expectation the monitor
    # compares against stays the correct rule's
    _, token, wrong_expected = verify_node_sampled_batch(p, children, q, g, method="resample-from-p")
    assert torch.equal(wrong_expected, agree_expected)
    assert_rejected(check_frequencies(torch.bincount(token, minlength=VOCAB).tolist(), NODE_P.tolist(), TRIALS))
    # negative control: distinct children (drawn without replacement) are not i.i.d. from q
    distinct = torch.multinomial(q, num_children, replacement=False, generator=g)
    _, token, _ = verify_node_sampled_batch(p, distinct, q, g)
    assert_rejected(check_frequencies(torch.bincount(token, minlength=VOCAB).tolist(), NODE_P.tolist(), TRIALS))


def test_tree_node_agree_expected_is_the_conditional_probability_given_the_children():
    children = torch.tensor([3, 3, 1])  # fixed, with a duplicate
    _, _, expected = verify_node_sampled(NODE_P, children, NODE_Q, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(14)
    _, token, agree_expected = verify_node_sampled_batch(
        NODE_P.expand(TRIALS, -1), children.expand(TRIALS, -1), NODE_Q.expand(TRIALS, -1), g
    )
    assert torch.allclose(agree_expected, torch.tensor(expected, dtype=torch.float64))
    agree = int(torch.isin(token, children).sum())
    assert_exact(check_frequencies([agree], [expected], TRIALS))
    # by hand: child 3 is accepted w.p. 0.10/0.25 = 0.4; the residuals p_2, p_3, p_4 are 0 at tokens 3 and 1
    # (q >= p there), so the second 3, then 1, are always rejected and the fallback never agrees.
    assert expected == pytest.approx(0.4)
    one_child = verify_node_sampled(NODE_P, torch.tensor([2]), NODE_Q, g)[2]
    assert one_child == pytest.approx(min(1.0, 0.25 / 0.10))
    one_child = verify_node_sampled(NODE_P, torch.tensor([1]), NODE_Q, g)[2]
    assert one_child == pytest.approx(0.05 / 0.30)
