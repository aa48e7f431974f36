"""A draft model: any Hugging Face causal LM sharing the target's tokenizer, with its own KV cache."""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import DynamicCache

from draftrl.drafters.base import LevelDrafter, TreeBuilder
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import DeferredChecks, SamplingParams, logits_to_probs, sample
from draftrl.models.kv import cache_argument, cache_length, crop, keep_tail, last_logits_only
from draftrl.models.vocab import SharedVocab


class ModelDrafter(LevelDrafter):
    """Any Hugging Face causal LM sharing the target's vocabulary, with its own KV cache.

    Expands a tree level by level (EAGLE-2 style): each level is ONE batched forward over the
    previous level's kept nodes under a tree attention mask; of all their children the ``width``
    best by cumulative draft log-probability are kept. Deterministic mode takes each node's top
    children; sampled mode (``sampled=True``, temperature > 0) draws ``width`` i.i.d. children from
    the draft's distribution q, which verification then treats by recursive rejection sampling.

    With ``vocab`` (a draft whose embedding matrix is padded differently from the target's, over
    one tokenizer) every draft logit row is mapped into the target's id space before anything
    reads it: ids ``>= vocab.num_shared`` (past the tokenizer or past either matrix) get logit
    -inf, so q is zero there and renormalised over the shared ids, the top children are shared
    ids, and q has the target's length. History tokens the draft has no embedding row for
    (padding ids a larger target emitted) are fed to the draft as id 0: its later proposals are
    merely worse, q remains the distribution it really proposed from.

    Host syncs: the levels stay on the device (tokens, scores, the choice of the kept nodes, the
    masks) and the tree reaches the host in one transfer when it is read; the root's features are
    one more, computed once per root (the env's ``features()`` and the round share it).
    """

    def __init__(self, model: nn.Module, sampled: bool = False, name: str = "model", vocab: SharedVocab | None = None):
        self.model = model
        self.sampled = sampled
        self.name = name
        self.vocab = None if vocab is None or vocab.identity else vocab
        self._num_rows = None  # the draft's input embedding rows, when some history ids may lie past them
        if self.vocab is not None:
            embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
            self._num_rows = int(embed.weight.shape[0]) if embed is not None else self.vocab.num_draft_logits
        self.device = next(model.parameters()).device
        self._cache_arg = cache_argument(model)
        self._last_only = last_logits_only(model)
        self.cache = DynamicCache()
        self._fed: list[int] = []  # node indices fed to the draft during the last proposal, in cache order
        #: (history length, logits [V], features or None) at the root
        self._root: tuple[int, torch.Tensor, dict[str, float] | None] | None = None
        self._builder: _ModelTreeBuilder | None = None  # the last proposal's builder, until committed

    def reset(self, prompt_ids: list[int]) -> None:
        self.cache = DynamicCache()
        self._fed = []
        self._root = None
        self._builder = None

    @torch.inference_mode()
    def _forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, last_only: bool = False
    ) -> torch.Tensor:
        """Draft logits [n, V] for the fed tokens ``input_ids`` [1, n] at ``position_ids`` [1, n]
        ([1, V], the last one's, with ``last_only``), V the target's ids (see ``vocab`` in the class
        docstring)."""
        if self._num_rows is not None:  # on the device: no sync
            input_ids = torch.where(input_ids < self._num_rows, input_ids, torch.zeros_like(input_ids))
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            **{self._cache_arg: self.cache},
            use_cache=True,
            **(self._last_only if last_only else {}),
        )
        logits = out.logits[0].float()
        if self.vocab is None:
            return logits
        shared = self.vocab.num_shared
        full = logits.new_full((logits.shape[0], self.vocab.num_target_logits), -math.inf)
        full[:, :shared] = logits[:, :shared]
        return full

    def root_logits(self, ids: list[int]) -> torch.Tensor:
        """Draft logits for the token after ``ids``: feeds whatever the draft cache has not seen."""
        if self._root is not None and self._root[0] == len(ids):
            return self._root[1]
        start = cache_length(self.cache)
        if start >= len(ids):  # cache ran ahead of the history (cannot happen after commit); re-feed last
            keep_tail(self.cache, len(ids) - 1, [])
            start = len(ids) - 1
        tokens = torch.tensor([ids[start:]], device=self.device)
        positions = torch.arange(start, len(ids), device=self.device)[None]
        logits = self._forward(tokens, positions, None, last_only=True)[-1]
        self._root = (len(ids), logits, None)
        return logits

    def features(self, ids: list[int]) -> dict[str, float]:
        logits = self.root_logits(ids)
        if self._root[2] is None:  # one transfer per root
            probs = torch.softmax(logits, dim=-1)
            entropy = -(probs * probs.clamp_min(1e-30).log()).sum()
            top1, entropy = torch.stack([probs.max(), entropy]).tolist()
            self._root = (*self._root[:2], {"draft_top1_prob": top1, "draft_entropy": entropy})
        return dict(self._root[2])

    def _children(
        self, logits: torch.Tensor, width: int, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens [..., W], log q [..., W], q [..., V] or None) for the expanded nodes' logits [..., V]."""
        if self.sampled and not params.greedy:
            q = logits_to_probs(logits, params)
            if generator is not None:  # draw, and later verify, on the generator's device
                q = q.to(generator.device)
            tokens = sample(q, generator, num_samples=width)  # the float64 law verification assumes
            return tokens, q.gather(-1, tokens).clamp_min(1e-30).log(), q
        logq = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logq, width)
        return top.indices, top.values, None

    def begin(self, ids, width, params, generator) -> TreeBuilder:
        self._builder = _ModelTreeBuilder(self, ids, width, params, generator)
        return self._builder

    def _settle(self) -> None:
        """Bring the last proposal's fed nodes to the host (``_fed``) before the cache is cut."""
        if self._builder is not None:
            self._builder.tree  # noqa: B018 (reading it transfers whatever is pending)
            self._builder = None

    def commit(self, ids: list[int], accepted: list[int]) -> None:
        """Keep the committed prefix plus the accepted nodes the draft has already consumed."""
        self._settle()
        fed = self._fed
        past = cache_length(self.cache) - len(fed)
        kept = []
        for node in accepted:
            if node not in fed:
                break
            kept.append(past + fed.index(node))
        keep_tail(self.cache, past, kept)
        self._fed = []
        self._root = None

    def rewind(self, length: int) -> None:
        self._settle()
        committed = cache_length(self.cache) - len(self._fed)
        crop(self.cache, min(committed, length - 1))
        self._fed = []
        self._root = None


