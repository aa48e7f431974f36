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
    agree_expected_deterministic_batch,
    agree_expected_sampled_batch,
    target_stats_batch,
    verify_node_deterministic_batch,
    verify_node_sampled_batch,
)
from draftrl.decoding.stats import TokenStats
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import (
    DeferredChecks,
    SamplingParams,
    check_generator_device,
    logits_to_probs,
    sample_rows,
)

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
    stats: TokenStats | None
    """exactness statistics, one entry per emitted token (None when not asked for)"""
    row_argmax: list[int] | None = None
    """temperature 0: the argmax of every verified row (root first, then node i at i + 1), as the walk
    transferred it; the engine checks each emitted token against it (``decoding.argmax_check``)"""

    def truncate(self, n: int) -> Acceptance:
        """The first ``n`` emitted tokens (EOS or the length limit cut the round)."""
        return Acceptance(self.tokens[:n], self.accepted[:n], None if self.stats is None else self.stats.slice(0, n),
                          self.row_argmax)


def accept_tree(
    tree: DraftTree,
    logits: torch.Tensor,  # [1 + len(tree), V]: row 0 at the root, row i + 1 at node i
    params: SamplingParams,
    generator: torch.Generator | None,
    sampler: str = "correct",
    probs: torch.Tensor | None = None,  # [1 + len(tree), V]: logits_to_probs(logits), if already computed
    stats: bool = True,
) -> Acceptance:
    """Descend from the root while a child is accepted; see the module docstring.

    Every tensor of the walk lives on ``logits``' device (``probs``' when given): p is computed
    there, each q is moved there, and ``generator`` must be a generator of that device.

    Host syncs: the walk reads the device once. Every row's outcome (the child it accepts or
    the token it emits) is drawn on the device as if the walk reached it, each from its own
    uniforms, and the host walks the tree on the transferred outcomes; a row the walk never
    reaches is discarded unseen, so each visited row's outcome is still an independent exact
    draw. The draws therefore follow a fixed layout per tree (sibling groups by size, then the
    leaves), whatever the outcome. ``stats`` (the :class:`TokenStats` the exactness monitor reads;
    False: None) costs one more transfer, over the emitted tokens' rows only.
    """
    if params.greedy:
        return _accept_greedy(tree, logits, stats, sampler)
    device = logits.device if probs is None else probs.device
    check_generator_device(generator, device)
    kids = tree.children()
    checks = DeferredChecks()
    with checks.collecting():
        p = probs if probs is not None else logits_to_probs(logits.float(), params)  # [1 + n, V]
        token, index = _outcomes(tree, kids, p, generator, "correct" if sampler == OFF_BY_ONE else sampler)
    rows = p.shape[0]
    values = torch.cat([token, index, checks.flags(device)]).tolist()  # the walk's one transfer
    checks.raise_failed(values[2 * rows :])
    tokens: list[int] = []
    accepted: list[int] = []
    node, kept_rejected = -1, False
    while True:
        children = kids.get(node, [])
        child, y = values[rows + node + 1], values[node + 1]
        if child < 0 and children and sampler == OFF_BY_ONE and not kept_rejected:  # the round's first rejection
            child, y, kept_rejected = 0, tree.tokens[children[0]], True
        tokens.append(y)
        if not children or child < 0:
            break
        node = children[child]
        accepted.append(node)
    if not stats:
        return Acceptance(tokens, accepted, None)
    return Acceptance(tokens, accepted, _emitted_stats(tree, kids, p, tokens, accepted))


