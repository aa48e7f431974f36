"""The distribution a model's logits define, and the one draw from it: pure tensor functions.

``logits_to_probs`` turns logits into exactly the distribution that is sampled (temperature,
top-k, top-p), for the target and the draft alike; ``sample`` draws from it in float64. Drafters
draw their children with it and verification (:mod:`draftrl.decoding.sampling`) checks them
against the same rows, so both live below both (``models``, which drafters and decoding import).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor

from draftrl.config.workload import SamplingParams  # noqa: F401  (defined beside the workload; re-exported here)

# top-p fast path: the candidate set must hold this much more than top_p before we trust it
# (it guards against summation-order rounding; rows that miss it fall back to a wider search).
_TOP_P_MARGIN = 1e-9
_TOP_P_FIRST_CANDIDATES = 64


# --------------------------------------------------------------------------- input checks

#: the checks being collected by :meth:`DeferredChecks.collecting` (None: check at once)
_COLLECTING: ContextVar[list | None] = ContextVar("draftrl_deferred_checks", default=None)


def _require(ok: Tensor, message: Callable[[], str]) -> None:
    """Raise ``ValueError(message())`` unless the 0-d bool ``ok`` holds. Reading ``ok`` is a host
    sync on a GPU: inside :meth:`DeferredChecks.collecting` it is recorded instead, and the caller
    reads every check together with its own results, in one transfer."""
    pending = _COLLECTING.get()
    if pending is not None:
        pending.append((ok, message))
    elif not bool(ok):
        raise ValueError(message())


@dataclass
class DeferredChecks:
    """Input checks of :func:`logits_to_probs`, :func:`sample` and :func:`sample_rows` recorded on
    the device instead of read at once (each read would be one host sync per call).

    Usage: ``with checks.collecting(): ...``; then transfer ``checks.flags(device)`` with the
    results and call ``checks.raise_failed(values)``, which raises the first failed check's
    ``ValueError``. Until then results computed from bad input are garbage (never out-of-range
    indices: :func:`sample_rows` clamps its draws), so nothing may be read before it.
    """

    pending: list[tuple[Tensor, Callable[[], str]]] = field(default_factory=list)

    @contextmanager
    def collecting(self) -> Iterator[DeferredChecks]:
        token = _COLLECTING.set(self.pending)
        try:
            yield self
        finally:
            _COLLECTING.reset(token)

    def flags(self, device: torch.device | str) -> Tensor:
        """[k] long on ``device``: 1 where the k-th recorded check holds."""
        if not self.pending:
            return torch.zeros(0, dtype=torch.long, device=device)
        return torch.stack([ok.reshape(()).to(device) for ok, _ in self.pending]).long()

    def raise_failed(self, values: list[int] | list[float]) -> None:
        """Raise the first failed check's ``ValueError``, given the transferred :meth:`flags`."""
        for (_, message), value in zip(self.pending, values, strict=True):
            if not value:
                raise ValueError(message())
        self.pending.clear()


# --------------------------------------------------------------------------- logits -> probs


