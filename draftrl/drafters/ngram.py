"""Prompt lookup: the n-gram drafter (no weights; runs in both engines, vLLM's proposer included)."""

from __future__ import annotations

import math

import numpy as np

from draftrl.drafters.base import LevelDrafter, TreeBuilder
from draftrl.drafters.tree import DraftTree


class NgramDrafter(LevelDrafter):
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
            raise ValueError(f"NgramDrafter needs max_matches >= 2 (the earliest and the most recent), "
                             f"got {max_matches}")
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

    def begin(self, ids, width, params, generator) -> TreeBuilder:
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
