"""``user_message_ids``: the chat template when asked (or, by default, when the tokenizer has one)."""

from __future__ import annotations

from draftrl.models.chat import user_message_ids


class Tokenizer:
    def __init__(self, chat_template):
        self.chat_template = chat_template

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        assert add_generation_prompt and tokenize and not return_dict
        return [1, *self(messages[0]["content"], add_special_tokens=False)["input_ids"], 2]

    def __call__(self, text, add_special_tokens):
        assert not add_special_tokens
        return {"input_ids": [ord(c) for c in text]}


def test_the_template_wraps_the_message_when_the_tokenizer_has_one():
    assert user_message_ids(Tokenizer("{{ messages }}"), "ab") == [1, 97, 98, 2]
    assert user_message_ids(Tokenizer(None), "ab") == [97, 98]


def test_an_explicit_choice_wins():
    assert user_message_ids(Tokenizer("{{ messages }}"), "ab", chat_template=False) == [97, 98]
    assert user_message_ids(Tokenizer(None), "ab", chat_template=True) == [1, 97, 98, 2]