def logits_to_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Turn logits into exactly the distribution that is sampled; use it for target and draft.

    Order: temperature, then top-k (ties by ascending id), then top-p on the renormalised top-k
    distribution (keep the shortest prefix, in order of decreasing probability with ties by
    ascending id, whose mass is >= top_p), then renormalise. Greedy gives a one-hot row at the
    argmax, the lowest id among ties. Logits of -inf mask a token.

    :param logits: [..., V] logits of one model, any float dtype.
    :param params: temperature, top-k and top-p.
    :return: [..., V] float32 probabilities.
    """
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a float tensor, got dtype {logits.dtype}; pass the model's raw logits.")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits of shape {tuple(logits.shape)} have no vocabulary axis; pass [..., V] with V >= 1.")
    top = logits.amax(dim=-1, keepdim=True)  # NaN if any NaN, +inf if any +inf, -inf if all -inf
    _require(torch.isfinite(top).all(), lambda: _invalid_logits_message(logits))
    if params.greedy:
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)  # argmax: first maximal index
    vocab = logits.shape[-1]
    x = logits
    if 0 < params.top_k < vocab:
        x = x.masked_fill(~_top_k_mask(x, int(params.top_k)), -math.inf)
    probs = torch.softmax((x.double() - top.double()) / float(params.temperature), dim=-1)
    if params.top_p < 1:
        probs = _top_p_filter(probs, float(params.top_p))
    return probs.float()


def _invalid_logits_message(logits: Tensor) -> str:
    if bool(torch.isnan(logits).any()):
        what = "contain NaN"
    elif bool(torch.isposinf(logits).any()):
        what = "contain +inf"
    else:
        what = "are -inf everywhere in some row (every token masked)"
    return f"logits of shape {tuple(logits.shape)} {what}; check the model output and the masks applied to it."


def _top_k_mask(x: Tensor, k: int) -> Tensor:
    """[..., V] bool: the k largest entries of each row, ties at the boundary by ascending id (O(V))."""
    kth = torch.topk(x, k, dim=-1).values[..., -1:]
    above = x > kth
    tied = x == kth
    room = k - above.sum(dim=-1, keepdim=True)
    return above | (tied & (tied.cumsum(dim=-1) <= room))


def _top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest prefix (decreasing prob, ties by ascending id) with mass >= top_p; renormalise.

    Avoids a full sort of V: a top-m candidate set is enough once the tokens strictly above its
    smallest value already carry top_p (then the kept prefix lies inside them, in the same order
    and with the same prefix sums as a full sort would give). m grows 8x until that holds.
    """
    shape = probs.shape
    vocab = shape[-1]
    flat = probs.reshape(-1, vocab)
    m = min(vocab, _TOP_P_FIRST_CANDIDATES)
    while True:
        vals, ids = torch.topk(flat, m, dim=-1)  # [N, m], values descending
        if m == vocab:
            break
        above = torch.where(flat > vals[:, -1:], flat, 0.0).sum(dim=-1)
        if bool((above >= top_p + _TOP_P_MARGIN).all()):
            break
        m = min(vocab, m * 8)
    # order the candidates by (probability descending, id ascending): ids first, then a stable sort
    ids, perm = torch.sort(ids, dim=-1)
    vals, perm = torch.sort(vals.gather(-1, perm), dim=-1, descending=True, stable=True)
    ids = ids.gather(-1, perm)
    mass_before = torch.cumsum(vals, dim=-1)
    mass_before = torch.cat([torch.zeros_like(mass_before[:, :1]), mass_before[:, :-1]], dim=-1)
    kept = torch.where(mass_before < top_p, vals, 0.0)
    out = torch.zeros_like(flat).scatter_(-1, ids, kept)
    return (out / out.sum(dim=-1, keepdim=True)).reshape(shape)


# --------------------------------------------------------------------------- sampling


def sample(probs: Tensor, generator: torch.Generator | None = None, num_samples: int | None = None) -> Tensor:
    """Draw token ids with probability proportional to each row (inverse CDF in float64).

    The one sampling routine of draftrl: draft children, recovered and bonus tokens all come from
    it, so every draw follows exactly the float64-normalised row that verification assumes.
    (``torch.multinomial`` with several samples accumulates its CDF in float32 on CPU: near the
    end of a 49152-token row, tokens below ~3e-8 are never drawn and the rest move to float32 steps.)
    Zero-probability tokens are never drawn. Draws one uniform per sample.

    :param probs: [..., V] non-negative weights, e.g. from :func:`logits_to_probs`.
    :param generator: torch generator on ``probs.device``; None uses the global one.
    :param num_samples: draw this many i.i.d. ids per row; None draws one.
    :return: [...] long token ids, or [..., num_samples] when ``num_samples`` is given.
    """
    if probs.dim() == 0 or probs.shape[-1] == 0:
        raise ValueError(f"probs of shape {tuple(probs.shape)} have no vocabulary axis; pass [..., V] with V >= 1.")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise ValueError(f"num_samples={num_samples!r} must be an integer >= 1, or None for one draw per row.")
    flat = probs.reshape(-1, probs.shape[-1])
    _require(~(flat < 0).any(),
             lambda: "probs contain negative entries; pass probabilities from logits_to_probs, not logits.")
    tokens = sample_rows(flat.double(), generator, 1 if num_samples is None else num_samples)
    return tokens.reshape(probs.shape[:-1] if num_samples is None else (*probs.shape[:-1], num_samples))


