"""Check that a draft and a target model share one vocabulary.

Speculative decoding compares the draft's and the target's probabilities of the *same token id*;
if the ids mean different strings, acceptance ratios compare unrelated events and the output is
no longer the target's distribution. So pairs are checked id by id, not just by size.
"""

from __future__ import annotations

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


def check_same_logits(target_model, draft_model) -> None:
    """Raise ``ValueError`` unless both models score the same number of token ids.

    Tokenizers can agree while the embedding matrices differ (padded to another multiple, or
    resized after adding tokens); the sampler then compares p and q of different lengths. Both
    models need transformers' ``get_output_embeddings()`` (or ``config.vocab_size``).
    """
    target_size, draft_size = _num_logits(target_model), _num_logits(draft_model)
    if None not in (target_size, draft_size) and target_size != draft_size:
        raise ValueError(
            f"Draft and target share a tokenizer but score different numbers of ids (target logits {target_size} vs "
            f"draft {draft_size}, the embedding sizes); pick a draft model whose vocab_size is {target_size}."
        )


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
