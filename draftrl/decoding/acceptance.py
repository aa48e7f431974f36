"""Accept the longest valid path of a verified draft tree, exactly. Pure tensors, no models.

Walk from the root: at each node p is the target's distribution there (after temperature,
top-k, top-p). Deterministic children: sample y ~ p and descend iff y is a child. Children
drawn i.i.d. from q: recursive rejection sampling with residual updates. The walk ends with a
*recovered* token (no child accepted) or a *bonus* token (a node with no verified children).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from draftrl.decoding.sampling import (
    agree_expected_deterministic,
    target_stats,
    verify_node_deterministic,
    verify_node_sampled,
)
from draftrl.decoding.stats import TokenStats
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, check_generator_device, logits_to_probs, sample

#: The known-wrong acceptance of ``draftrl.config.SAMPLERS`` (negative controls only): at a round's
#: first rejection the rejected draft token (the node's first child) is emitted and kept as accepted,
#: and the walk goes on from it.
OFF_BY_ONE = "off-by-one"


@dataclass
class Acceptance:
    tokens: list[int]
    """emitted tokens: accepted draft tokens, then one recovered or bonus token"""
    accepted: list[int]
    """accepted node indices, root to leaf"""
    stats: TokenStats
    """exactness statistics, one entry per emitted token"""
    row_argmax: list[int] | None = None
    """temperature 0: the argmax of every verified row (root first, then node i at i + 1), as the walk
    transferred it; the engine checks each emitted token against it (``decoding.argmax_check``)"""

    def truncate(self, n: int) -> "Acceptance":
        """The first ``n`` emitted tokens (EOS or the length limit cut the round)."""
        return Acceptance(self.tokens[:n], self.accepted[:n], self.stats.slice(0, n), self.row_argmax)


def accept_tree(
    tree: DraftTree,
    logits: torch.Tensor,  # [1 + len(tree), V]: row 0 at the root, row i + 1 at node i
    params: SamplingParams,
    generator: torch.Generator | None,
    sampler: str = "correct",
    probs: torch.Tensor | None = None,  # [1 + len(tree), V]: logits_to_probs(logits), if already computed
) -> Acceptance:
    """Descend from the root while a child is accepted; see the module docstring.

    Every tensor of the walk lives on ``logits``' device (``probs``' when given): p is computed
    there, each q is moved there, and ``generator`` must be a generator of that device.
    """
    if params.greedy:
        return _accept_greedy(tree, logits, sampler)
    device = logits.device if probs is None else probs.device
    check_generator_device(generator, device)
    kids = tree.children()
    tokens: list[int] = []
    accepted: list[int] = []
    rows: list[tuple] = []  # (p_token, mass_before, entropy, drafted, agree, agree_expected)
    node, kept_rejected = -1, False
    while True:
        p = probs[node + 1] if probs is not None else logits_to_probs(logits[node + 1].float(), params)
        children = kids.get(node, [])
        if not children:
            y = int(sample(p, generator))
            rows.append((*target_stats(p, y), False, 0.0, 0.0))
            tokens.append(y)
            break
        child_tokens = torch.tensor([tree.tokens[c] for c in children], device=device)
        method = "correct" if sampler == OFF_BY_ONE else sampler
        if tree.deterministic:
            index, y = verify_node_deterministic(p, child_tokens, generator, method=method)
            expected = agree_expected_deterministic(p, child_tokens)  # normalised p, in float64
        else:
            q = tree.q[node].to(device)
            index, y, expected = verify_node_sampled(p, child_tokens, q, generator, method=method)
        if index < 0 and sampler == OFF_BY_ONE and not kept_rejected:  # the round's first rejection
            index, y, kept_rejected = 0, tree.tokens[children[0]], True
        rows.append((*target_stats(p, y), True, float(bool((child_tokens == y).any())), expected))
        tokens.append(y)
        if index < 0:
            break
        node = children[index]
        accepted.append(node)
    return Acceptance(tokens, accepted, _stats(tokens, rows))


def _accept_greedy(tree: DraftTree, logits: torch.Tensor, sampler: str = "correct") -> Acceptance:
    """Temperature 0: p is one-hot at the argmax (lowest id on ties, as ``logits_to_probs``), so
    every rule above reduces to "descend while the argmax is a child". One argmax for all rows;
    every statistic is then known without touching the vocabulary again."""
    best = logits.argmax(dim=-1).tolist()
    kids = tree.children()
    tokens: list[int] = []
    accepted: list[int] = []
    rows: list[tuple] = []
    node, kept_rejected = -1, False
    while True:
        y = best[node + 1]
        children = kids.get(node, [])
        child = next((c for c in children if tree.tokens[c] == y), None)
        if child is None and children and sampler == OFF_BY_ONE and not kept_rejected:
            child, kept_rejected = children[0], True  # the negative control keeps the first rejected draft token
            y = tree.tokens[child]
        agree = float(child is not None)
        rows.append((1.0, 0.0, 0.0, bool(children), agree, agree))
        tokens.append(y)
        if child is None:
            break
        node = child
        accepted.append(node)
    return Acceptance(tokens, accepted, _stats(tokens, rows), row_argmax=best)


def _stats(tokens: list[int], rows: list[tuple]) -> TokenStats:
    columns = list(zip(*rows))
    return TokenStats(
        token=np.array(tokens, dtype=np.int64),
        p_token=np.array(columns[0], dtype=np.float64),
        mass_before=np.array(columns[1], dtype=np.float64),
        entropy=np.array(columns[2], dtype=np.float64),
        drafted=np.array(columns[3], dtype=bool),
        agree=np.array(columns[4], dtype=np.float64),
        agree_expected=np.array(columns[5], dtype=np.float64),
    )
