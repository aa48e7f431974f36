"""Synthetic serving recordings and calibrations: what the serving replay's tests stand in for the
vLLM ones with (``tests/real_vllm`` checks the replay against vLLM itself)."""

from __future__ import annotations

import numpy as np

from draftrl.prompts import Prompt
from draftrl.replay.recordings import Recording, Recordings
from draftrl.replay.serve_calibrate import FORMAT, StepCostModel

COST = StepCostModel(base=0.03, per_seq=0.002, per_token=0.0005, residual_std=0.002)
TOKENS = 40
LOOKAHEAD = 9


def synthetic_recordings(num: int = 12, seed: int = 0) -> Recordings:
    """Requests whose continuations repeat pieces of their prompts (the n-gram drafter matches
    some positions, fails on others), some ending early at 'EOS'."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(num):
        motif = rng.integers(0, 60, size=10).tolist()
        prompt = motif * 2 + rng.integers(0, 60, size=int(rng.integers(5, 30))).tolist()
        cont: list[int] = []
        while len(cont) < TOKENS + LOOKAHEAD:
            cont += motif[: int(rng.integers(2, 10))] + rng.integers(60, 90, size=int(rng.integers(1, 4))).tolist()
        length = TOKENS + LOOKAHEAD if i % 4 else int(rng.integers(5, TOKENS))  # every 4th ends at 'EOS'
        recs.append(Recording(Prompt(f"p{i:02d}", ("en", "it", "zh", "es")[i % 4], ("qa", "code_edit")[i % 2],
                                     "tune", f"prompt {i}", TOKENS), prompt, TOKENS, cont[:length], LOOKAHEAD))
    return Recordings(recs, {"config": {"target": "smollm2-135m", "chat_template": True}})


def synthetic_calibration(coef, sd, seed=0, prefill=None):
    """Decode points of ``coef = (base, per_seq, per_token)`` and, given ``prefill`` (seconds per
    prompt token), prefill points of 1 and 4 prompts of 32..384 tokens."""
    rng = np.random.default_rng(seed)
    points = []
    for b in (1, 2, 4, 8, 16):
        for d in (0, 1, 2, 4, 8):
            tokens = b * (d + 1)
            s = coef[0] + coef[1] * b + coef[2] * tokens + sd * rng.standard_normal(8)
            points.append({"kind": "decode", "num_seqs": b, "depth": d, "tokens_verified": tokens,
                           "prompt_tokens": 0, "seconds": s.tolist()})
    for b in (1, 4) if prefill is not None else ():
        for length in (32, 128, 384):
            s = coef[0] + coef[1] * b + prefill * b * length + sd * rng.standard_normal(8)
            points.append({"kind": "prefill", "num_seqs": b, "prompt_len": length, "tokens_verified": 0,
                           "prompt_tokens": b * length, "seconds": s.tolist()})
    return {"format": FORMAT, "points": points}


# ---------------------------------------------------------------- sampled recordings (issue 46)
def markov_target(vocab: int = 10, sharpness: float = 2.5, seed: int = 0) -> np.ndarray:
    """``[vocab, vocab]`` logits of a bigram 'target': the next token's logits given the last one."""
    return sharpness * np.random.default_rng(seed).standard_normal((vocab, vocab))


