"""check_same_vocab compares id -> token maps and names the first id that differs."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from draftrl.models import check_same_vocab


def _tokenizer(tokens: list[str]) -> PreTrainedTokenizerFast:
    """A real (tiny) fast tokenizer whose token ``tokens[i]`` has id ``i``; no hub needed."""
    vocab = {token: i for i, token in enumerate(tokens)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token=tokens[0])))


def test_same_vocab_passes() -> None:
    check_same_vocab(_tokenizer(["<unk>", "ab", "cd", "ef"]), _tokenizer(["<unk>", "ab", "cd", "ef"]))


def test_real_tokenizer_matches_itself(smollm2) -> None:
    check_same_vocab(smollm2.tokenizer, smollm2.tokenizer)


def test_error_names_first_mismatching_id() -> None:
    target = _tokenizer(["<unk>", "ab", "cd", "ef", "gh"])
    draft = _tokenizer(["<unk>", "ab", "xy", "zz"])
    with pytest.raises(ValueError) as info:
        check_same_vocab(target, draft)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "Draft and target tokenizers differ at token id 2 (target 'cd' vs draft 'xy'; vocab 5 vs 4); "
        "pick a draft model from the same family."
    )


def test_error_when_one_vocab_extends_the_other() -> None:
    with pytest.raises(ValueError, match=r"token id 3 \(target <none> vs draft 'ef'; vocab 3 vs 4\)"):
        check_same_vocab(_tokenizer(["<unk>", "ab", "cd"]), _tokenizer(["<unk>", "ab", "cd", "ef"]))
