"""A tiny random Llama target and EAGLE-3 head, and a tokenizer for it: the head's code paths in seconds."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Head


class WordTokenizer:
    """Token ids from word lengths, inside the tiny target's vocabulary of 64."""

    chat_template = None
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + (7 * len(w) + i) % 60 for i, w in enumerate(text.split())]}


def tiny_pair():
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                          num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=256)).eval()
    head = Eagle3Head(Eagle3Config.for_target(target.config, 24, (1, 2, 3), verifier="tiny"))
    head.set_draft_vocab(torch.randperm(64)[:24])
    with torch.no_grad():
        head.lm_head.weight.normal_(0.0, 1.0)
    return target, head.eval()
