"""NgramDrafter: the width-1 chain is Hugging Face prompt lookup's proposal, the
vote is a tree alternative, and the features describe the match."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from draftrl.drafters.ngram import NgramDrafter
from draftrl.models.distribution import SamplingParams

GREEDY = SamplingParams()


def hf_candidates(ids: list[int], depth: int, max_ngram: int) -> list[int]:
    """What transformers' prompt lookup proposes after ``ids`` (no EOS, no length limit)."""
    gen = PromptLookupCandidateGenerator(num_output_tokens=depth, max_matching_ngram_size=max_ngram,
                                         max_length=len(ids) + 10_000)
    out, _ = gen.get_candidates(torch.tensor([ids]))
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("vocab", [3, 6, 20])
@pytest.mark.parametrize("depth", [1, 4, 8])
def test_width_one_chain_is_hf_prompt_lookup(vocab: int, depth: int) -> None:
    """On 300 random histories our chain is exactly HF's candidates, so from the same state a
    round accepts as many tokens as prompt lookup would."""
    rng = np.random.default_rng(vocab * 100 + depth)
    drafter = NgramDrafter(1, 3)
    for _ in range(300):
        ids = rng.integers(0, vocab, size=int(rng.integers(2, 60))).tolist()
        assert drafter.propose(ids, depth, 1, GREEDY, None).tokens == hf_candidates(ids, depth, 3), ids


def latest_lookup(ids: list[int], depth: int, max_ngram: int) -> list[int]:
    """The minimal prompt lookup of issue 10: the tokens after the latest earlier occurrence of
    the longest suffix n-gram (n = max_ngram .. 1)."""
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        starts = [i for i in range(len(ids) - n) if ids[i:i + n] == ids[-n:]]
        if starts:
            return ids[starts[-1] + n: starts[-1] + n + depth]
    return []


@pytest.mark.parametrize("vocab", [3, 6, 20])
@pytest.mark.parametrize("depth", [1, 4, 8])
def test_latest_first_chain_continues_the_latest_occurrence(vocab: int, depth: int) -> None:
    """With first="latest" the width-1 chain starts with the latest occurrence's continuation
    (and continues along the other matches when that one reaches the end of the history)."""
    rng = np.random.default_rng(vocab * 100 + depth + 7)
    drafter = NgramDrafter(1, 3, first="latest")
    for _ in range(300):
        ids = rng.integers(0, vocab, size=int(rng.integers(2, 60))).tolist()
        chain = drafter.propose(ids, depth, 1, GREEDY, None).tokens
        ref = latest_lookup(ids, depth, 3)
        assert chain[: len(ref)] == ref and (len(ref) < depth or chain == ref), ids
    assert NgramDrafter(1, 3, first="latest").features(ids) == NgramDrafter(1, 3).features(ids)
    with pytest.raises(ValueError, match="first='last'"):
        NgramDrafter(1, 3, first="last")


def test_vote_is_the_second_alternative() -> None:
    # "1 2" is followed by 3 early on, by 4 twice later: earliest says 3, the vote says 4
    ids = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 4, 7, 1, 2]
    drafter = NgramDrafter(1, 2)
    chain = drafter.propose(ids, 3, 1, GREEDY, None)
    assert chain.tokens == [3, 9, 1]  # earliest occurrence, as HF
    tree = drafter.propose(ids, 2, 2, GREEDY, None)
    level1 = [t for t, d in zip(tree.tokens, tree.depths) if d == 1]
    assert level1 == [3, 4]
    for node, parent in enumerate(tree.parents):  # scores never increase along a path
        assert parent < 0 or tree.scores[node] <= tree.scores[parent]
    picked = tree.select(2)
    assert picked.tokens == [3, 9]  # verification takes the earliest path first
    f = drafter.features(ids)
    assert f["ngram_match_len"] == 2 and f["ngram_num_matches"] == 3
    assert f["ngram_vote_agrees"] == 0.0
    assert f["ngram_match_pos"] == pytest.approx(len(ids) / len(ids))  # earliest match at position 0


def test_features_without_a_match_and_when_they_agree() -> None:
    drafter = NgramDrafter(1, 3)
    assert drafter.features([5, 6, 7]) == {"ngram_match_len": 0.0, "ngram_num_matches": 0.0,
                                           "ngram_match_pos": 0.0, "ngram_vote_agrees": 0.0}
    ids = [0, 0, 5, 6, 1, 3, 5, 6, 1, 9, 5, 6]  # "5 6" twice before, followed by 1 both times
    f = drafter.features(ids)
    assert f["ngram_match_len"] == 2 and f["ngram_num_matches"] == 2 and f["ngram_vote_agrees"] == 1.0
    assert f["ngram_match_pos"] == pytest.approx((len(ids) - 2) / len(ids))
    assert drafter.propose(ids, 2, 1, GREEDY, None).features == f


def test_max_matches_is_checked() -> None:
    with pytest.raises(ValueError, match="max_matches >= 2"):
        NgramDrafter(1, 3, max_matches=1)
