"""The engine's per-token greedy check (``decoding.argmax_check``) and the off-by-one control, on synthetic logits.

The check re-derives each emitted token's verifying row from the accepted path and compares the
token with that row's argmax; the correct walk always passes it, the off-by-one walk (the round's
first rejected draft token kept) fails it at the kept token, and hand-made broken rounds (a token
from the wrong row, an accepted node that is not on a path, a kept node whose token was not
emitted) fail it too.
"""

from __future__ import annotations

import pytest
import torch
from test_tree_and_acceptance import VOCAB, random_tree

from draftrl.decoding.acceptance import OFF_BY_ONE, accept_tree
from draftrl.decoding.argmax_check import ArgmaxViolation, check_argmax
from draftrl.decoding.monitor import ExactnessViolation
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams

GREEDY = SamplingParams()


def _chain(tokens: list[int]) -> DraftTree:
    tree = DraftTree()
    parent = -1
    for i, t in enumerate(tokens):
        parent = tree.add(t, parent, -float(i + 1))
    return tree


def _logits(argmax: list[int]) -> torch.Tensor:
    """[len(argmax), VOCAB] logits whose row r peaks at argmax[r]."""
    logits = torch.zeros(len(argmax), VOCAB)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return logits


def test_the_correct_walk_passes_on_random_trees_and_the_off_by_one_walk_fails_at_its_kept_token():
    gen = torch.Generator().manual_seed(0)
    caught = passed_rejections = 0
    for _ in range(300):
        tree = random_tree(gen)
        logits = torch.randn(1 + len(tree), VOCAB, generator=gen)
        # make the target agree with the first child at random levels, so some rounds accept
        for node, parent in enumerate(tree.parents):
            if float(torch.rand(1, generator=gen)) < 0.5:
                logits[parent + 1, tree.tokens[node]] = 10.0
        good = accept_tree(tree, logits, GREEDY, None)
        assert good.row_argmax == logits.argmax(-1).tolist()
        check_argmax(tree, good.tokens, good.accepted, good.row_argmax)
        children = tree.children()
        last = good.accepted[-1] if good.accepted else -1
        rejected = bool(children.get(last))  # the walk stopped at a node that had children: a rejection
        passed_rejections += rejected
        bad = accept_tree(tree, logits, GREEDY, None, sampler=OFF_BY_ONE)
        assert bad.tokens[: len(good.tokens) - 1] == good.tokens[:-1]  # identical up to the first rejection
        if rejected:
            assert len(bad.accepted) > len(good.accepted)  # one more accepted than the rule allows
            with pytest.raises(ArgmaxViolation) as err:
                check_argmax(tree, bad.tokens, bad.accepted, bad.row_argmax, num_before=7)
            assert err.value.failures[0]["position"] == 7 + len(good.tokens) - 1  # the kept rejected token
            caught += 1
        else:
            assert bad.tokens == good.tokens  # no rejection: the control changes nothing
    assert passed_rejections == caught > 50


def test_the_check_is_an_exactness_violation_whose_message_names_the_row():
    tree = _chain([3, 4])
    with pytest.raises(ExactnessViolation, match="argmax of the root row .* is 3"):
        check_argmax(tree, [5], [], [3, 4, 6])
    with pytest.raises(ArgmaxViolation, match="row of accepted node 0"):
        check_argmax(tree, [3, 9], [0], [3, 4, 6])  # the second token came from another row


def test_broken_rounds_that_emit_argmaxes_are_caught_by_the_path_checks():
    tree = DraftTree()
    a = tree.add(3, -1, -1.0)
    b = tree.add(4, -1, -1.5)
    tree.add(5, a, -2.0)
    argmax = [3, 5, 7, 8]  # rows: root, a, b, c
    check_argmax(tree, [3, 5], [a], argmax)
    with pytest.raises(ArgmaxViolation, match="holds token"):
        check_argmax(tree, [3, 7], [b], argmax)  # kept node b (token 4) where 3 was emitted
    with pytest.raises(ArgmaxViolation, match="no root-to-leaf path"):
        check_argmax(tree, [3, 5, 7], [a, b], argmax)  # b does not hang off a


def test_a_truncated_round_checks_only_what_it_emits():
    tree = _chain([3, 4, 5])
    walk = accept_tree(tree, _logits([3, 4, 9, 1]), GREEDY, None)
    assert walk.tokens == [3, 4, 9]
    cut = walk.truncate(2)  # EOS or the length limit
    assert cut.row_argmax == walk.row_argmax
    check_argmax(tree, cut.tokens, cut.accepted, cut.row_argmax)
