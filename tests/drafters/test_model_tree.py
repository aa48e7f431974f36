"""A draft model's tree, grown on the device, equals EAGLE-2 expansion from plain forwards (issue 40).

``ModelDrafter`` keeps each level on the device (children, scores, the kept and expanded nodes,
ancestor masks, positions) and reads the tree once. The reference here computes every expanded
node's draft distribution by a plain forward over the history and the node's path (no cache, no
mask), then applies the same rule on the host: the ``width`` best children of all (deterministic),
or ``width`` i.i.d. draws per expanded node, the ``width`` best of which are expanded next
(sampled). A wrong mask, position or kept-node bookkeeping changes the draft's logits or the
tree. Rounds follow one another with commits of accepted paths, so the compacted cache is used.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample

WIDTH, DEPTH = 3, 4


@pytest.fixture(scope="module")
def draft():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval().double()  # float64: no near-ties between the two computations


def reference(model, ids: list[int], params: SamplingParams, sampled: bool, generator) -> DraftTree:
    tree = DraftTree(q={} if sampled else None)
    frontier, paths = [-1], {-1: []}
    for _ in range(DEPTH):
        candidates = []
        for parent in frontier:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids + paths[parent]])).logits[0, -1].float()
            if sampled:
                q = logits_to_probs(logits, params)
                tokens = sample(q, generator, num_samples=WIDTH)
                tree.q[parent] = q
                logq = q[tokens].clamp_min(1e-30).log()
            else:
                top = torch.topk(torch.log_softmax(logits, dim=-1), WIDTH)
                tokens, logq = top.indices, top.values
            base = 0.0 if parent < 0 else tree.scores[parent]
            candidates += [(base + lq, tok, parent) for tok, lq in zip(tokens.tolist(), logq.tolist())]
        if not sampled:
            candidates = sorted(candidates, key=lambda c: -c[0])[:WIDTH]
        level = []
        for score, tok, parent in candidates:
            node = tree.add(tok, parent, score)
            paths[node] = paths[parent] + [tok]
            level.append(node)
        frontier = sorted(sorted(level, key=lambda i: -tree.scores[i])[:WIDTH])
    return tree


@pytest.mark.parametrize("temperature, sampled", [(0.0, False), (1.0, False), (1.0, True)])
def test_the_device_grown_tree_equals_expansion_from_plain_forwards(draft, temperature, sampled):
    params = SamplingParams(temperature=temperature)
    drafter = ModelDrafter(draft, sampled=sampled)
    ids = [1, 2, 3, 4, 5, 6]
    drafter.reset(ids)
    for round_ in range(4):
        got = drafter.propose(ids, DEPTH, WIDTH, params, torch.Generator().manual_seed(round_))
        want = reference(draft, ids, params, sampled, torch.Generator().manual_seed(round_))
        assert (got.tokens, got.parents, got.depths) == (want.tokens, want.parents, want.depths), round_
        assert got.scores == pytest.approx(want.scores, abs=1e-6)
        if sampled:
            assert sorted(got.q) == sorted(want.q)
            assert all(torch.allclose(got.q[k], want.q[k], atol=1e-6) for k in want.q)
        # accept a path through the second level's last expanded node, then a bonus token
        node = max(i for i, d in enumerate(got.depths) if d == 2)
        path = [got.parents[node], node] if round_ % 2 else [got.parents[node]]
        ids = ids + [got.tokens[n] for n in path] + [7 + round_]
        with torch.inference_mode():  # as the engine commits
            drafter.commit(ids, path)
