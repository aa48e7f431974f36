"""KV-cache bookkeeping for speculative rounds: keep the accepted path, drop the rest.

Works on transformers' ``DynamicCache`` (per-layer ``keys``/``values`` of shape
[batch, kv_heads, seq, head_dim]). Only the tail after the committed prefix is rewritten, so a
round costs O(tokens verified), not O(context).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def keep_tail(cache: DynamicCache, prefix_len: int, tail_positions: list[int]) -> None:
    """Keep positions ``[0, prefix_len)`` plus ``tail_positions`` (ascending, all >= prefix_len),
    packed right after the prefix; everything else is discarded."""
    new_len = prefix_len + len(tail_positions)
    contiguous = tail_positions == list(range(prefix_len, new_len))
    sources: dict[torch.device, torch.Tensor] = {}  # one upload per device, not one per layer
    for layer in cache.layers:
        if not contiguous:
            device = layer.keys.device
            if device not in sources:
                sources[device] = torch.tensor(tail_positions, device=device)
            src = sources[device]
            layer.keys[:, :, prefix_len:new_len] = layer.keys.index_select(2, src)
            layer.values[:, :, prefix_len:new_len] = layer.values.index_select(2, src)
        layer.keys = layer.keys[:, :, :new_len]
        layer.values = layer.values[:, :, :new_len]


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every position from ``length`` on."""
    if cache_length(cache) > length:
        keep_tail(cache, length, [])


def cache_argument(model: torch.nn.Module) -> str:
    """The forward keyword that takes the KV cache: ``cache`` in transformers >= 5.2x,
    ``past_key_values`` before (still accepted there, with a deprecation warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def last_logits_only(model: torch.nn.Module) -> dict[str, int]:
    """Forward keywords that make the LM head score the last position only (``logits_to_keep=1``,
    ``num_logits_to_keep`` in older transformers; ``{}`` when the model takes neither).

    Why: a prefill needs no logits, or only the next token's, yet a plain forward projects every
    prompt position onto the vocabulary: for SmolLM2-135M (49,152 tokens) that was ~20% of a
    186-token prefill on one CPU core. Hugging Face ``generate`` prefills this way too.
    """
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}

