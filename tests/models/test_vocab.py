"""check_same_vocab compares id -> token maps and names the first id that differs; shared_vocab says
where two differently padded embedding matrices meet."""

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


def _tiny_llama(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config)


def test_padded_embeddings_meet_over_the_tokenizers_ids() -> None:
    """Tokenizers can agree while the embeddings are padded differently (Qwen2.5-7B 152,064 rows,
    Qwen2.5-0.5B 151,936, tokenizer 151,665): the pair is compared over the tokenizer's ids, capped
    by either matrix; a pair whose tokenizers differ is still refused in one line."""
    from draftrl.models import shared_vocab

    tokens = ["<unk>"] + [f"t{i}" for i in range(1, 50)]
    same = _tokenizer(tokens)
    vocab = shared_vocab(same, same, _tiny_llama(64), _tiny_llama(72))
    assert (vocab.num_target_logits, vocab.num_draft_logits, vocab.num_shared, vocab.identity) == (64, 72, 50, False)
    assert shared_vocab(same, same, _tiny_llama(72), _tiny_llama(40)).num_shared == 40
    exact = _tokenizer(tokens[:40])
    assert shared_vocab(exact, exact, _tiny_llama(40), _tiny_llama(40)).identity
    with pytest.raises(ValueError, match=r"differ at token id 2") as info:
        shared_vocab(same, _tokenizer(["<unk>", "t1", "xy"]), _tiny_llama(64), _tiny_llama(64))
    assert "\n" not in str(info.value)
