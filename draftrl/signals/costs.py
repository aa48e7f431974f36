"""The cost table written by ``draftrl calibrate``: what a round costs on one machine.

JSON layout (``format: draftrl-cost-table/1``), all times in seconds, medians of interleaved
repeats, device synchronised before each clock reading:

- ``verify.num_tokens`` [N]: tokens fed to one target forward (1 = a plain autoregressive step;
  a round that verifies ``n`` draft nodes feeds ``n + 1``: the root and the nodes).
- ``verify.context_lens`` [C]: tokens already in the KV cache.
- ``verify.seconds`` [C][N]: one target forward.
- ``draft.widths`` [W]; ``draft.base_seconds``: per-round drafter overhead (``features()``: the
  n-gram match, or the draft forward that catches up with the last round's tokens);
  ``draft.level_seconds`` [W]: one more draft level (one batched draft forward for model drafters).
- ``sample.base_seconds`` + ``sample.token_seconds`` * tokens: acceptance walk, exactness
  statistics and KV bookkeeping of one round.
- ``noise``: median relative absolute deviation of the verify repeats (a sigma for
  ``EnvConfig.cost_noise``); ``hardware``, ``torch``, ``threads``, ``target``, ``drafter``.

Lookups interpolate linearly in the number of tokens and the context length and clamp outside
the measured grid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "draftrl-cost-table/1"


@dataclass
class CostTable:
    """Measured costs of the target forward, the drafter and the sampler on one machine."""

    num_tokens: np.ndarray
    """[N] ascending tokens per target forward, starting at 1"""
    context_lens: np.ndarray
    """[C] ascending context lengths (tokens in the cache)"""
    verify_seconds: np.ndarray
    """[C, N] seconds of one target forward"""
    draft_widths: np.ndarray
    """[W] ascending tree widths"""
    draft_level_seconds: np.ndarray
    """[W] seconds of one draft level"""
    draft_base_seconds: float = 0.0
    """seconds of the drafter's per-round work (features, catching up)"""
    sample_base_seconds: float = 0.0
    sample_token_seconds: float = 0.0
    noise: float = 0.0
    """median relative absolute deviation of repeated verify timings"""
    meta: dict = field(default_factory=dict)
    """hardware, torch, threads, target, drafter, device, dtype, ..."""

    def __post_init__(self) -> None:
        self.num_tokens = np.asarray(self.num_tokens, dtype=np.float64)
        self.context_lens = np.asarray(self.context_lens, dtype=np.float64)
        self.verify_seconds = np.asarray(self.verify_seconds, dtype=np.float64)
        self.draft_widths = np.asarray(self.draft_widths, dtype=np.float64)
        self.draft_level_seconds = np.asarray(self.draft_level_seconds, dtype=np.float64)
        if self.num_tokens.ndim != 1 or self.num_tokens.size == 0 or self.num_tokens[0] != 1:
            raise ValueError(f"cost table verify.num_tokens={self.num_tokens.tolist()} must start at 1 (a plain step).")
        for name in ("num_tokens", "context_lens", "draft_widths"):
            values = getattr(self, name)
            if values.size == 0 or np.any(np.diff(values) <= 0):
                raise ValueError(f"cost table {name}={values.tolist()} must be non-empty and strictly increasing.")
        expected = (self.context_lens.size, self.num_tokens.size)
        if self.verify_seconds.shape != expected:
            raise ValueError(
                f"cost table verify.seconds has shape {self.verify_seconds.shape}; expected "
                f"[len(context_lens), len(num_tokens)] = {list(expected)}."
            )
        if self.draft_level_seconds.shape != self.draft_widths.shape:
            raise ValueError("cost table draft.level_seconds must have one entry per draft.widths entry.")
        for name in ("num_tokens", "context_lens", "verify_seconds", "draft_widths", "draft_level_seconds",
                     "draft_base_seconds", "sample_base_seconds", "sample_token_seconds", "noise"):
            values = np.asarray(getattr(self, name), dtype=np.float64)
            if not np.all(np.isfinite(values)):
                raise ValueError(f"cost table {name} holds non-finite values ({values.tolist()}); "
                                 "measure it again with draftrl calibrate --json --out FILE.")
        if np.any(self.verify_seconds <= 0):
            raise ValueError("cost table verify.seconds must be positive everywhere.")

    # ------------------------------------------------------------------ lookups
    def verify(self, num_tokens: float, context_len: float) -> float:
        """Seconds of one target forward over ``num_tokens`` tokens after ``context_len`` cached ones."""
        per_ctx = [np.interp(num_tokens, self.num_tokens, row) for row in self.verify_seconds]
        if len(per_ctx) == 1:
            return float(per_ctx[0])
        return float(np.interp(context_len, self.context_lens, per_ctx))

    def g(self, num_tokens: float, context_len: float | None = None) -> float:
        """``verify(num_tokens) / verify(1)``: the cost of a forward in plain-step units."""
        ctx = float(np.median(self.context_lens)) if context_len is None else context_len
        return self.verify(num_tokens, ctx) / self.verify(1, ctx)

    def draft_level(self, width: int) -> float:
        """Seconds of one draft level at tree width ``width``."""
        return float(np.interp(width, self.draft_widths, self.draft_level_seconds))

    def draft(self, levels: int, width: int) -> float:
        """Draft seconds of a round with ``levels`` levels (the per-round base included)."""
        return self.draft_base_seconds + levels * self.draft_level(width)

    def sample(self, num_emitted: int) -> float:
        """Seconds of the acceptance walk and bookkeeping of a round emitting ``num_emitted`` tokens."""
        return self.sample_base_seconds + num_emitted * self.sample_token_seconds

    def ar_step(self, context_len: float) -> float:
        """Seconds of one plain autoregressive step (the unit of the cost features)."""
        return self.verify(1, context_len)

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            **self.meta,
            "verify": {
                "num_tokens": [int(n) for n in self.num_tokens],
                "context_lens": [int(c) for c in self.context_lens],
                "seconds": self.verify_seconds.tolist(),
            },
            "draft": {
                "widths": [int(w) for w in self.draft_widths],
                "base_seconds": self.draft_base_seconds,
                "level_seconds": self.draft_level_seconds.tolist(),
            },
            "sample": {"base_seconds": self.sample_base_seconds, "token_seconds": self.sample_token_seconds},
            "noise": self.noise,
        }

    @classmethod
    def from_dict(cls, data: dict, source: str = "cost table") -> CostTable:
        if data.get("format") != FORMAT:
            raise ValueError(
                f"{source} has format={data.get('format')!r}, expected {FORMAT!r}; "
                "write it with draftrl calibrate --out FILE."
            )
        try:
            verify, draft, sample = data["verify"], data["draft"], data["sample"]
            meta = {k: v for k, v in data.items() if k not in ("format", "verify", "draft", "sample", "noise", "g")}
            return cls(
                num_tokens=verify["num_tokens"],
                context_lens=verify["context_lens"],
                verify_seconds=verify["seconds"],
                draft_widths=draft["widths"],
                draft_level_seconds=draft["level_seconds"],
                draft_base_seconds=float(draft.get("base_seconds", 0.0)),
                sample_base_seconds=float(sample.get("base_seconds", 0.0)),
                sample_token_seconds=float(sample.get("token_seconds", 0.0)),
                noise=float(data.get("noise", 0.0)),
                meta=meta,
            )
        except KeyError as err:
            raise ValueError(f"{source} lacks key {err}; regenerate it with draftrl calibrate --out FILE.") from None
        except (TypeError, ValueError) as err:
            if str(err).startswith("cost table"):
                raise ValueError(f"{source}: {err}") from None
            raise ValueError(f"{source} holds a malformed value ({err}); "
                             "regenerate it with draftrl calibrate --out FILE.") from None

    def save(self, path: str | Path) -> None:
        """Write the table as JSON, atomically (a temporary file, then a rename)."""
        from draftrl.io import write_json

        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"cost table {path} does not exist; "
                                    f"write one with draftrl calibrate --json --out {path}")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"cost table {path} is not valid JSON ({err}); write it with draftrl calibrate --json "
                             f"--out {path}") from None
        if not isinstance(data, dict):
            raise ValueError(f"cost table {path} must hold a JSON object; "
                             f"write it with draftrl calibrate --json --out {path}")
        return cls.from_dict(data, source=str(path))


def hardware_info(device: str = "cpu") -> dict:
    """Where timings were taken: CPU model and cores, torch version and threads, GPU name."""
    import os
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def hardware_name(info: dict) -> str:
    """One short label for printed lines: the GPU if any, else the CPU model (spaces as _)."""
    return str(info.get("gpu") or info.get("cpu") or "unknown").replace(" ", "_")
