"""Exactness statistics from the logprobs vLLM returns, for the streaming monitor at temperature > 0.

vLLM does not hand out the whole next-token distribution; with ``SamplingParams(logprobs=N)``
it returns, for every emitted token (accepted, recovered and bonus alike), the log-probabilities
of the N most likely tokens and of the emitted one. Which log-probabilities depends on the
engine's ``logprobs_mode``; draftrl asks for ``raw_logprobs`` (``log_softmax`` of the model's
logits, before temperature, top-k and top-p) and applies the request's sampling settings itself,
so a bug in how vLLM applies them (one is worked around in
:func:`draftrl.decoding.vllm.engine.guard_cpu_expand`) shows up as tokens that do not follow p.
With ``processed_logprobs`` the reported p would come from the same tensor the sampler used and
such a bug would be invisible.

From the top N raw log-probabilities the sampling distribution p is known exactly in two cases
(:func:`logprobs_needed` says which, or why not):

- ``top_k = k > 0`` (any temperature T): p keeps the tokens whose logit is at least the k-th
  largest (vLLM's rule; ties kept), ``p_i = exp(l_i / T) / sum_kept exp(l_j / T)``. draftrl asks
  for ``k + TIE_MARGIN`` logprobs so that ties at the boundary are seen.
- ``top_k = 0`` and ``T = 1``: p is the raw distribution. The top N tokens are known one by one
  and the rest only as one *tail* event of mass ``1 - sum(top N)``. The monitor's tests stay
  exact on this coarsened variable (top N tokens + tail): under exactness the coarsened token
  follows the coarsened p, its randomised PIT is U(0, 1) and its surprisal martingale has mean 0.

``top_p < 1``, or a temperature other than 1 without top-k, needs logits that vLLM does not
return: those streams are reported as unchecked, never as passed.

Drafted positions (the agreement test): a draft token d at a position counts when p(d) is
known (d among the top N, or outside the kept set under top-k, where p(d) = 0); that choice
depends on p and d only, never on the emitted token, so ``agree ~ Bernoulli(p(d))`` still holds.
"""

from __future__ import annotations

import math

import numpy as np

from draftrl.decoding.stats import TokenStats

#: logprobs asked beyond top_k, so that tokens tied with the k-th are seen (vLLM keeps ties)
TIE_MARGIN = 4


def logprobs_needed(temperature: float, top_k: int, top_p: float, max_logprobs: int) -> tuple[int | None, str]:
    """Raw logprobs per token that give p exactly under these sampling settings, or ``(None, why not)``.

    :param max_logprobs: the engine's ``max_logprobs`` (the most vLLM returns per token).
    """
    if temperature <= 0:
        return None, "temperature 0: greedy token identity is the check"
    if top_p < 1.0:
        return None, (f"top_p={top_p}: the nucleus needs logits vLLM does not return; "
                      "set top_p=1 (and top_k) to check the sampled stream")
    if top_k > 0:
        n = top_k + TIE_MARGIN
        if n > max_logprobs:
            return None, (f"top_k={top_k} needs {n} logprobs per token, above max_logprobs={max_logprobs}; "
                          f"set top_k <= {max_logprobs - TIE_MARGIN}")
        return n, ""
    if temperature != 1.0:
        return None, (f"temperature={temperature} with top_k=0: p = softmax(logits / T) needs every logit and vLLM "
                      f"returns the top {max_logprobs}; set top_k <= {max_logprobs - TIE_MARGIN} or temperature=1")
    return max_logprobs, ""


def token_stats_from_logprobs(token_ids: list[int], logprobs: list[dict[int, float]], draft_ids: list[int], *,
                              temperature: float, top_k: int, num_logprobs: int) -> TokenStats:
    """The monitor's :class:`TokenStats` of one request's tokens in one engine step.

    :param token_ids: ``[n]`` tokens the request gained in the step.
    :param logprobs: ``[n]`` dicts ``{token id: raw logprob}``, vLLM's top ``num_logprobs`` plus
        the emitted token (``N + 1`` entries when the emitted token is not among the top N).
    :param draft_ids: drafts verified for the request in this step, position by position.
    :param temperature: the request's temperature (> 0).
    :param top_k: the request's top-k (0 = none; then ``temperature`` must be 1).
    :param num_logprobs: the N the request asked for.
    """
    if len(logprobs) != len(token_ids):
        raise ValueError(f"{len(logprobs)} logprob entries for {len(token_ids)} tokens; ask vLLM for logprobs "
                         "(SamplingParams(logprobs=N)) on every request whose stream is checked.")
    if top_k == 0 and temperature != 1.0:
        raise ValueError(f"temperature={temperature} with top_k=0 cannot be checked from top-N logprobs; "
                         "see logprobs_needed().")
    n = len(token_ids)
    out = {name: np.zeros(n) for name in ("p_token", "mass_before", "entropy", "agree", "agree_expected")}
    drafted = np.zeros(n, dtype=bool)
    for j, (x, entry) in enumerate(zip(token_ids, logprobs)):
        ids, probs, tail = _distribution(int(x), entry, temperature, top_k, num_logprobs)
        where = {t: i for i, t in enumerate(ids)}
        i = where.get(int(x))
        if i is None:  # a tail token (top_k = 0), or one top-k excludes (p = 0: the monitor flags it)
            out["p_token"][j] = tail
            out["mass_before"][j] = float(probs.sum())
        else:
            out["p_token"][j] = probs[i]
            out["mass_before"][j] = float(probs[:i].sum())
        known = probs[probs > 0]
        entropy = -float(known @ np.log(known))
        out["entropy"][j] = entropy - (tail * math.log(tail) if tail > 0 else 0.0)
        if j < len(draft_ids):
            d = int(draft_ids[j])
            k = where.get(d)
            if k is not None or top_k > 0:  # p(d) is known (0 outside the top-k set)
                drafted[j] = True
                out["agree"][j] = float(d == x)
                out["agree_expected"][j] = probs[k] if k is not None else 0.0
    return TokenStats(token=token_ids, drafted=drafted, **out)


def _distribution(x: int, entry: dict[int, float], temperature: float, top_k: int,
                  num_logprobs: int) -> tuple[list[int], np.ndarray, float]:
    """``(ids, p, tail)``: p of the known tokens in rank order (decreasing p, ties by id) and the
    tail event's mass (0 under top-k)."""
    top = dict(entry)
    if len(top) > num_logprobs:  # the emitted token came on top of the N most likely
        top.pop(x, None)
    ids = sorted(top, key=lambda t: (-top[t], t))
    lp = np.array([top[t] for t in ids], dtype=np.float64)
    if top_k > 0:
        kth = lp[min(top_k, len(lp)) - 1]
        keep = lp >= kth
        ids = [t for t, k in zip(ids, keep) if k]
        z = lp[keep] / temperature
        probs = np.exp(z - z.max())
        return ids, probs / probs.sum(), 0.0
    probs = np.exp(lp)
    tail = 1.0 - float(probs.sum())
    if x not in top:
        tail = max(tail, math.exp(entry[x]))  # the emitted tail token alone has this much
    total = float(probs.sum()) + max(tail, 0.0)
    return ids, probs / total, max(tail, 0.0) / total
