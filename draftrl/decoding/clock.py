"""The one clock draftrl times rounds with: ``time.perf_counter`` after synchronising the device.

GPU kernels run asynchronously; reading the clock before they finish charges their time to
whatever runs next. Every timed phase (engine rounds, calibration, the transformers adapter,
the benchmarks) reads :func:`device_clock`, so GPU work is counted where it happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def device_clock(device: str | torch.device) -> float:
    """Seconds from ``time.perf_counter()`` once ``device``'s queued work (CUDA) has finished."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def clock_for(device: str | torch.device) -> Callable[[], float]:
    """A no-argument :func:`device_clock` for ``device`` (``time.perf_counter`` itself on a CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return time.perf_counter
    return lambda: device_clock(device)