def sample_rows(weights: Tensor, generator: torch.Generator | None, num_samples: int = 1,
                u: Tensor | None = None) -> Tensor:
    """[N, V] float64 non-negative weights -> [N] long (one uniform per row), or [N, num_samples]
    i.i.d. draws per row when ``num_samples`` > 1 (row-major uniforms). ``u`` [N, num_samples] float64
    in [0, 1): the uniforms to use instead of drawing them from ``generator`` (keyed sampling)."""
    cdf = weights.cumsum(dim=-1)
    total = cdf[:, -1:]
    _require(((total > 0) & torch.isfinite(total)).all(),
             lambda: "a probability row sums to zero or is not finite; every row needs positive finite mass.")
    if u is None:
        u = torch.rand((total.shape[0], num_samples), dtype=torch.float64, device=weights.device, generator=generator)
    # u * total < total, also after rounding; then the first cdf entry above it has positive weight
    point = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    # (the clamp only matters for a bad row whose check is deferred: its draw stays a valid index)
    tokens = torch.searchsorted(cdf, point, right=True).clamp_(max=weights.shape[-1] - 1)
    return tokens.squeeze(-1) if num_samples == 1 else tokens


# --------------------------------------------------------------------------- keyed sampling

_MASK64 = (1 << 64) - 1


def keyed_seed(seed: int, position: int) -> int:
    """The seed of ``position``'s stream in request ``seed``'s keyed sampling: splitmix64 of the pair,
    so that neighbouring positions and seeds get unrelated streams (63 bits, a valid torch seed)."""
    z = (int(seed) * 0x9E3779B97F4A7C15 + (int(position) + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def keyed_uniforms(seed: int, positions: list[int], device: torch.device | str) -> Tensor:
    """[len(positions)] float64 uniforms in [0, 1), entry i a function of ``(seed, positions[i])`` alone
    (the top 53 bits of :func:`keyed_seed`): the same position gets the same uniform in whichever forward,
    tree row or engine it is drawn. Computed on the host, one upload."""
    return torch.tensor([(keyed_seed(seed, t) >> 10) * 2.0 ** -53 for t in positions], dtype=torch.float64,
                        device=device)


def sample_keyed(weights: Tensor, seed: int, positions: list[int]) -> Tensor:
    """[N, V] non-negative weights -> [N] long: row i's token is the inverse CDF of the normalised row at the
    uniform keyed by (seed, positions[i]) (:func:`keyed_uniforms`), drawn as :func:`sample_rows` draws: an
    exact draw whose randomness is keyed by (seed, position), one uniform per position.

    Why: plain decoding that draws token t at position t from this stream, and speculative decoding
    whose every verified row at output position t draws from the same stream (a deterministic child is
    accepted iff it equals that draw), emit the same tokens whenever their rows' probabilities are
    equal (float32: bitwise), so a sampled run can be checked token for token like a greedy one. The
    law is unchanged: each emitted position's uniform is fresh, independent of everything before it.
    Zero-weight tokens are never drawn."""
    flat = weights.double()
    _require(~(flat < 0).any(), lambda: "keyed sampling needs non-negative rows; pass logits_to_probs rows.")
    return sample_rows(flat, None, u=keyed_uniforms(seed, list(positions), flat.device)[:, None])


def generator_for(device: torch.device | str, seed: int) -> torch.Generator:
    """A seeded generator on ``device``: the engine's one generator, on the device that holds its
    rounds' tensors, so that drafting and verification draw from one stream on one device (torch
    refuses a CPU generator for CUDA tensors, and a CUDA stream differs from the CPU one)."""
    return torch.Generator(device=device).manual_seed(int(seed))


def check_generator_device(generator: torch.Generator | None, device: torch.device) -> None:
    """Refuse a generator on another device than the tensors it would draw for, naming the fix."""
    if generator is None:
        return
    have, want = torch.device(generator.device), torch.device(device)
    if have.type != want.type or (have.index is not None and want.index is not None and have.index != want.index):
        raise ValueError(
            f"the generator is on {generator.device} but the tensors are on {device}; make it with "
            f"draftrl.models.distribution.generator_for({str(device)!r}, seed)."
        )
