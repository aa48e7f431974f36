"""A tiny Llama whose next-token law is a Markov chain chosen in its weights, and a tokenizer of numbers:
sampled decoding whose acceptance is neither 0 nor 1, a millisecond a forward (the law tests)."""

from __future__ import annotations

import math

import torch

VOCAB = 16


class NumberTokenizer:
    """``"3 4 5"`` -> ``[3, 4, 5]``."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(w) for w in text.split()]}


def markov_target(margin: float = 3.0, noise: float = 1.0, seed: int = 0):
    """A Llama of one layer whose next-token logits depend on the current token only: attention and MLP
    write nothing into the residual, the embedding is the identity, so the logits after token i are
    column i of ``margin * [j == i + 1 mod 16] + noise * N(0, 1)`` ("the next token in the cycle")."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=VOCAB, intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=256, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(VOCAB))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        logits = noise * torch.randn(VOCAB, VOCAB) + margin * torch.roll(torch.eye(VOCAB), 1, 0)
        model.lm_head.weight.copy_(logits / math.sqrt(VOCAB))  # the final RMSNorm scales e_i by sqrt(16)
    return model


def write_prompts(directory, prompts, budget: int) -> str:
    """A prompt file of ``prompts`` (lists of token ids), ids ``p0``, ``p1``, ... (English chat, tune split)."""
    path = directory / "prompts.jsonl"
    path.write_text("".join(
        f'{{"id": "p{i}", "language": "en", "task": "chat", "split": "tune", "prompt": "{" ".join(map(str, ids))}", '
        f'"max_new_tokens": {budget}}}\n' for i, ids in enumerate(prompts)))
    return str(path)
