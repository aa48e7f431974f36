"""A user message as the token ids a target reads: in its chat template, or as bare text."""

from __future__ import annotations

from typing import Any


def user_message_ids(tokenizer: Any, text: str, chat_template: bool | None = None) -> list[int]:
    """Token ids of one user message, wrapped in the tokenizer's chat template (ready for the
    assistant's reply) when ``chat_template`` is true, bare when false; None uses the template
    when the tokenizer has one."""
    if chat_template is None:
        chat_template = getattr(tokenizer, "chat_template", None) is not None
    if chat_template:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    else:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(t) for t in ids]
