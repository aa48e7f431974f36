"""A tiny attention language model for engine-level exactness tests (not a test module).

One attention layer with fixed random weights over a vocabulary of a few tokens. It speaks the
interface the engine and ``ModelDrafter`` drive (``input_ids``, ``position_ids``, an additive 4-D
tree ``attention_mask``, a transformers ``DynamicCache``), and its next-token law depends on the
whole context through the cache, so a round that keeps the wrong KV entries changes the law. A
forward costs tens of microseconds, so thousands of full requests run in seconds, and the exact
law of the first few emitted tokens can be enumerated.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn
from transformers import DynamicCache

from draftrl.decoding.sampling import SamplingParams, logits_to_probs


class TinyLM(nn.Module):
    """logits(t) = (x_t + attention(x_t, x_<=t)) @ out, with x = token + position embeddings."""

    def __init__(self, vocab: int, dim: int = 8, seed: int = 0, scale: float = 1.5, max_len: int = 64):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(vocab, dim, generator=g), requires_grad=False)
        self.pos = nn.Parameter(0.5 * torch.randn(max_len, dim, generator=g), requires_grad=False)
        self.qkv = nn.Parameter(2.0 * torch.randn(3, dim, dim, generator=g) / math.sqrt(dim), requires_grad=False)
        self.out = nn.Parameter(scale * torch.randn(dim, vocab, generator=g) / math.sqrt(dim), requires_grad=False)

    def forward(self, input_ids, position_ids=None, attention_mask=None, past_key_values=None, use_cache=True):
        cache = past_key_values if past_key_values is not None else DynamicCache()
        past = cache.get_seq_length()
        num = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past, past + num, device=input_ids.device)[None]
        x = self.embed[input_ids[0]] + self.pos[position_ids[0]]  # [T, d]
        query, key, value = x @ self.qkv[0], x @ self.qkv[1], x @ self.qkv[2]
        keys, values = cache.update(key[None, None], value[None, None], 0)  # [1, 1, past + T, d]
        scores = query @ keys[0, 0].T / math.sqrt(x.shape[-1])  # [T, past + T]
        if attention_mask is None:  # causal
            visible = torch.arange(past + num, device=x.device)[None] <= torch.arange(past, past + num, device=x.device)[:, None]
            scores = scores.masked_fill(~visible, -math.inf)
        else:
            scores = scores + attention_mask[0, 0]
        hidden = x + torch.softmax(scores, dim=-1) @ values[0, 0]
        return SimpleNamespace(logits=(hidden @ self.out)[None])


def draft_of(target: TinyLM, noise: float, seed: int) -> TinyLM:
    """A draft that agrees with ``target`` only in part: its output weights carry extra noise."""
    draft = TinyLM(target.out.shape[1], target.out.shape[0], max_len=target.pos.shape[0])
    draft.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(seed)
    draft.out.add_(noise * torch.randn(draft.out.shape, generator=g))
    return draft


@torch.inference_mode()
def sequence_law(model: TinyLM, prompt: list[int], length: int, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """Exact law of the first ``length`` tokens of autoregressive sampling from ``model`` after ``prompt``."""
    vocab = model.out.shape[1]
    law = {(): 1.0}
    for _ in range(length):
        prefixes = list(law)
        ids = torch.tensor([prompt + list(prefix) for prefix in prefixes])
        rows = []
        for seq in ids:  # one full forward per prefix, without a cache
            rows.append(model(seq[None]).logits[0, -1])
        probs = logits_to_probs(torch.stack(rows), params).double()
        probs = probs / probs.sum(-1, keepdim=True)
        law = {prefix + (t,): law[prefix] * float(probs[i, t]) for i, prefix in enumerate(prefixes) for t in range(vocab)}
    return {k: v for k, v in law.items() if v > 0}


def chisquare_law(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float], min_expected: float = 5.0):
    """Chi-square goodness of fit of ``samples`` to ``law``; cells expected fewer than ``min_expected``
    times are pooled. A sample outside the support gives p-value 0. Returns (p-value, statistic, df)."""
    from scipy import stats

    keys = list(law)
    index = {k: i for i, k in enumerate(keys)}
    counts = [0] * len(keys)
    for s in samples:
        if s not in index:
            return 0.0, math.inf, len(keys) - 1
        counts[index[s]] += 1
    n = len(samples)
    keep = [i for i, k in enumerate(keys) if law[k] * n >= min_expected]
    rare = [i for i in range(len(keys)) if law[keys[i]] * n < min_expected]
    observed = [counts[i] for i in keep] + ([sum(counts[i] for i in rare)] if rare else [])
    expected = [law[keys[i]] * n for i in keep] + ([sum(law[keys[i]] for i in rare) * n] if rare else [])
    total = sum(expected)
    expected = [e * n / total for e in expected]
    result = stats.chisquare(observed, expected)
    return float(result.pvalue), float(result.statistic), len(observed) - 1


def worst_case_detectable_tv(n: int, df: int, alpha: float, power: float = 0.9) -> float:
    """Smallest total variation that the chi-square test detects with ``power`` whatever its shape.

    For any law Q at total variation e from P, the noncentrality n * sum((Q - P)^2 / P) is at
    least 4 n e^2 (Cauchy-Schwarz), so the test's power is at least that of a noncentral chi-square
    with that noncentrality."""
    from scipy import optimize, stats

    critical = stats.chi2.isf(alpha, df)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(critical, df, x) - power, 1e-6, 1e6)
    return math.sqrt(lam / (4 * n))