def _outcomes(
    tree: DraftTree, kids: dict[int, list[int]], p: torch.Tensor, generator: torch.Generator | None, sampler: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's outcome as if the walk reached it, on the device: token [1 + n] (the accepted
    child's token, or the recovered or bonus token) and index [1 + n] (the accepted child's
    position among the row's children, -1 if none). One upload carries the tree's rows and children."""
    device, rows = p.device, p.shape[0]
    leaves = [node for node in range(-1, rows - 1) if node not in kids]
    groups = _sibling_groups(list(kids), kids)
    data = torch.tensor([node + 1 for node in leaves] + _group_data(tree, kids, groups), dtype=torch.long,
                        device=device)  # the one upload
    token = torch.zeros(rows, dtype=torch.long, device=device)
    index = torch.full((rows,), -1, dtype=torch.long, device=device)
    for parents, parent_rows, children in _split_groups(groups, data, len(leaves)):
        if tree.deterministic:
            found, drawn = verify_node_deterministic_batch(p[parent_rows], children, generator, method=sampler)
        else:
            q = torch.stack([tree.q[parent] for parent in parents]).to(device)
            found, drawn, _ = verify_node_sampled_batch(p[parent_rows], children, q, generator, method=sampler,
                                                        expected=False)
        index[parent_rows], token[parent_rows] = found, drawn
    if leaves:  # bonus tokens, drawn as ``models.distribution.sample`` draws
        leaf_rows = data[: len(leaves)]
        token[leaf_rows] = sample_rows(p[leaf_rows].double(), generator)
    return token, index


def _sibling_groups(parents: list[int], kids: dict[int, list[int]]) -> dict[int, list[int]]:
    """Number of children -> the ``parents`` with that many, in the given order (one batch each)."""
    groups: dict[int, list[int]] = {}
    for parent in parents:
        groups.setdefault(len(kids[parent]), []).append(parent)
    return dict(sorted(groups.items()))


def _group_data(tree: DraftTree, kids: dict[int, list[int]], groups: dict[int, list[int]]) -> list[int]:
    """Per group: its parents' rows, then their children's tokens (row-major), for one upload."""
    flat: list[int] = []
    for parents in groups.values():
        flat += [parent + 1 for parent in parents]
        flat += [tree.tokens[child] for parent in parents for child in kids[parent]]
    return flat


def _split_groups(groups: dict[int, list[int]], data: torch.Tensor, at: int):
    """(parents, their rows [B], their children's tokens [B, c]) per group, read from ``data`` at ``at``."""
    for size, parents in groups.items():
        num = len(parents)
        yield parents, data[at : at + num], data[at + num : at + num * (1 + size)].view(num, size)
        at += num * (1 + size)


def _emitted_stats(
    tree: DraftTree, kids: dict[int, list[int]], p: torch.Tensor, tokens: list[int], accepted: list[int]
) -> TokenStats:
    """The emitted tokens' :class:`TokenStats`, over their rows only (one upload, one transfer):
    emitted token j was drawn at the root (j = 0) or at the j-th accepted node."""
    nodes = [-1] + accepted[: len(tokens) - 1]
    drafted = [node for node in nodes if node in kids]
    groups = _sibling_groups(drafted, kids)
    position = {node: j for j, node in enumerate(nodes)}
    data = torch.tensor([node + 1 for node in nodes] + tokens + [position[node] for group in groups.values()
                                                                 for node in group] + _group_data(tree, kids, groups),
                        dtype=torch.long, device=p.device)
    n = len(nodes)
    at, emitted, where = data[:n], data[n : 2 * n], data[2 * n : 2 * n + len(drafted)]
    p_token, mass_before, entropy = target_stats_batch(p[at], emitted)
    agree_expected = torch.zeros(n, dtype=torch.float64, device=p.device)
    done = 0
    for parents, parent_rows, children in _split_groups(groups, data, 2 * n + len(drafted)):
        if tree.deterministic:
            expected = agree_expected_deterministic_batch(p[parent_rows], children)
        else:
            q = torch.stack([tree.q[parent] for parent in parents]).to(p.device)
            expected = agree_expected_sampled_batch(p[parent_rows], children, q)
        agree_expected[where[done : done + len(parents)]] = expected
        done += len(parents)
    values = torch.stack([p_token, mass_before, entropy, agree_expected]).tolist()
    agree = [float(any(tree.tokens[c] == y for c in kids.get(node, []))) for node, y in zip(nodes, tokens)]
    return TokenStats(token=tokens, p_token=values[0], mass_before=values[1], entropy=values[2],
                      drafted=[node in kids for node in nodes], agree=agree, agree_expected=values[3])


def _accept_greedy(tree: DraftTree, logits: torch.Tensor, stats: bool = True, sampler: str = "correct") -> Acceptance:
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
    return Acceptance(tokens, accepted, _stats(tokens, rows) if stats else None, row_argmax=best)


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
