"""The one drafter contract, shared by both engines.

A drafter has one required verb, :meth:`Drafter.propose`: token history in, :class:`DraftTree`
out. That is all the Hugging Face engine (``decoding.engine.SpeculativeDecoder``) and the vLLM
proposer (``decoding.vllm.proposer.DraftrlProposer``) need, so a new drafter subclasses
:class:`Drafter`, implements ``propose``, and gets one entry in :mod:`draftrl.drafters.registry`.

Everything else is optional, with a default that is right for a stateless drafter:

- ``features(ids)``: draft-side signals a policy may read *before* a round is chosen (names the
  observation reads are ``signals.features.DRAFT_FEATURES``; others are ignored);
- ``reset`` / ``commit`` / ``rewind``: a stateful drafter (its own KV cache) follows the history;
- ``keep_target_rows``: after every target forward, the rows that entered the history (a drafter
  that reads the target's hidden states, as ``eagle3`` does through forward hooks, keeps those);
- :class:`LevelDrafter`, the extension for level-by-level growth: ``begin`` returns a
  :class:`TreeBuilder` that adds one level per ``step``, so a depth policy (``SpecDecodeDepth-v2``)
  can stop drafting after any level; ``propose`` is then written once, on top of it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams


class Drafter(ABC):
    """Proposes draft trees over a shared token history ``ids`` (prompt + generated)."""

    #: proposals are sampled from q (True) or chosen deterministically (False)
    sampled: bool = False
    #: the drafter reads the target's hidden states (``keep_target_rows``): replaying its proposals
    #: from every prefix of a recorded sequence needs one target forward over that sequence first
    reads_target_rows: bool = False

    @abstractmethod
    def propose(
        self, ids: list[int], depth: int, width: int, params: SamplingParams, generator: torch.Generator | None
    ) -> DraftTree:
        """A tree of at most ``depth`` levels and ``width`` nodes per level continuing ``ids``.

        :param params: the sampling transform shared with the target (sampled drafters draw from it)
        :param generator: the engine's generator, on the device verification draws on (None: torch's global one)
        """

    def features(self, ids: list[int]) -> dict[str, float]:
        """Draft-side signals for the next round, computed before any target verification (none by default)."""
        return {}

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new request."""

    def commit(self, ids: list[int], accepted: list[int]) -> None:
        """``ids`` is the new history; ``accepted`` the accepted node indices of the last proposal."""

    def rewind(self, length: int) -> None:
        """The history was cut back to its first ``length`` tokens."""

    def keep_target_rows(self, rows: list[int]) -> None:
        """Rows of the target's last forward that now hold history positions, in position order
        (the next positions after those already kept). Called by the engine after every target
        forward, before ``commit``; ignored by drafters that do not read the target."""


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


class LevelDrafter(Drafter):
    """A drafter that grows its tree one level at a time (the optional extension).

    Implement :meth:`begin`; ``propose`` steps the builder ``depth`` times, so the one-shot and
    the level-by-level paths draft the same tree.
    """

    @abstractmethod
    def begin(
        self, ids: list[int], width: int, params: SamplingParams, generator: torch.Generator | None
    ) -> TreeBuilder:
        """Start drafting a tree of ``width`` nodes per level after ``ids``, one level per ``step``."""

    def propose(
        self, ids: list[int], depth: int, width: int, params: SamplingParams, generator: torch.Generator | None
    ) -> DraftTree:
        builder = self.begin(ids, width, params, generator)
        for _ in range(depth):
            if not builder.step():
                break
        return builder.tree
