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


def _by_id(vocab: dict[str, int]) -> dict[int, str]:
    return {token_id: token for token, token_id in vocab.items()}


def _show(token: str | None) -> str:
    return "<none>" if token is None else repr(token)
