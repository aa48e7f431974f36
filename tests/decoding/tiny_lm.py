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

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

from draftrl.models.distribution import SamplingParams, logits_to_probs


class TinyLM(nn.Module):
    """logits(t) = (x_t + attention(x_t, x_<=t)) @ out, with x = token + position embeddings."""

    def __init__(self, vocab: int, dim: int = 8, seed: int = 0, scale: float = 1.5, max_len: int = 64):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(vocab, dim, generator=g), requires_grad=False)
        self.pos = nn.Parameter(0.5 * torch.randn(max_len, dim, generator=g), requires_grad=False)
        self.qkv = nn.Parameter(2.0 * torch.randn(3, dim, dim, generator=g) / math.sqrt(dim), requires_grad=False)
        self.out = nn.Parameter(scale * torch.randn(dim, vocab, generator=g) / math.sqrt(dim), requires_grad=False)
        # the context the engine reads (as from a transformers config): max_len position embeddings
        self.config = SimpleNamespace(max_position_embeddings=max_len, vocab_size=vocab)

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
            visible = (torch.arange(past + num, device=x.device)[None]
                       <= torch.arange(past, past + num, device=x.device)[:, None])
            scores = scores.masked_fill(~visible, -math.inf)
        else:
            scores = scores + attention_mask[0, 0]
        hidden = x + torch.softmax(scores, dim=-1) @ values[0, 0]
        return SimpleNamespace(logits=(hidden @ self.out)[None])


def tiny_llama(vocab: int, seed: int = 0, layers: int = 3, scale: float = 15.0):
    """A random Llama target of ``layers`` layers (hidden 16) over ``vocab`` tokens, for the drafters
    that read a Llama's hidden states; its output layer is scaled up so that its law is far from
    uniform (about the spread of :class:`TinyLM`'s)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


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
    vocab = model.config.vocab_size
    law = {(): 1.0}
    for _ in range(length):
        prefixes = list(law)
        ids = torch.tensor([prompt + list(prefix) for prefix in prefixes])
        rows = []
        for seq in ids:  # one full forward per prefix, without a cache
            rows.append(model(seq[None]).logits[0, -1])
        probs = logits_to_probs(torch.stack(rows), params).double()
        probs = probs / probs.sum(-1, keepdim=True)
        law = {prefix + (t,): law[prefix] * float(probs[i, t])
               for i, prefix in enumerate(prefixes) for t in range(vocab)}
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


def required_noncentrality(df: int, alpha: float, power: float = 0.9) -> float:
    """Noncentrality at which the chi-square test with ``df`` degrees of freedom and false alarm
    ``alpha`` rejects with probability ``power``."""
    from scipy import optimize, stats

    critical = stats.chi2.isf(alpha, df)
    return optimize.brentq(lambda x: stats.ncx2.sf(critical, df, x) - power, 1e-6, 1e6)


def worst_case_detectable_tv(n: int, df: int, alpha: float, power: float = 0.9) -> float:
    """Smallest total variation that the chi-square test detects with ``power`` whatever its shape.

    For any law Q at total variation e from P, the noncentrality n * sum((Q - P)^2 / P) is at
    least 4 n e^2 (Cauchy-Schwarz), so the test's power is at least that of a noncentral chi-square
    with that noncentrality."""
    return math.sqrt(required_noncentrality(df, alpha, power) / (4 * n))


@torch.inference_mode()
def next_token_laws(model: TinyLM, ids: list[int], start: int, params: SamplingParams) -> np.ndarray:
    """[len(ids) - start, V] float64: ``model``'s exact law of each token of ``ids[start:]`` given
    the tokens before it (one causal forward without a cache, like :func:`sequence_law`)."""
    logits = model(torch.tensor([ids[:-1]])).logits[0, start - 1 :]
    probs = logits_to_probs(logits, params).double()
    return (probs / probs.sum(-1, keepdim=True)).numpy()


def _class_covariances(classes: np.ndarray, laws: np.ndarray):
    """Per class present: (its tokens' mask, C_c = sum_i (diag P_i - P_i P_i^T) over them)."""
    for c in np.unique(classes):
        mask = classes == c
        p = laws[mask]
        yield mask, np.diag(p.sum(0)) - p.T @ p


def pooled_law_test(classes: np.ndarray, tokens: np.ndarray, laws: np.ndarray) -> tuple[float, float, int]:
    """Chi-square test that each class of tokens follows, pooled over its contexts, the laws it was
    drawn from. Returns (p-value, statistic, df).

    Token i has class ``classes[i]``, known before it is drawn (e.g. its position in its round),
    and must follow ``laws[i]`` [V] given everything before it. Then, per class c, the vector
    D_c = sum_i (onehot(x_i) - P_i) is a martingale with predictable covariance
    C_c = sum_i (diag P_i - P_i P_i^T), and sum_c D_c^T C_c^+ D_c is chi-square with
    (number of classes) * (V - 1) degrees of freedom for many tokens (martingale central limit
    theorem), however the contexts were reached. The law it tests is, per class, the mean of the
    tokens' conditional laws; a deviation of its mean total variation (weighted by class sizes)
    e is detected as a multinomial deviation of e would be among N tokens: C_c / N_c is at most the
    covariance of the mean law, so the noncentrality is at least 4 N e^2 (Cauchy-Schwarz) and
    ``worst_case_detectable_tv(N, df, alpha)`` bounds the detectable e.
    """
    from scipy import stats

    deviation = np.eye(laws.shape[1])[tokens] - laws
    statistic, df = 0.0, 0
    for mask, cov in _class_covariances(classes, laws):
        dev = deviation[mask].sum(0)
        statistic += float(dev[:-1] @ np.linalg.solve(cov[:-1, :-1], dev[:-1]))  # sum(dev) = 0: drop one entry
        df += laws.shape[1] - 1
    return float(stats.chi2.sf(statistic, df)), statistic, df


def pooled_worst_case_tv(classes: np.ndarray, laws: np.ndarray, alpha: float, power: float = 0.9) -> float:
    """Exact smallest mean total variation that :func:`pooled_law_test` detects with ``power``
    whatever its shape, for the contexts this run visited (vocabulary of 3).

    A deviation of class c with TV t_c has noncentrality N_c t_c^2 k_c at least, k_c the minimum
    of d'^T (C_c / N_c)^-1 d' over deviations d of TV 1 (d' drops the last entry; the sphere of
    TV 1 is 6 segments, on each the form is a quadratic in one variable; k_c >= 4). Spreading the
    mean TV e over the classes as t_c ~ 1 / k_c minimises the total: N e^2 / sum_c (N_c / N) / k_c.
    """
    if laws.shape[1] != 3:
        raise ValueError(f"pooled_worst_case_tv handles a vocabulary of 3, got {laws.shape[1]}")
    eye = np.eye(3)
    total, spread = len(classes), 0.0
    for mask, cov in _class_covariances(classes, laws):
        count = int(mask.sum())
        metric = np.linalg.inv(cov[:-1, :-1] / count)
        k = math.inf
        for a in range(3):  # segment: d = e_a - s e_b - (1 - s) e_c, TV 1; -d gives the same value
            b, c = [i for i in range(3) if i != a]
            v0, w = (eye[a] - eye[c])[:-1], (eye[c] - eye[b])[:-1]
            s = min(1.0, max(0.0, -float(v0 @ metric @ w) / float(w @ metric @ w)))
            k = min(k, float((v0 + s * w) @ metric @ (v0 + s * w)))
        spread += count / total / k
    return math.sqrt(required_noncentrality(2 * len(np.unique(classes)), alpha, power) * spread / total)
