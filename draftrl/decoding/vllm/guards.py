"""Workarounds for vLLM bugs that would break draftrl's exactness contract, applied before engines run.

Each guard says what is wrong in the vLLM release draftrl pins, how it was measured, and does
nothing where the bug cannot occur.
"""

from __future__ import annotations

from typing import Any

from draftrl.deps import installed


def guard_cpu_expand() -> None:
    """Work around a vLLM 0.32 CPU bug that makes speculative decoding inexact at temperature > 0.

    The rejection sampler spreads each request's temperature, top-k and top-p over its draft
    positions with ``expand_batch_to_tokens``, which fills a new float (or int32) tensor through
    the CPU ``expand_kernel`` override (``vllm/utils/cpu_triton_utils.py``). That override hands
    the C++ kernel ``output.to(torch.int64)``, a copy, so the real output keeps uninitialised
    memory: every draft position is verified under a garbage temperature. Measured here (float32,
    T = 1, draftrl's proposer): almost every draft was rejected and each recovered token was the
    target's least likely token (rank 49152 of 49152). This writes the expansion in torch instead,
    for engines still to be built (the module attribute vLLM registers from) and for the
    override already registered in this process. Nothing changes off CPU or without vLLM.
    """
    if not installed("vllm"):
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample import rejection_sampler

    if getattr(cpu_triton_utils._expand_kernel_impl, "shipped", None) is None:
        _expand_kernel_impl.shipped = cpu_triton_utils._expand_kernel_impl  # type: ignore[attr-defined]
        cpu_triton_utils._expand_kernel_impl = _expand_kernel_impl
    kernel = rejection_sampler.expand_kernel
    if hasattr(kernel, "_impl"):  # vLLM's KernelOverride, registered when an engine was built
        kernel._impl = kernel.func = _expand_kernel_impl


def _expand_kernel_impl(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                        MAX_NUM_TOKENS: Any = None) -> None:
    """``output[cu[i-1]:cu[i]] = input_val[i]`` (``replace_from`` read as ``replace_to``), in place,
    for any dtype: what vLLM's Triton ``expand_kernel`` does (see :func:`guard_cpu_expand`)."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(values, counts, output_size=output.shape[0]))
