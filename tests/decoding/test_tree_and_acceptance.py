"""Draft-tree bookkeeping and the acceptance walk on synthetic logits (no models)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from draftrl.decoding.acceptance import accept_tree
from draftrl.decoding.sampling import target_stats_batch
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, logits_to_probs
from draftrl.models.kv import keep_tail

VOCAB = 12


def random_tree(gen: torch.Generator, depth: int = 4, width: int = 3) -> DraftTree:
    """A deterministic-style tree: per level up to `width` children of the previous level's nodes."""
    tree = DraftTree()
    frontier = [(-1, 0.0)]
    for _ in range(depth):
        level = []
        for parent, score in frontier:
            tokens = torch.randperm(VOCAB, generator=gen)[: int(torch.randint(1, width + 1, (1,), generator=gen))]
            for tok in tokens.tolist():
                child_score = score - float(torch.rand(1, generator=gen)) - 0.01
                level.append((tree.add(tok, parent, child_score), child_score))
        frontier = level[:width]
    return tree


def test_select_is_connected_and_keeps_the_best():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        tree = random_tree(gen)
        for v in (1, 2, 5, 9):
            sub = tree.select(v)
            assert len(sub) == min(v, len(tree))
            assert all(p < i for i, p in enumerate(sub.parents))  # parents first, root = -1
            kept = sorted(tree.scores, reverse=True)[: len(sub)]
            assert sorted(sub.scores, reverse=True) == kept
            assert [tree.tokens[sub.source_index(i)] for i in range(len(sub))] == sub.tokens


def test_sampled_tree_selection_keeps_whole_sibling_groups():
    tree = DraftTree(q={-1: torch.full((VOCAB,), 1 / VOCAB)})
    a = [tree.add(t, -1, -1.0) for t in (1, 1, 2)]  # i.i.d. children of the root, a duplicate included
    tree.q[a[0]] = torch.full((VOCAB,), 1 / VOCAB)
    for t in (3, 4, 5):
        tree.add(t, a[0], -2.0)
    assert tree.select(5).tokens == [1, 1, 2]  # the second group (3 nodes) does not fit
    assert len(tree.select(6)) == 6


def test_attention_mask_sees_exactly_the_ancestors():
    tree = DraftTree()
    r1 = tree.add(5, -1, -0.1)
    r2 = tree.add(6, -1, -0.2)
    c = tree.add(7, r1, -0.3)
    mask = tree.attention_mask(past_len=3, dtype=torch.float32, device=torch.device("cpu"))[0, 0] == 0
    assert mask.shape == (4, 7)
    assert mask[:, :3].all()  # the committed past
    assert mask[1 + c].tolist() == [True] * 3 + [True, True, False, True]  # root, r1, itself
    assert mask[1 + r2].tolist() == [True] * 3 + [True, False, True, False]
    assert tree.position_ids(3, torch.device("cpu")).tolist() == [[3, 4, 4, 5]]


def test_greedy_fast_path_equals_the_general_walk_on_one_hot_p():
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        tree = random_tree(gen)
        logits = torch.randn(1 + len(tree), VOCAB, generator=gen)
        for i, parent in enumerate(tree.parents):  # make acceptance likely: argmax follows the tree
            if float(torch.rand(1, generator=gen)) < 0.7:
                logits[parent + 1, tree.tokens[i]] += 10
        fast = accept_tree(tree, logits, SamplingParams(), None)
        one_hot = logits_to_probs(logits, SamplingParams())
        slow = accept_tree(tree, logits, SamplingParams(temperature=1.0), torch.Generator(), probs=one_hot)
        assert (fast.tokens, fast.accepted) == (slow.tokens, slow.accepted)
        assert fast.stats == slow.stats


def test_target_stats_on_top_k_rows_match_the_full_computation():
    from draftrl.decoding.sampling import target_stats

    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(VOCAB, generator=gen)
    p = logits_to_probs(logits, SamplingParams(temperature=0.8, top_k=4))
    for token in torch.nonzero(p).flatten().tolist():
        full = torch.tensor([float(x[0]) for x in target_stats_batch(p.unsqueeze(0), torch.tensor([token]))])
        assert torch.allclose(torch.tensor(target_stats(p, token), dtype=torch.float64), full.double(), atol=1e-12)


def test_keep_tail_packs_the_accepted_path_after_the_prefix():
    cache = DynamicCache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1)
    cache.update(keys, keys.clone(), 0)
    keep_tail(cache, 4, [6, 8])
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3, 6, 8]
    assert cache.get_seq_length() == 6


def test_the_walks_statistics_are_each_emitted_rows_own():
    """accept_tree computes every row's outcome on the device and the statistics over the emitted
    rows only, batched by sibling-group size: each emitted token's entry must equal what its own row
    gives computed alone (p(x), mass before x, entropy; agree_expected from the row's children)."""
    from draftrl.decoding.sampling import agree_expected_deterministic, target_stats, verify_node_sampled

    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(temperature=1.0)
    checked = 0
    for trial in range(120):
        tree = random_tree(gen, width=2 + trial % 2)
        if trial % 2:  # sampled children: a q per parent (sibling groups of unequal sizes)
            tree.q = {parent: torch.softmax(torch.randn(VOCAB, generator=gen), -1) for parent in tree.children()}
        logits = 2 * torch.randn(1 + len(tree), VOCAB, generator=gen)
        for i, parent in enumerate(tree.parents):  # acceptance likely: walks go deep
            logits[parent + 1, tree.tokens[i]] += 3
        verdict = accept_tree(tree, logits, params, torch.Generator().manual_seed(trial))
        p = logits_to_probs(logits, params)
        kids = tree.children()
        for j, (node, token) in enumerate(zip([-1] + verdict.accepted, verdict.tokens)):
            stats = verdict.stats
            assert (stats.p_token[j], stats.mass_before[j], stats.entropy[j]) == pytest.approx(
                target_stats(p[node + 1], token), rel=1e-9, abs=1e-12)
            children = torch.tensor([tree.tokens[c] for c in kids.get(node, [])], dtype=torch.long)
            assert stats.drafted[j] == bool(len(children))
            assert stats.agree[j] == float(token in children.tolist())
            if not len(children):
                assert stats.agree_expected[j] == 0.0
            elif tree.deterministic:
                assert stats.agree_expected[j] == pytest.approx(agree_expected_deterministic(p[node + 1], children))
            else:
                alone = verify_node_sampled(p[node + 1], children, tree.q[node], torch.Generator())[2]
                assert stats.agree_expected[j] == pytest.approx(alone, rel=1e-9)
            checked += 1
    assert checked > 300
