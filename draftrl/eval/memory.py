"""Peak memory of one request: CUDA allocator peak on GPU, resident set size (RSS) on CPU.

``tracemalloc`` would miss tensors (torch allocates outside Python's allocator) and slows every
allocation, so on CPU the probe reads the process RSS from ``/proc/self/statm`` (a few
microseconds) after every round and reports the peak above the RSS at the request's start. The
allocator keeps freed pages, so the delta is the memory a request had to *add*; the absolute
peak is reported too. On CUDA, ``torch.cuda.max_memory_allocated`` minus the allocation at the
start (the peak counter is reset per request).
"""

from __future__ import annotations

import os
import resource


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the lifetime peak is all there is
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class MemoryProbe:
    """``start()`` before a request, ``sample()`` after every round, then ``peak_delta`` / ``peak``.

    :param device: ``"cpu"`` or ``"cuda[:N]"``; CUDA uses the allocator's peak counter.
    """

    def __init__(self, device: str = "cpu"):
        self.cuda = str(device).startswith("cuda")
        self.device = device
        self.start()

    def _now(self) -> int:
        if self.cuda:
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        return _rss_bytes()

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = int(torch.cuda.memory_allocated(self.device))
        else:
            self.base = _rss_bytes()
        self.peak = self.base

    def sample(self) -> None:
        now = self._now()
        if now > self.peak:
            self.peak = now

    @property
    def peak_delta(self) -> int:
        """Bytes above the start of the request (>= 0)."""
        return max(0, self.peak - self.base)

    @property
    def kind(self) -> str:
        return "cuda_max_memory_allocated" if self.cuda else "rss"
