"""Drafters: everything that proposes tokens for the target to verify.

Every drafter has one verb, ``propose``, which returns a :class:`DraftTree` (tokens, parents,
scores, the proposal distribution q or None for deterministic proposals, and draft-side
features). ``features`` gives the same signals *before* a round is chosen, so a policy can look
at them without seeing the target's verdict. ``commit`` tells a stateful drafter which proposed
nodes were accepted so that it can roll its KV cache back to the accepted prefix.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

from draftrl.decoding.kv import cache_argument, cache_length, crop, keep_tail, last_logits_only
from draftrl.decoding.sampling import SamplingParams, logits_to_probs, sample
from draftrl.decoding.tree import DraftTree


class Drafter(ABC):
    """Proposes draft trees over a shared token history ``ids`` (prompt + generated)."""

    #: proposals are sampled from q (True) or chosen deterministically (False)
    sampled: bool = False

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new request."""

    @abstractmethod
    def features(self, ids: list[int]) -> dict[str, float]:
        """Draft-side signals for the next round, computed before any target verification."""

    @abstractmethod
    def begin(
        self, ids: list[int], width: int, params: SamplingParams, generator: torch.Generator | None
    ) -> "TreeBuilder":
        """Start drafting a tree of ``width`` nodes per level after ``ids``, one level per ``step``."""

    def propose(
        self, ids: list[int], depth: int, width: int, params: SamplingParams, generator: torch.Generator | None
    ) -> DraftTree:
        """A tree of at most ``depth`` levels and ``width`` nodes per level continuing ``ids``."""
        builder = self.begin(ids, width, params, generator)
        for _ in range(depth):
            if not builder.step():
                break
        return builder.tree

    def commit(self, ids: list[int], accepted: list[int]) -> None:
        """``ids`` is the new history; ``accepted`` the accepted node indices of the last proposal."""

    def rewind(self, length: int) -> None:
        """The history was cut back to its first ``length`` tokens."""


class TreeBuilder(ABC):
    """One round's draft tree, grown a level at a time so that a depth policy can stop it."""

    tree: DraftTree

    @abstractmethod
    def step(self) -> bool:
        """Add one level; False when the drafter has nothing more to propose."""

    def level_features(self) -> dict[str, float]:
        """Draft-side signals of the newest level (its best cumulative probability, its size)."""
        newest = max(self.tree.depths, default=0)
        scores = [s for s, d in zip(self.tree.scores, self.tree.depths) if d == newest]
        return {
            "level": float(newest),
            "level_best_prob": math.exp(max(scores)) if scores else 0.0,
            "level_num_nodes": float(len(scores)),
        }


