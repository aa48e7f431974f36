"""Two drafters, one chosen per round by a rule: SAM-decoding's mix of lookup and a model head.

SAM-decoding (Hu et al., 2024) drafts from a suffix automaton when its match is long and from
the model drafter otherwise (+18% over EAGLE-2 as published). Here the lookup is draftrl's n-gram
drafter and the model drafter an EAGLE-3 head: a round drafts by n-gram lookup when the longest
suffix match has at least ``min_match`` tokens (the answer is copying its context), by the head
otherwise. The choice reads only the history, before any verification, so exactness holds with
either tree (each round's tree, and its q, comes whole from one drafter).

A policy may make the choice instead of the rule: ``forced`` (``"lookup"`` or ``"model"``, set
before a round) overrides it for every round until it is set back to None. It is read only before
the round's drafts exist, so exactness holds for any policy over the history.

``features`` are both drafters' (``draft_top1_prob`` and ``draft_entropy`` from the head,
``ngram_*`` from the lookup), so a policy over this drafter observes both signals. Both drafters
follow every history change; the head keeps the target's rows whichever drafter drafted.
"""

from __future__ import annotations

from draftrl.drafters.base import Drafter, LevelDrafter, TreeBuilder
from draftrl.drafters.ngram import NgramDrafter


class MixedDrafter(LevelDrafter):
    """N-gram lookup when its match is at least ``min_match`` tokens long, else ``model``."""

    def __init__(self, lookup: NgramDrafter, model: LevelDrafter, min_match: int = 2, name: str = "sam"):
        if min_match < lookup.min_ngram:
            raise ValueError(f"min_match={min_match} is below the lookup's min_ngram={lookup.min_ngram}: "
                             "every round would choose the lookup; raise min_match")
        self.lookup, self.model, self.min_match, self.name = lookup, model, min_match, name
        self.forced: str | None = None
        self.sampled = model.sampled
        self.reads_target_rows = model.reads_target_rows

    def chooses_lookup(self, features: dict[str, float]) -> bool:
        if self.forced is not None:
            if self.forced not in ("lookup", "model"):
                raise ValueError(f"MixedDrafter.forced={self.forced!r}; use 'lookup', 'model' or None (the rule).")
            return self.forced == "lookup"
        return features.get("ngram_match_len", 0.0) >= self.min_match

    def features(self, ids: list[int]) -> dict[str, float]:
        return {**self.model.features(ids), **self.lookup.features(ids)}

    def begin(self, ids, width, params, generator) -> TreeBuilder:
        features = self.features(ids)
        chosen = self.lookup if self.chooses_lookup(features) else self.model
        return _Chosen(chosen.begin(ids, width, params, generator),
                       {**features, "drafter_lookup": float(chosen is self.lookup)})

    def reset(self, prompt_ids: list[int]) -> None:
        for drafter in self._both():
            drafter.reset(prompt_ids)

    def commit(self, ids: list[int], accepted: list[int]) -> None:
        for drafter in self._both():
            drafter.commit(ids, accepted)

    def rewind(self, length: int) -> None:
        for drafter in self._both():
            drafter.rewind(length)

    def keep_target_rows(self, rows: list[int]) -> None:
        for drafter in self._both():
            drafter.keep_target_rows(rows)

    def close(self) -> None:
        getattr(self.model, "close", lambda: None)()

    def _both(self) -> tuple[Drafter, Drafter]:
        return self.lookup, self.model


class _Chosen(TreeBuilder):
    """The chosen drafter's builder, its tree carrying both drafters' features."""

    def __init__(self, inner: TreeBuilder, features: dict[str, float]):
        self.inner, self.features = inner, features

    @property
    def tree(self):
        return self.inner.tree

    def step(self) -> bool:
        grew = self.inner.step()
        self.inner.tree.features = {**self.inner.tree.features, **self.features}
        return grew

    def level_features(self) -> dict[str, float]:
        return self.inner.level_features()