class _ModelTreeBuilder(TreeBuilder):
    """EAGLE-2 style expansion: each level is one batched draft forward over the previous level's
    ``width`` best nodes; the forward for a level runs only when that level is asked for.

    Everything a level decides stays on the device: the children's tokens and scores, which
    candidates are kept (deterministic: the ``width`` best of all; sampled: every child), which
    nodes the next forward expands (the ``width`` best), the ancestor masks. Level sizes do not
    depend on the data, so the host knows every shape; :attr:`tree` transfers the pending levels
    in one read. Scores are added in float64 and ranked by a stable sort, as the host did before
    (so the same trees are drafted).
    """

    def __init__(self, drafter: ModelDrafter, ids, width, params, generator):
        self.drafter, self.ids, self.width, self.params, self.generator = drafter, ids, width, params, generator
        self._tree = DraftTree(q={} if drafter.sampled and not params.greedy else None)
        drafter._fed = []
        self.num_nodes = 0  # nodes drafted so far, pending ones included
        self.num_levels = 0
        self.pending: list[tuple] = []  # levels not in _tree yet: (tokens, parents, scores, q rows or None)
        self.pending_fed: list[torch.Tensor] = []  # nodes fed since the last transfer, in cache order
        #: the nodes the next forward feeds: (nodes [F], tokens [F], scores [F] float64, parents' fed rows [F] or None)
        self.feed: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        self.ancestors: torch.Tensor | None = None  # [fed, fed] bool: row i = fed node i's fed ancestors and itself
        self.checks = DeferredChecks()

    @property
    def tree(self) -> DraftTree:
        if self.pending or self.pending_fed:
            self._transfer()
        return self._tree

    @torch.inference_mode()
    def step(self) -> bool:
        drafter, width = self.drafter, self.width
        with self.checks.collecting():
            if self.feed is None:
                self._tree.features = drafter.features(self.ids)
                logits = drafter.root_logits(self.ids)[None]  # [1, V]
                nodes = torch.full((1,), -1, dtype=torch.long, device=logits.device)
                scores = torch.zeros(1, dtype=torch.float64, device=logits.device)
                fed_before = None
            else:
                nodes, tokens, scores, parent_rows = self.feed
                fed_before = 0 if self.ancestors is None else self.ancestors.shape[0]
                mask = self._mask(parent_rows, len(self.ids))
                positions = torch.full((1, nodes.shape[0]), len(self.ids) + self.num_levels - 1, device=drafter.device)
                logits = drafter._forward(tokens[None], positions, mask)  # [F, V]
                self.pending_fed.append(nodes)
            children, logq, q = drafter._children(logits, width, self.params, self.generator)  # [F, W]
            children, logq = children.to(nodes.device), logq.to(nodes.device)
            candidates = (scores[:, None] + logq.double()).flatten()  # [F * W], parent-major
            if q is None:  # deterministic: keep the best `width` of all candidates
                order = torch.sort(-candidates, stable=True).indices[:width]
            else:  # sampled trees keep every sampled child
                order = torch.arange(candidates.shape[0], device=nodes.device)
            rows = order // width  # each kept candidate's parent, as a row of this forward
            level_tokens, level_scores = children.flatten()[order], candidates[order]
            self.pending.append((level_tokens, nodes[rows], level_scores, None if q is None else (nodes, q)))
            base, size = self.num_nodes, order.shape[0]
            self.num_nodes += size
            self.num_levels += 1
            # only the best `width` of the level are expanded, in node order
            keep = torch.arange(size, device=nodes.device)
            if size > width:
                keep = torch.sort(torch.sort(-level_scores, stable=True).indices[:width]).values
            parents_fed = None if fed_before is None else fed_before + rows[keep]
            self.feed = (base + keep, level_tokens[keep], level_scores[keep], parents_fed)
        return True

    def _mask(self, parent_rows: torch.Tensor | None, past: int) -> torch.Tensor:
        """Additive mask [1, 1, F, past + fed + F] for feeding ``self.feed``: the history, each fed
        node's ancestors (its parent's row of ``ancestors``) and itself; grows ``ancestors``."""
        new = self.feed[0].shape[0]
        fed = 0 if self.ancestors is None else self.ancestors.shape[0]
        device = self.drafter.device
        rows = torch.zeros((new, fed + new), dtype=torch.bool, device=device)
        if parent_rows is not None:
            rows[:, :fed] = self.ancestors[parent_rows]
        rows[:, fed:] = torch.eye(new, dtype=torch.bool, device=device)
        if self.ancestors is None:
            self.ancestors = rows
        else:
            above = torch.cat([self.ancestors, torch.zeros((fed, new), dtype=torch.bool, device=device)], dim=1)
            self.ancestors = torch.cat([above, rows])
        dtype = next(self.drafter.model.parameters()).dtype
        mask = torch.zeros((new, past + fed + new), dtype=dtype, device=device)
        mask[:, past:].masked_fill_(~rows, torch.finfo(dtype).min)
        return mask[None, None]

    def _transfer(self) -> None:
        """The pending levels and fed nodes, and the deferred input checks, to the host in one read."""
        device = self.drafter.device
        parts = []
        for tokens, parents, scores, q_rows in self.pending:
            parts += [tokens.double(), parents.double(), scores] + ([q_rows[0].double()] if q_rows else [])
        parts += [nodes.double() for nodes in self.pending_fed]
        parts.append(self.checks.flags(device).double())
        values = torch.cat([p.to(device) for p in parts]).tolist()
        self.checks.raise_failed(values[len(values) - len(self.checks.pending) :])
        at = 0
        for tokens, _, _, q_rows in self.pending:
            size = tokens.shape[0]
            for token, parent, score in zip(values[at : at + size], values[at + size : at + 2 * size],
                                            values[at + 2 * size : at + 3 * size]):
                self._tree.add(int(token), int(parent), score)
            at += 3 * size
            if q_rows is not None:
                nodes, q = q_rows
                for row, node in enumerate(values[at : at + nodes.shape[0]]):
                    self._tree.q[int(node)] = q[row]
                at += nodes.shape[0]
        for nodes in self.pending_fed:
            self.drafter._fed += [int(node) for node in values[at : at + nodes.shape[0]]]
            at += nodes.shape[0]
        self.pending, self.pending_fed = [], []
