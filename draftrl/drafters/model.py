"""A draft model: any Hugging Face causal LM sharing the target's tokenizer, with its own KV cache."""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import DynamicCache

from draftrl.drafters.base import LevelDrafter, TreeBuilder
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample
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
        self._root: tuple[int, torch.Tensor] | None = None  # (history length, logits [V]) at the root

    def reset(self, prompt_ids: list[int]) -> None:
        self.cache = DynamicCache()
        self._fed = []
        self._root = None

    @torch.inference_mode()
    def _forward(
        self, tokens: list[int], positions: list[int], mask: torch.Tensor | None, last_only: bool = False
    ) -> torch.Tensor:
        """Draft logits [n, V] for the fed tokens ([1, V], the last one's, with ``last_only``), V the
        target's ids (see ``vocab`` in the class docstring)."""
        if self._num_rows is not None:
            tokens = [t if t < self._num_rows else 0 for t in tokens]
        out = self.model(
            input_ids=torch.tensor([tokens], device=self.device),
            position_ids=torch.tensor([positions], device=self.device),
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
        logits = self._forward(ids[start:], list(range(start, len(ids))), None, last_only=True)[-1]
        self._root = (len(ids), logits)
        return logits

    def features(self, ids: list[int]) -> dict[str, float]:
        probs = torch.softmax(self.root_logits(ids), dim=-1)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum().item()
        return {"draft_top1_prob": probs.max().item(), "draft_entropy": entropy}

    def _children(
        self, logits: torch.Tensor, width: int, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens [W], log q [W], q [V] or None) for one expanded node."""
        if self.sampled and not params.greedy:
            q = logits_to_probs(logits, params)
            if generator is not None:  # draw, and later verify, on the generator's device
                q = q.to(generator.device)
            tokens = sample(q, generator, num_samples=width)  # the float64 law verification assumes
            return tokens, q[tokens].clamp_min(1e-30).log(), q
        logq = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logq, width)
        return top.indices, top.values, None

    def begin(self, ids, width, params, generator) -> TreeBuilder:
        return _ModelTreeBuilder(self, ids, width, params, generator)

    @staticmethod
    def _ancestors(tree: DraftTree, node: int) -> set[int]:
        out = set()
        while node >= 0:
            out.add(node)
            node = tree.parents[node]
        return out

    def _level_mask(self, tree: DraftTree, expand: list[int], past: int) -> torch.Tensor:
        """Additive mask [1, 1, len(expand), cache + len(expand)] for one level's batched forward."""
        cache_len = cache_length(self.cache)
        col = {node: past + k for k, node in enumerate(self._fed)}
        col.update({node: cache_len + k for k, node in enumerate(expand)})
        allowed = torch.zeros(len(expand), cache_len + len(expand), dtype=torch.bool)
        allowed[:, :past] = True
        for row, node in enumerate(expand):
            for anc in self._ancestors(tree, node):
                allowed[row, col[anc]] = True
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask.to(self.device)[None, None]

    def commit(self, ids: list[int], accepted: list[int]) -> None:
        """Keep the committed prefix plus the accepted nodes the draft has already consumed."""
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
        committed = cache_length(self.cache) - len(self._fed)
        crop(self.cache, min(committed, length - 1))
        self._fed = []
        self._root = None


class _ModelTreeBuilder(TreeBuilder):
    """EAGLE-2 style expansion: each level is one batched draft forward over the previous level's
    ``width`` best nodes; the forward for a level runs only when that level is asked for."""

    def __init__(self, drafter: ModelDrafter, ids, width, params, generator):
        self.drafter, self.ids, self.width, self.params, self.generator = drafter, ids, width, params, generator
        self.tree = DraftTree(q={} if drafter.sampled and not params.greedy else None)
        drafter._fed = []
        self.frontier: list[tuple[int, torch.Tensor]] | None = None  # (node, logits) to expand next
        self.to_feed: list[int] = []

    @torch.inference_mode()
    def step(self) -> bool:
        drafter, tree, past = self.drafter, self.tree, len(self.ids)
        if self.frontier is None:
            tree.features = drafter.features(self.ids)
            self.frontier = [(-1, drafter.root_logits(self.ids))]
        elif self.to_feed:
            mask = drafter._level_mask(tree, self.to_feed, past)
            logits = drafter._forward(
                [tree.tokens[i] for i in self.to_feed], [past + tree.depths[i] - 1 for i in self.to_feed], mask
            )
            drafter._fed += self.to_feed
            self.frontier = list(zip(self.to_feed, logits))
        candidates = []
        for parent, logits in self.frontier:
            tokens, logq, q = drafter._children(logits, self.width, self.params, self.generator)
            if q is not None:
                tree.q[parent] = q
            base = 0.0 if parent < 0 else tree.scores[parent]
            candidates += [(base + lq, tok, parent) for tok, lq in zip(tokens.tolist(), logq.tolist())]
        if tree.q is None:  # deterministic: keep the best `width` of all candidates
            candidates.sort(key=lambda c: -c[0])
            candidates = candidates[: self.width]
        level_nodes = [tree.add(tok, parent, score) for score, tok, parent in candidates]
        # sampled trees keep every sampled child; only the best `width` of them are expanded
        self.to_feed = sorted(sorted(level_nodes, key=lambda i: -tree.scores[i])[: self.width])
        return bool(level_nodes)
