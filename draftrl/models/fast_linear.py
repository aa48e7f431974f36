"""A second layout for few-token forwards on CPU: compute ``nn.Linear`` as ``(W @ x^T)^T`` for a few rows.

Whether it is faster depends on the CPU and its BLAS: :mod:`draftrl.models.kernels` times both
layouts at load and switches this one on only for the row counts where it measured faster
(the notes below are one machine's numbers, the reason the choice is measured, not fixed).

Why: speculative decoding verifies a handful of tokens per round, so the target's hot path is a
forward over a few new tokens. A small model's forward on CPU is memory-bound (every weight is read
once per forward), so verifying k tokens should cost about as much as decoding one. But
``F.linear`` turns a few-row input into a GEMM ``x @ W^T`` whose BLAS kernel handles few rows
badly: 2- and 3-token forwards of SmolLM2-135M cost ~1.6x and ~1.9x a 1-token forward. The
same product laid out as ``W @ x^T`` takes 0.5-0.85x of the time for 2..5 rows; from 6 rows on
it gains nothing and at 10-12 rows it is ~1.35x slower, hence ``MAX_ROWS``. One row (a plain
decoding step) goes through BLAS's GEMV, which on the same CPU is slower than the two-column GEMM
``W @ [x; 0]^T``: padding makes a SmolLM2-135M decoding step 1.4-1.5x faster (73 -> 53 ms on one
thread, 66 -> 44 ms on two, 200-token cache), and every speedup is measured against that faster
baseline. Without this,
g(k) = cost(k tokens) / cost(1 token) looks larger than the hardware needs, and a policy
would learn to draft too little. ``benchmarks/verify_cost.py`` measures the curve on your machine.

The product is the same; only the summation order inside BLAS differs, so outputs agree with
``F.linear`` to float rounding (SmolLM2 logits, |logit| <= ~30: within 5e-5 in float32).

The switch is a class swap (``nn.Linear`` <-> :class:`FastLinear`) on the existing modules, not a
wrapper, so parameters keep their identity: tied ``lm_head`` / embedding weights stay tied and
``state_dict`` keys, ``save_pretrained`` and module paths (``model.model.layers[i]...``) are
unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

#: ``apply_fast_linear``'s default rows (the layout ``kernels="fast_linear"`` forces): inputs with
#: at least this many rows (tokens x batch) use the transposed layout (one row padded to two
#: columns) ...
MIN_ROWS = 1
#: ... and at most this many. Measured (SmolLM2-135M, 200-token KV cache, AMD EPYC Zen 4, MKL
#: 2024.2, one thread, paired runs), fast/plain forward time: 0.52x at 2 rows, 0.60x at 3, 0.77x
#: at 4, 0.85x at 5, 0.97-0.99x at 6, 1.01-1.03x at 8, 1.35-1.40x at 10-12, 1.04x at 16-32.
#: Re-measure with ``benchmarks/verify_cost.py --max-rows N`` on other CPUs.
MAX_ROWS = 5


class FastLinear(nn.Linear):
    """``nn.Linear`` whose forward uses ``(W @ x^T)^T`` for the row counts in ``self.fast_rows`` on CPU.

    Only ever created by :func:`apply_fast_linear` (class swap of an existing ``nn.Linear``, which
    sets ``fast_rows``); all other inputs (other row counts, CUDA tensors) take the ordinary
    ``F.linear`` path.
    """

    fast_rows: frozenset[int] = frozenset()
    """row counts (tokens x batch) computed in the transposed layout"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        num_rows = x.numel() // self.in_features if self.in_features else 0
        if x.device.type != "cpu" or num_rows not in self.fast_rows:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(num_rows, self.in_features)  # [num_rows, in]
        if num_rows == 1:  # a zero second column turns the slow GEMV into a GEMM; it is dropped below
            rows = torch.cat([rows, rows.new_zeros(1, self.in_features)])
        # The copy back to [num_rows, out] contiguous is cheap (a few rows) and pays for itself:
        # with a transposed view the following ops ran slower, cancelling much of the gain
        # (measured at k=2: 0.52x of plain time with the copy, 0.80x without).
        if self.bias is None:
            out_t = torch.mm(self.weight, rows.T)  # [out, max(num_rows, 2)]
        else:
            out_t = torch.addmm(self.bias.unsqueeze(1), self.weight, rows.T)
        return out_t[:, :num_rows].T.contiguous().reshape(*x.shape[:-1], self.out_features)


def apply_fast_linear(model: nn.Module, rows: Iterable[int] | None = None) -> int:
    """Switch every plain ``nn.Linear`` in ``model`` (lm_head included) to :class:`FastLinear`.

    :param rows: the row counts that use the transposed layout (default ``MIN_ROWS..MAX_ROWS``,
        the layout measured on one AMD EPYC); an empty set leaves the model as it is.

    Subclasses of ``nn.Linear`` (quantized or LoRA layers, say) are left alone because their
    forward is not ``F.linear``. Modules already switched get the new ``rows``. Returns the
    number of modules switched from ``nn.Linear``; applying twice switches nothing more.
    """
    fast_rows = frozenset(range(MIN_ROWS, MAX_ROWS + 1) if rows is None else (int(r) for r in rows))
    if not fast_rows:
        return 0
    num_switched = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = FastLinear
            num_switched += 1
        if type(module) is FastLinear:
            module.fast_rows = fast_rows
    return num_switched


def remove_fast_linear(model: nn.Module) -> int:
    """Undo :func:`apply_fast_linear`; returns the number of modules switched back."""
    num_switched = 0
    for module in model.modules():
        if type(module) is FastLinear:
            module.__class__ = nn.Linear
            module.__dict__.pop("fast_rows", None)
            num_switched += 1
    return num_switched


def has_fast_linear(model: nn.Module) -> bool:
    """Whether any module of ``model`` currently uses :class:`FastLinear`."""
    return any(type(module) is FastLinear for module in model.modules())


def fast_rows(model: nn.Module) -> frozenset[int]:
    """The row counts for which ``model``'s linear layers use the transposed layout (empty: stock)."""
    return next((m.fast_rows for m in model.modules() if type(m) is FastLinear), frozenset())
