"""Draft trees: the proposals of one round, and the verification subset the target sees.

A tree hangs off the *root*: the last committed token, which the target has not consumed yet.
Nodes are stored in topological order (every parent before its children); node ``i`` proposes
``tokens[i]`` as the continuation of ``parents[i]`` (-1 = the root). A chain is a tree in which
every node's parent is the node before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class DraftTree:
    """What a drafter proposes for one round.

    ``q`` is None for deterministic proposals (greedy / top-W model trees, n-gram tries): the
    proposal distribution is then one-hot and verification samples y ~ p and descends iff y is a
    child. Otherwise ``q[parent]`` is the distribution [V] from which that parent's children were
    drawn i.i.d., and verification uses recursive rejection sampling.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    #: cumulative draft log-probability (model drafters) or trie score (n-gram); never larger
    #: than the parent's score, so the top-V nodes always form a connected subtree.
    scores: list[float] = field(default_factory=list)
    q: dict[int, torch.Tensor] | None = None
    #: draft-side signals a policy may observe before the target verifies (never target output)
    features: dict[str, float] = field(default_factory=dict)
    #: for a subset made by :meth:`select`: each node's index in the drafter's full tree
    origin: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def source_index(self, node: int) -> int:
        """``node``'s index in the drafter's full tree (``node`` itself unless this is a selection)."""
        return self.origin[node] if self.origin is not None else node

    @property
    def deterministic(self) -> bool:
        return self.q is None

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def add(self, token: int, parent: int, score: float) -> int:
        depth = 1 if parent < 0 else self.depths[parent] + 1
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.depths.append(depth)
        self.scores.append(float(score))
        return len(self.tokens) - 1

    def select(self, verify_size: int | None) -> DraftTree:
        """The verification subset: the ``verify_size`` best nodes, connected and containing the root.

        Deterministic trees keep the top nodes by score (ties: shallower first), which is connected
        because scores never increase along a path. Sampled trees must keep every parent's i.i.d.
        children together, or the kept children would no longer be draws from q: they keep whole
        sibling groups in breadth-first order while the budget allows.
        """
        if verify_size is None or verify_size >= len(self):
            return self
        if verify_size <= 0:
            return self.subset([])
        if self.deterministic:
            order = sorted(range(len(self)), key=lambda i: (-self.scores[i], self.depths[i], i))
            keep = sorted(order[:verify_size])
        else:
            keep = []
            groups: dict[int, list[int]] = {}
            for i, parent in enumerate(self.parents):
                groups.setdefault(parent, []).append(i)
            kept = {-1}
            for i, parent in enumerate(self.parents):
                if i != groups[parent][0] or parent not in kept:
                    continue
                if len(keep) + len(groups[parent]) > verify_size:
                    break
                keep.extend(groups[parent])
                kept.update(groups[parent])
            keep.sort()
        return self.subset(keep)

    def subset(self, keep: list[int]) -> DraftTree:
        """The sub-tree on the sorted node indices ``keep`` (each kept node's parent is kept)."""
        remap = {-1: -1}
        out = DraftTree(features=dict(self.features))
        for i in keep:
            assert self.parents[i] in remap, "subset must be closed under parents"
            remap[i] = out.add(self.tokens[i], remap[self.parents[i]], self.scores[i])
        out.origin = [self.source_index(i) for i in keep]
        if self.q is not None:
            out.q = {remap[p]: dist for p, dist in self.q.items() if p in remap}
        return out

    def children(self) -> dict[int, list[int]]:
        """parent index (-1 = root) -> child node indices, in node order."""
        kids: dict[int, list[int]] = {}
        for i, parent in enumerate(self.parents):
            kids.setdefault(parent, []).append(i)
        return kids

    def ancestors(self) -> np.ndarray:
        """[1 + n, 1 + n] bool: row 0 is the root, row i + 1 node i; each row marks the root, the
        node's ancestors and the node itself (what its query may attend to among the tree's rows)."""
        n = len(self)
        table = np.zeros((1 + n, 1 + n), dtype=bool)
        table[:, 0] = True
        for i, parent in enumerate(self.parents):
            table[i + 1] = table[parent + 1]  # the root's row for a child of the root
            table[i + 1, i + 1] = True
        return table

    def attention_mask(
        self, past_len: int, dtype: torch.dtype, device: torch.device, ancestors: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Additive 4-D mask [1, 1, 1 + n, past_len + 1 + n] for feeding root + nodes after ``past_len``
        cached tokens: each query sees the whole past, the root and its own ancestors.

        Built on ``device`` from :meth:`ancestors` (uploaded here, or passed already on ``device``
        when the caller uploads it with other data); the past's columns are never copied."""
        if ancestors is None:
            ancestors = torch.from_numpy(self.ancestors()).to(device)
        n = len(self)
        mask = torch.zeros((1 + n, past_len + 1 + n), dtype=dtype, device=device)
        mask[:, past_len:].masked_fill_(~ancestors, torch.finfo(dtype).min)
        return mask[None, None]

    def position_ids(
        self, past_len: int, device: torch.device, ancestors: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Positions [1, 1 + n]: the root sits at ``past_len``, a node at ``past_len + depth``
        (with ``ancestors`` on ``device``: computed there, as its rows' counts, with no upload)."""
        if ancestors is None:
            return torch.tensor([[past_len] + [past_len + d for d in self.depths]], device=device)
        return (ancestors.sum(dim=-1) + (past_len - 1))[None]
