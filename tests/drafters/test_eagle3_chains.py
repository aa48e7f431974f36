"""Batched EAGLE-3 chains (``draft_chains``) draft what each request's own drafter drafts.

Requests of a vLLM-like schedule (different prompt lengths, 1-3 new tokens per step, a late long
prompt, a depth-0 request, a rewind) draft together each step; every chain and score equals the
request's own greedy ``propose`` (or its level-by-level loop under a stop), and the caches left
behind are the same. Negative controls: a root mask that lets a row see later rows, and a level
mask that hides the request's newest rows, both draft otherwise.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from tiny_eagle3 import tiny_pair

from draftrl.drafters import eagle3_chains
from draftrl.drafters.eagle3 import Eagle3Drafter
from draftrl.drafters.eagle3_chains import ALONE_ROWS, draft_chains
from draftrl.models.distribution import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def setup():
    target, head = tiny_pair()
    rng = random.Random(0)
    sequences = [[rng.randrange(1, 32) for _ in range(n)] for n in (30, 45, 38, 60)]
    with torch.no_grad():
        features = [torch.cat([s[0] for s in (target(torch.tensor([seq]),
                                                     output_hidden_states=True).hidden_states[layer]
                                              for layer in head.config.aux_layers)], dim=-1) for seq in sequences]
    return target, head, sequences, features


def _schedule(sequences, seed=1):
    """Per step, each request's history length (None: not decoding), vLLM style: request 3 joins late
    with its whole prompt, request 1 is cut back once (a preemption)."""
    rng, lengths, steps = random.Random(seed), [6, 9, 4, None], []
    for step in range(10):
        if step == 4:
            lengths[3] = ALONE_ROWS + 10  # a long prompt: its root runs alone
        if step == 6:
            lengths[1] -= 3
        steps.append(list(lengths))
        lengths = [None if n is None else min(n + rng.randint(1, 3), len(seq) - 1)
                   for n, seq in zip(lengths, sequences)]
    return steps


def _feed(drafter: Eagle3Drafter, features: torch.Tensor, length: int) -> None:
    """What vLLM's proposer hands a request's drafter: the target's features at positions 0..L-2."""
    if drafter.num_features >= length:
        drafter.rewind(length)
    drafter.append_features(features[drafter.num_features : length - 1])


def _own(drafter: Eagle3Drafter, ids: list[int], cap: int, stop) -> tuple[list[int], list[float]]:
    builder = drafter.begin(ids, 1, GREEDY, None)
    for _ in range(cap):
        if not builder.step():
            break
        end = stop(builder.tree.scores) if stop else None
        if end is not None:
            return builder.tree.tokens[:end], builder.tree.scores[:end]
    return builder.tree.tokens, builder.tree.scores


def _confidence(scores):
    """Hugging Face's confidence stop at 0.5: keep the first draft below it, then stop."""
    own = scores[-1] - (scores[-2] if len(scores) > 1 else 0.0)
    return len(scores) if own < math.log(0.5) else None


def _run(setup, stop, caps_of):
    target, head, sequences, features = setup
    embed = target.get_input_embeddings()
    ours = [Eagle3Drafter(head, None, embed=embed) for _ in sequences]
    theirs = [Eagle3Drafter(head, None, embed=embed) for _ in sequences]
    mismatches, drafted = 0, 0
    for step, lengths in enumerate(_schedule(sequences)):
        live = [i for i, n in enumerate(lengths) if n is not None]
        for i in live:
            _feed(ours[i], features[i], lengths[i])
            _feed(theirs[i], features[i], lengths[i])
        histories = [sequences[i][: lengths[i]] for i in live]
        caps = [caps_of(step, i) for i in live]
        trees = draft_chains([ours[i] for i in live], histories, caps, stop)
        for i, ids, cap, tree in zip(live, histories, caps, trees):
            tokens, scores = _own(theirs[i], ids, cap, stop)
            drafted += len(tokens)
            if tree.tokens != tokens or not torch.allclose(torch.tensor(tree.scores), torch.tensor(scores),
                                                           atol=1e-4, rtol=1e-4):
                mismatches += 1
                continue
            if cap:
                theirs[i]._drop_tree()
                assert ours[i]._rows == theirs[i]._rows
                torch.testing.assert_close(ours[i].keys, theirs[i].keys, atol=1e-5, rtol=1e-5)
                assert set(tree.features) == {"draft_top1_prob", "draft_entropy"}
    return mismatches, drafted


def _caps(step, i):
    return 0 if (step, i) == (2, 0) else 1 + (step + i) % 4


@pytest.mark.parametrize("stop", [None, _confidence], ids=["to-the-cap", "confidence-stop"])
def test_batched_chains_equal_each_requests_own(setup, stop):
    mismatches, drafted = _run(setup, stop, _caps)
    assert mismatches == 0
    assert drafted > 40


def test_a_request_without_features_drafts_nothing_and_heads_must_match(setup):
    target, head, sequences, features = setup
    embed = target.get_input_embeddings()
    bare = Eagle3Drafter(head, None, embed=embed)
    assert draft_chains([bare], [sequences[0][:10]], [3])[0].tokens == []
    with pytest.raises(ValueError, match="different heads"):
        draft_chains([bare, Eagle3Drafter(tiny_pair()[1], None, embed=embed)],
                     [sequences[0][:10]] * 2, [3, 3])


@pytest.mark.parametrize("broken", ["root sees later rows", "level misses new rows"])
def test_a_wrong_mask_drafts_otherwise(setup, monkeypatch, broken):
    if broken == "root sees later rows":
        monkeypatch.setattr(eagle3_chains, "root_mask", lambda starts, news, p, n: torch.ones(len(starts), n, p + n,
                                                                                               dtype=torch.bool))
    else:
        real = eagle3_chains.level_mask
        monkeypatch.setattr(eagle3_chains, "level_mask",
                            lambda starts, news, p, n, col: real(starts, torch.zeros_like(news), p, n, col))
    mismatches, _ = _run(setup, None, lambda step, i: 4)
    assert mismatches > 0
