"""The one clock draftrl times rounds with: ``time.perf_counter`` after synchronising the device.

GPU kernels run asynchronously; reading the clock before they finish charges their time to
whatever runs next. Every timed phase (engine rounds, calibration, the transformers adapter,
the benchmarks) reads :func:`device_clock`, so GPU work is counted where it happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def device_clock(device: str | torch.device | tuple) -> float:
    """Seconds from ``time.perf_counter()`` once ``device``'s queued work (CUDA) has finished; a tuple
    of devices (a target split over GPUs, a drafter on another one) waits for each of them."""
    for one in device if isinstance(device, tuple) else (device,):
        one = torch.device(one)
        if one.type == "cuda":
            torch.cuda.synchronize(one)
    return time.perf_counter()


def engine_devices(target: torch.nn.Module, drafter=None) -> tuple[torch.device, ...]:
    """The devices a round of ``target`` and ``drafter`` runs on: the target's first (its inputs'), then
    every other one its weights or the drafter's (a ``device`` attribute, or its model's) live on."""
    first = next(target.parameters()).device
    found = {torch.device(d if not isinstance(d, int) else f"cuda:{d}")
             for d in (getattr(target, "hf_device_map", None) or {}).values() if d != "disk"}
    for obj in (drafter, getattr(drafter, "model", None)):
        device = getattr(obj, "device", None)
        if isinstance(device, torch.device):
            found.add(device)
    return (first, *sorted(found - {first}, key=str))


def clock_for(device: str | torch.device | tuple) -> Callable[[], float]:
    """A no-argument :func:`device_clock` for ``device`` or a tuple of devices (``time.perf_counter``
    itself when none is a GPU)."""
    devices = tuple(torch.device(d) for d in (device if isinstance(device, tuple) else (device,)))
    if all(d.type != "cuda" for d in devices):
        return time.perf_counter
    return lambda: device_clock(devices)