def bigram_probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """``[vocab, vocab]`` next-token probabilities at ``temperature`` (0: one-hot argmax)."""
    if temperature == 0:
        return np.eye(logits.shape[1])[logits.argmax(1)]
    z = logits / temperature
    p = np.exp(z - z.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def sample_chain(probs: np.ndarray, last: int, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` tokens sampled from the bigram ``probs`` after ``last`` (decoding without speculation)."""
    out = []
    for _ in range(n):
        last = int(rng.choice(probs.shape[1], p=probs[last]))
        out.append(last)
    return out


def one_hot_verification_steps(probs: np.ndarray, prompt: list[int], length: int, depth: int, drafter,
                               rng: np.random.Generator) -> list[tuple[int, int]]:
    """What vLLM's rejection sampler does with a deterministic drafter (``SAMPLING.md``), step by step,
    on the bigram target: the first token from the prefill, then every step drafts ``drafter``'s
    proposal (at most ``depth``) from the true context, accepts draft d with probability p(d), else
    samples p with d removed and stops; all accepted: a bonus token. ``[(drafted, accepted)]`` per
    decode step until ``length`` tokens."""
    from draftrl.models.distribution import SamplingParams

    ctx = list(prompt) + sample_chain(probs, prompt[-1], 1, rng)
    generated, steps = 1, []
    while generated < length:
        drafts = drafter.propose(ctx, depth, 1, SamplingParams(), None).tokens[:depth]
        accepted = 0
        for d in drafts:
            p = probs[ctx[-1]]
            if rng.random() < p[d]:
                ctx.append(int(d))
                accepted += 1
                continue
            residual = p.copy()
            residual[d] = 0.0
            ctx.append(int(rng.choice(len(p), p=residual / residual.sum())))
            break
        else:
            ctx += sample_chain(probs, ctx[-1], 1, rng)
        steps.append((len(drafts), accepted))
        generated += accepted + 1
    return steps


def replayed_steps(recordings: Recordings, proposals, length: int, depth: int) -> list[list[tuple[int, int]]]:
    """The replay's coupling on every recording alone: drafts ``min(depth, available)`` from each true
    prefix, accepts the leading ones equal to the recorded continuation (``proposals.accepted``).
    Per recording, ``[(drafted, accepted)]`` per decode step until ``length`` tokens."""
    out = []
    for i, rec in enumerate(recordings.requests):
        t, steps = 1, []
        while t < min(length, len(rec.token_ids)):
            d = min(depth, proposals.available[i][t])
            a = min(proposals.accepted[i][t], d)
            steps.append((d, a))
            t += a + 1
        out.append(steps)
    return out


def accepted_law_test(a: list[list[tuple[int, int]]], b: list[list[tuple[int, int]]], max_depth: int,
                      permutations: int = 4000, seed: int = 0) -> tuple[float, float, int]:
    """Do two engines accept drafts with the same law? ``a[i]`` and ``b[i]``: request ``i``'s
    ``[(drafted, accepted)]`` per step in each (the same request, independent draws). The statistic is
    Pearson's chi-square of the two accepted-per-verified-step histograms (steps that verified at least
    one draft; bins 0..max_depth, the last bins pooled until each holds >= 10 steps of the two); its
    p value comes from swapping whole requests between the two sides (``permutations`` random swaps:
    exact under the null, where each request's two step lists are exchangeable, while a plain chi-square
    test would treat one request's dependent steps as independent and reject too often).
    ``(statistic, p value, degrees of freedom)``; the smallest p value is ``1 / (permutations + 1)``."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} and {len(b)} requests: the law test pairs the same requests.")
    hist = np.zeros((2, len(a), max_depth + 1))
    for side, runs in enumerate((a, b)):
        for i, steps in enumerate(runs):
            for drafted, accepted in steps:
                if drafted > 0:
                    hist[side, i, accepted] += 1
    while hist.shape[2] > 2 and hist[:, :, -1].sum() < 10:  # column totals do not move under swaps
        hist = np.concatenate([hist[:, :, :-2], hist[:, :, -2:].sum(2, keepdims=True)], axis=2)
    hist = hist[:, :, hist.sum((0, 1)) > 0]

    def chi2(x: np.ndarray, y: np.ndarray) -> float:
        table = np.stack([x, y])
        expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
        return float(((table - expected) ** 2 / expected).sum())

    observed = chi2(hist[0].sum(0), hist[1].sum(0))
    rng = np.random.default_rng(seed)
    total = hist.sum(0).sum(0)
    swaps = rng.random((permutations, len(a))) < 0.5  # [P, n] request i's sides swapped
    first = (~swaps).astype(float) @ hist[0] + swaps.astype(float) @ hist[1]  # [P, bins]
    null = [chi2(x, total - x) for x in first]
    pvalue = (1 + sum(s >= observed - 1e-9 for s in null)) / (permutations + 1)
    return observed, pvalue, hist.shape[2] - 1


def synthetic_mix_recordings(num: int = 12, continuations: int = 2, seed: int = 0,
                             noise: dict[float, float] | None = None) -> Recordings:
    """:func:`synthetic_recordings` as the greedy class plus ``continuations`` sampled ones per request
    at each temperature of ``noise`` (default T=0.7 and 1.0): the greedy continuation with each token
    replaced by an off-motif one with the temperature's probability, so the n-gram drafter is accepted
    less the hotter the class (as real sampled continuations are)."""
    noise = {0.7: 0.35, 1.0: 0.7} if noise is None else noise
    base = synthetic_recordings(num, seed)
    rng = np.random.default_rng(seed + 1)
    recs = list(base.requests)
    for t, q in noise.items():
        for r in base.requests:
            for k in range(continuations):
                tokens = [int(rng.integers(60, 90)) if rng.random() < q else tok for tok in r.token_ids]
                recs.append(Recording(r.prompt, r.prompt_ids, r.max_new_tokens, tokens, r.lookahead, t, 0, 1.0, k,
                                      1000 * k + int(100 * t)))
    return Recordings(recs, base.meta)