class NgramDrafter(Drafter):
    """Prompt lookup: continue the longest suffix n-gram that occurred earlier in prompt + output.

    Two candidates, as tree alternatives (the closing note of the previous session measured that
    each wins on some tasks: the earliest on code editing, the vote on QA over a context and chat):

    - the **earliest occurrence**'s continuation, as Hugging Face prompt lookup proposes it
      (``PromptLookupCandidateGenerator``: the first match, left to right, at the longest n);
      a width-1 chain is exactly this path (tested against transformers' own generator);
    - the **vote**: the trie of the continuations of the ``max_matches - 1`` most recent matches,
      a node scored by the log share of matches through it (recency breaks ties).

    Scores never increase along a path: nodes on the earliest path score ``-1e-3 * depth``,
    every other node ``log(share) - 1 - 1e-3 * recency``, so ``DraftTree.select`` verifies the
    earliest path first and the vote's nodes next. Proposals are deterministic (q is one-hot).

    ``first="latest"`` puts the most recent occurrence's path first instead (the width-1 chain
    is then its continuation, as the minimal prompt-lookup proposer of issue 10 drafts; vLLM's
    ``ngram`` takes the earliest). Replayed on the 16 held-out vLLM recordings at depth 4 it
    took 596 engine steps instead of 610 and drafted 1657 tokens instead of 1733
    (``benchmarks/lookup_replay.py``): output text repeats its own recent past more than the
    prompt's first occurrence.

    ``features`` (before any verification): ``ngram_match_len`` (n of the match, 0 = none),
    ``ngram_num_matches`` (earlier occurrences of that n-gram), ``ngram_match_pos`` (how far
    back the earliest occurrence starts, as a share of the history: 1 = at the very start),
    ``ngram_vote_agrees`` (1 when the earliest occurrence's next token is also the vote's).
    """

    FIRST = ("earliest", "latest")

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3, max_matches: int = 16, first: str = "earliest"):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"NgramDrafter needs 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if max_matches < 2:
            raise ValueError(f"NgramDrafter needs max_matches >= 2 (the earliest and the most recent), got {max_matches}")
        if first not in self.FIRST:
            raise ValueError(f"NgramDrafter first={first!r} is unknown; choose earliest or latest.")
        self.min_ngram, self.max_ngram, self.max_matches = min_ngram, max_ngram, max_matches
        self.first = first

    def _matches(self, ids: list[int]) -> tuple[int, list[int], int]:
        """(matched n, continuation starts: the earliest match first, then the most recent ones,
        number of matches found)."""
        arr = np.asarray(ids, dtype=np.int64)
        for n in range(min(self.max_ngram, len(arr) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                recent = hits[::-1][: self.max_matches - 1]
                starts = [int(hits[0]) + n] + [int(h) + n for h in recent if h != hits[0]]
                return n, starts, int(hits.size)
        return 0, [], 0

    def _features(self, ids: list[int], n: int, starts: list[int], num_found: int) -> dict[str, float]:
        agrees = 0.0
        if starts:
            votes: dict[int, int] = {}
            for start in starts[1:] or starts:
                votes[ids[start]] = votes.get(ids[start], 0) + 1
            top = max(votes.values())
            agrees = float(votes.get(ids[starts[0]], 0) == top)
        return {
            "ngram_match_len": float(n),
            "ngram_num_matches": float(num_found),
            "ngram_match_pos": (len(ids) - (starts[0] - n)) / len(ids) if starts else 0.0,
            "ngram_vote_agrees": agrees,
        }

    def features(self, ids: list[int]) -> dict[str, float]:
        return self._features(ids, *self._matches(ids))

    def begin(self, ids, width, params, generator) -> "TreeBuilder":
        n, starts, num_found = self._matches(ids)
        primary = 1 if self.first == "latest" and len(starts) > 1 else 0  # starts: earliest, then most recent
        return _TrieBuilder(ids, starts, width, self._features(ids, n, starts, num_found), primary)


class _TrieBuilder(TreeBuilder):
    """Grows the trie of the continuations of every match, keeping ``width`` nodes per level; the
    node on the primary match's path (match rank ``primary``: 0 = the earliest) always comes first."""

    def __init__(self, ids: list[int], starts: list[int], width: int, features: dict[str, float], primary: int = 0):
        self.ids, self.starts, self.width, self.primary = ids, starts, width, primary
        self.tree = DraftTree(features=features)
        self.frontier: list[tuple[int, list[int]]] = [(-1, list(range(len(starts))))]  # (node, match ranks)

    def step(self) -> bool:
        total, level = len(self.starts), max(self.tree.depths, default=0)
        candidates = []
        for node, ranks in self.frontier:
            by_token: dict[int, list[int]] = {}
            for rank in ranks:
                pos = self.starts[rank] + level
                if pos < len(self.ids):
                    by_token.setdefault(self.ids[pos], []).append(rank)
            for token, hits in by_token.items():
                if self.primary in hits:  # the primary occurrence's path
                    score = -1e-3 * (level + 1)
                else:  # log share of matches, minus a recency term (< one match's worth) to break ties
                    score = math.log(len(hits) / total) - 1.0 - 1e-3 * min(hits) / total
                candidates.append((score, token, node, hits))
        candidates.sort(key=lambda c: -c[0])
        self.frontier = [
            (self.tree.add(token, node, score), hits) for score, token, node, hits in candidates[: self.width]
        ]
        return bool(self.frontier)


class ModelDrafter(Drafter):
    """Any Hugging Face causal LM sharing the target's vocabulary, with its own KV cache.

    Expands a tree level by level (EAGLE-2 style): each level is ONE batched forward over the
    previous level's kept nodes under a tree attention mask; of all their children the ``width``
    best by cumulative draft log-probability are kept. Deterministic mode takes each node's top
    children; sampled mode (``sampled=True``, temperature > 0) draws ``width`` i.i.d. children from
    the draft's distribution q, which verification then treats by recursive rejection sampling.
    """

    def __init__(self, model: nn.Module, sampled: bool = False, name: str = "model"):
        self.model = model
        self.sampled = sampled
        self.name = name
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
        """Draft logits [n, V] for the fed tokens ([1, V], the last one's, with ``last_only``)."""
        out = self.model(
            input_ids=torch.tensor([tokens], device=self.device),
            position_ids=torch.tensor([positions], device=self.device),
            attention_mask=mask,
            **{self._cache_arg: self.cache},
            use_cache=True,
            **(self._last_only if last_only else {}),
        )
        return out.logits[0].float()

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

    def begin(self, ids, width, params, generator) -> "TreeBuilder":
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


def layer_skip_model(target: nn.Module, num_layers: int) -> nn.Module:
    """A self-speculative draft: the target's first ``num_layers`` decoder layers, its final norm
    and its LM head, sharing the target's weights (no extra memory, no extra files)."""
    inner = getattr(target, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"layer-skip drafting needs a decoder with model.layers (Llama/Qwen/Mistral style); "
            f"{type(target).__name__} has none; use --drafter ngram or a draft model path."
        )
    if not 1 <= num_layers < len(layers):
        raise ValueError(
            f"layerskip:{num_layers} must keep between 1 and {len(layers) - 1} of the target's {len(layers)} layers."
        )
    draft = copy.copy(target)  # shallow: shares every parameter
    draft._modules = dict(target._modules)
    draft_inner = copy.copy(inner)
    draft_inner._modules = dict(inner._modules)
    draft_inner.layers = nn.ModuleList(list(layers)[:num_layers])
    draft._modules["model"] = draft_inner
    draft.config = copy.copy(target.config)
    draft.config.num_hidden_layers = num_layers
    draft_inner.config = draft.config
    return draft


class LayerSkipDrafter(ModelDrafter):
    """:class:`ModelDrafter` over :func:`layer_skip_model` of the target."""

    def __init__(self, target: nn.Module, num_layers: int, sampled: bool = False):
        super().__init__(layer_skip_model(target, num_layers), sampled=sampled, name=f"layerskip:{num_layers}")
