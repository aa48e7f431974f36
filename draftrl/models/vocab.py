"""Check that a draft and a target model share one vocabulary.

Speculative decoding compares the draft's and the target's probabilities of the *same token id*;
if the ids mean different strings, acceptance ratios compare unrelated events and the output is
no longer the target's distribution. So pairs are checked id by id, not just by size; where the
two embedding matrices are padded differently past the shared tokenizer, the pair is compared
over the tokenizer's ids (:func:`shared_vocab`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class HasVocab(Protocol):
    """Anything with a transformers-style ``get_vocab() -> {token: id}``."""

    def get_vocab(self) -> dict[str, int]: ...


def check_same_vocab(target_tokenizer: HasVocab, draft_tokenizer: HasVocab) -> None:
    """Raise ``ValueError`` unless both tokenizers map every id to the same token string.

    The one-line message names the first mismatching id, both tokens there (``<none>`` where an
    id is missing) and both vocabulary sizes (added tokens included).
    """
    target = _by_id(target_tokenizer.get_vocab())
    draft = _by_id(draft_tokenizer.get_vocab())
    if target == draft:
        return
    first = min(i for i in target.keys() | draft.keys() if target.get(i) != draft.get(i))
    raise ValueError(
        f"Draft and target tokenizers differ at token id {first} "
        f"(target {_show(target.get(first))} vs draft {_show(draft.get(first))}; "
        f"vocab {len(target)} vs {len(draft)}); pick a draft model from the same family."
    )


@dataclass(frozen=True)
class SharedVocab:
    """Where a draft model's ids and its target's meet, when the two share a tokenizer.

    Embedding matrices are often padded past the tokenizer, and by different amounts in one
    family (Qwen2.5-7B scores 152,064 ids, Qwen2.5-0.5B 151,936, their tokenizer has 151,665).
    The target's distribution p stays over all its rows (exactness is w.r.t. the target's own
    distribution, padding rows included); the draft proposes only ids below ``num_shared``: the
    tokenizer's ids that both matrices have rows for.
    """

    num_target_logits: int
    """rows of the target's output matrix: the length of p"""
    num_draft_logits: int
    """rows of the draft's output matrix"""
    num_shared: int
    """ids ``0..num_shared-1`` the draft may propose: the tokenizer's ids, capped by either matrix"""

    @property
    def identity(self) -> bool:
        """Both matrices are the tokenizer's ids exactly: nothing to map."""
        return self.num_target_logits == self.num_draft_logits == self.num_shared


def shared_vocab(target_tokenizer: HasVocab, draft_tokenizer: HasVocab, target_model, draft_model) -> SharedVocab:
    """Check that the pair shares one tokenizer (:func:`check_same_vocab`) and say where their
    output matrices meet (:class:`SharedVocab`).

    Both models need transformers' ``get_output_embeddings()`` (or ``config.vocab_size``).
    :raises ValueError: the tokenizers differ (one line naming the first id), or a model's size is unknown.
    """
    check_same_vocab(target_tokenizer, draft_tokenizer)
    target_size, draft_size = _num_logits(target_model), _num_logits(draft_model)
    for which, size, model in (("target", target_size, target_model), ("draft", draft_size, draft_model)):
        if size is None:
            raise ValueError(f"the {which} model {type(model).__name__} has neither get_output_embeddings() nor "
                             "config.vocab_size, so the ids it scores are unknown; pass a transformers causal LM")
    return SharedVocab(target_size, draft_size, min(_num_ids(target_tokenizer), target_size, draft_size))


def _num_ids(tokenizer: HasVocab) -> int:
    """Ids the tokenizer defines (added tokens included): one past its largest id."""
    return max(tokenizer.get_vocab().values()) + 1


def _num_logits(model) -> int | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size is not None else None


def _by_id(vocab: dict[str, int]) -> dict[int, str]:
    return {token_id: token for token, token_id in vocab.items()}


def _show(token: str | None) -> str:
    return "<none>" if token is None else repr(token)
