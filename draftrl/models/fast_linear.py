"""Faster few-token forwards on CPU: compute ``nn.Linear`` as ``(W @ x^T)^T`` for small row counts.

Why: speculative decoding verifies a handful of tokens per round, so the target's hot path is a
forward over 2..32 new tokens. On CPU, ``F.linear`` turns that into a GEMM ``x @ W^T`` whose BLAS
kernel is tuned for either one row (GEMV) or many rows; for a few rows it is often far slower than
the same product laid out as ``W @ x^T``. That makes verifying k tokens look much more expensive
than it is (g(k) = cost(k tokens) / cost(1 token) well above 1 even for k = 4), which would teach
a policy to draft too little. ``benchmarks/verify_cost.py`` measures the curve.

The product is the same; only the summation order inside BLAS differs, so outputs agree with
``F.linear`` to float rounding (logits within ~1e-4 in float32).

The switch is a class swap (``nn.Linear`` <-> :class:`FastLinear`) on the existing modules, not a
wrapper, so parameters keep their identity: tied ``lm_head`` / embedding weights stay tied and
``state_dict`` keys, ``save_pretrained`` and module paths (``model.model.layers[i]...``) are
unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Inputs with at least this many rows (tokens x batch) use the transposed layout ...
MIN_ROWS = 2
#: ... and at most this many; larger inputs are where BLAS GEMM is already efficient.
MAX_ROWS = 32


class FastLinear(nn.Linear):
    """``nn.Linear`` whose forward uses ``(W @ x^T)^T`` for ``MIN_ROWS..MAX_ROWS`` rows on CPU.

    Only ever created by :func:`apply_fast_linear` (class swap of an existing ``nn.Linear``); all
    other inputs (one row, many rows, CUDA tensors) take the ordinary ``F.linear`` path.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        num_rows = x.numel() // self.in_features if self.in_features else 0
        if x.device.type != "cpu" or not MIN_ROWS <= num_rows <= MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(num_rows, self.in_features)  # [num_rows, in]
        out = torch.mm(self.weight, rows.T).T  # [num_rows, out], a transposed view (no copy)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def apply_fast_linear(model: nn.Module) -> int:
    """Switch every plain ``nn.Linear`` in ``model`` (lm_head included) to :class:`FastLinear`.

    Subclasses of ``nn.Linear`` (quantized or LoRA layers, say) are left alone because their
    forward is not ``F.linear``. Returns the number of modules switched; applying twice is a no-op.
    """
    num_switched = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = FastLinear
            num_switched += 1
    return num_switched


def remove_fast_linear(model: nn.Module) -> int:
    """Undo :func:`apply_fast_linear`; returns the number of modules switched back."""
    num_switched = 0
    for module in model.modules():
        if type(module) is FastLinear:
            module.__class__ = nn.Linear
            num_switched += 1
    return num_switched


def has_fast_linear(model: nn.Module) -> bool:
    """Whether any module of ``model`` currently uses :class:`FastLinear`."""
    return any(type(module) is FastLinear for module in model.modules())
