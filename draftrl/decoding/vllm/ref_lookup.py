"""A minimal prompt-lookup proposer for vLLM's ``custom_class`` method: the reference that
issue 10 measured at 1.37x vLLM's own ``ngram``, a baseline for the serving evaluation and the
benchmarks (``vllm-class:draftrl.decoding.vllm.ref_lookup.RefLookupLatest:4``), not draftrl's drafter.

Each step, for every decoding request: match its last n tokens (n from ``max_n`` down to
``min_n``) against its earlier tokens and propose up to K tokens that followed the LATEST (or,
``RefLookupEarliest``, the earliest) occurrence. No per-request state, no scores, no policy.

    speculative_config={"method": "custom_class", "model": "draftrl.decoding.vllm.ref_lookup.RefLookupLatest",
                        "num_speculative_tokens": 4}
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: longest suffix n-gram tried (then 3, 2 and 1 tokens, the longest that recurs wins)
MAX_N = 4
MIN_N = 1


def lookup(tokens: np.ndarray, k: int, latest: bool, min_n: int = MIN_N, max_n: int = MAX_N) -> np.ndarray:
    """Up to ``k`` tokens that followed the latest (or earliest) earlier occurrence of the longest
    suffix n-gram of ``tokens`` (``[L]`` ints); empty when no n-gram of ``min_n..max_n`` recurs."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: size - 1], n)  # starts 0 .. L-1-n
        hits = np.flatnonzero((windows == tokens[size - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1] if latest else hits[0]) + n
            return tokens[start: start + k]
    return tokens[:0]


class RefLookupLatest:
    """vLLM ``custom_class`` proposer: :func:`lookup` with the latest occurrence."""

    latest = True

    def __init__(self, vllm_config: Any):
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No weights; vLLM's CPU runner calls this unconditionally."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """vLLM's ``propose`` contract: each decoding row's drafts for the next step."""
        drafts: list[list[int]] = []
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            k = min(self.k, self.max_model_len - n - 1)
            drafts.append(lookup(token_ids_cpu[row, :n], k, self.latest).tolist() if sampled and k > 0 else [])
        return drafts


class RefLookupEarliest(RefLookupLatest):
    """:func:`lookup` with the earliest occurrence (vLLM's ``ngram`` and Hugging Face's choice)."""

    latest = False
