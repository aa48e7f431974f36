"""Accept the longest valid path of a verified draft tree, exactly. Pure tensors, no models.

Walk from the root: at each node p is the target's distribution there (after temperature,
top-k, top-p). Deterministic children: sample y ~ p and descend iff y is a child. Children
drawn i.i.d. from q: recursive rejection sampling with residual updates. The walk ends with a
*recovered* token (no child accepted) or a *bonus* token (a node with no verified children).

*Keyed* sampling (``keyed=(seed, position)``, deterministic children only): the row at output
position t draws y with :func:`~draftrl.models.distribution.sample_keyed` from the stream keyed by
(seed, t), so the round emits exactly what plain decoding with the same keyed stream emits.

Every walk also reports, free (in the walk's one transfer), what its forward computed about the
target's own uncertainty: :meth:`Acceptance.target_features` (``signals.features.TARGET_FEATURES``).
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
    sample_keyed,
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
    row_top1: list[float] | None = None
    """every row's raw softmax top-1 probability (row 0 the root, row i + 1 node i)"""
    row_entropy: list[float] | None = None
    """every row's raw softmax entropy, nats"""
    row_p: list[float] | None = None
    """every row's p (transformed) of the token it emitted or the child it accepted"""
    parents: list[int] | None = None
    """the tree's parent of each node (-1 the root), to find an accepted node's row"""

    def truncate(self, n: int) -> Acceptance:
        """The first ``n`` emitted tokens (EOS or the length limit cut the round)."""
        return Acceptance(self.tokens[:n], self.accepted[:n], None if self.stats is None else self.stats.slice(0, n),
                          self.row_argmax, self.row_top1, self.row_entropy, self.row_p, self.parents)

    def target_features(self) -> dict[str, float]:
        """``signals.features.TARGET_FEATURES`` of the emitted tokens: the raw (temperature 1, unfiltered)
        softmax's top-1 probability and entropy (nats) at the row that drew the last emitted token, and the
        mean p (transformed) of the accepted draft tokens (0 when none); {} when the walk did not compute them."""
        if self.row_top1 is None or not self.tokens:
            return {}
        last_row = ([-1] + self.accepted)[len(self.tokens) - 1] + 1  # the row that drew the last token
        accepted = self.accepted[: len(self.tokens)]
        p = [self.row_p[self.parents[node] + 1] for node in accepted]
        return {"target_top1_prob": self.row_top1[last_row], "target_entropy": self.row_entropy[last_row],
                "accepted_mean_p": sum(p) / len(p) if p else 0.0}


def accept_tree(
    tree: DraftTree,
    logits: torch.Tensor,  # [1 + len(tree), V]: row 0 at the root, row i + 1 at node i
    params: SamplingParams,
    generator: torch.Generator | None,
    sampler: str = "correct",
    probs: torch.Tensor | None = None,  # [1 + len(tree), V]: logits_to_probs(logits), if already computed
    stats: bool = True,
    keyed: tuple[int, int] | None = None,
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

    ``keyed=(seed, position)``: draw each row's token from the stream keyed by (seed, position + the
    row's depth) instead of ``generator`` (module docstring); needs deterministic children and the
    correct rule (or ``off-by-one``, whose walk change applies on top).
    """
    if params.greedy:
        return _accept_greedy(tree, logits, stats, sampler)
    if keyed is not None and (not tree.deterministic or sampler == "resample-from-p"):
        raise ValueError("keyed sampling replays one draw per position: it needs deterministic drafts (not "
                         "EnvConfig.draft_sampling) and the correct rule; turn keyed sampling off for this run.")
    device = logits.device if probs is None else probs.device
    check_generator_device(generator, device)
    kids = tree.children()
    checks = DeferredChecks()
    with checks.collecting():
        p = probs if probs is not None else logits_to_probs(logits.float(), params)  # [1 + n, V]
        if keyed is None:
            token, index = _outcomes(tree, kids, p, generator, "correct" if sampler == OFF_BY_ONE else sampler)
        else:
            token, index = _keyed_outcomes(tree, kids, p, *keyed)
        top1, entropy = _raw_uncertainty(logits)
        p_out = p.gather(-1, token.unsqueeze(-1)).squeeze(-1).double() / p.sum(dim=-1, dtype=torch.float64)
    rows = p.shape[0]
    # the walk's one transfer
    values = torch.cat([token.double(), index.double(), top1, entropy, p_out, checks.flags(device).double()]).tolist()
    checks.raise_failed(values[5 * rows :])
    row_top1, row_entropy, row_p = values[2 * rows: 3 * rows], values[3 * rows: 4 * rows], values[4 * rows: 5 * rows]
    values = [int(v) for v in values[: 2 * rows]]
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
    found = _emitted_stats(tree, kids, p, tokens, accepted) if stats else None
    return Acceptance(tokens, accepted, found, None, row_top1, row_entropy, row_p, list(tree.parents))


def _raw_uncertainty(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, V] logits -> the raw (temperature 1) softmax's top-1 probability and entropy per row, float64
    [R] each: the target's own uncertainty, whatever the request's sampling."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(logp.exp() * logp).nan_to_num(0.0).sum(dim=-1)
    return logp.amax(dim=-1).exp().double(), entropy.double()


def _keyed_outcomes(tree: DraftTree, kids: dict[int, list[int]], p: torch.Tensor, seed: int, position: int,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_outcomes` under keyed sampling: row r (the root, or node r - 1 at depth d) draws its token
    from the stream of output position ``position + d``; its accepted child is the child equal to it."""
    rows = p.shape[0]
    depths = [0] + [int(d) for d in tree.depths]
    token = sample_keyed(p, seed, [position + d for d in depths])  # [1 + n]
    index = torch.full((rows,), -1, dtype=torch.long, device=p.device)
    groups = _sibling_groups(list(kids), kids)
    if groups:
        data = torch.tensor(_group_data(tree, kids, groups), dtype=torch.long, device=p.device)
        for _, parent_rows, children in _split_groups(groups, data, 0):
            match = children == token[parent_rows].unsqueeze(-1)
            index[parent_rows] = torch.where(match.any(dim=-1), match.long().argmax(dim=-1), -1)
    return token, index


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
    every statistic is then known without touching the vocabulary again (but for the raw softmax's
    target features, in the same transfer)."""
    rows = logits.shape[0]
    top1, entropy = _raw_uncertainty(logits)
    values = torch.cat([logits.argmax(dim=-1).double(), top1, entropy]).tolist()  # the walk's one transfer
    best = [int(v) for v in values[:rows]]
    kids = tree.children()
    tokens: list[int] = []
    accepted: list[int] = []
    stat_rows: list[tuple] = []
    node, kept_rejected = -1, False
    while True:
        y = best[node + 1]
        children = kids.get(node, [])
        child = next((c for c in children if tree.tokens[c] == y), None)
        if child is None and children and sampler == OFF_BY_ONE and not kept_rejected:
            child, kept_rejected = children[0], True  # the negative control keeps the first rejected draft token
            y = tree.tokens[child]
        agree = float(child is not None)
        stat_rows.append((1.0, 0.0, 0.0, bool(children), agree, agree))
        tokens.append(y)
        if child is None:
            break
        node = child
        accepted.append(node)
    return Acceptance(tokens, accepted, _stats(tokens, stat_rows) if stats else None, best, values[rows: 2 * rows],
                      values[2 * rows:], [1.0] * rows, list(tree.parents))


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
