"""The configs of the commands that decode without training: ``generate``, ``collect``, ``calibrate``.

Each reads the same ``env`` section (:class:`~draftrl.config.env.EnvConfig`: models, sampling,
workload) as ``grid``, ``eval`` and ``demo``, plus its own keys, so one YAML file (e.g.
``configs/eval_tiny_cpu.yaml``) drives them all; ``threads`` and ``seed`` are top-level keys on
every command that has them (``draftrl.cli._options``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftrl.config import SAMPLERS
from draftrl.config.env import EnvConfig


def _generate_env() -> EnvConfig:
    return EnvConfig(max_new_tokens=128, split=None, chat_template=False)


@dataclass
class GenerateConfig:
    """``draftrl generate``: one prompt decoded with a fixed (depth, verify_size, width) every round."""

    env: EnvConfig = field(default_factory=_generate_env)
    """models, sampling (temperature, top_k, top_p, draft_sampling), max_new_tokens, width, monitor,
    chat_template (default false here: the prompt is sent as written)"""
    depth: int = 4
    """draft depth per round (0 = plain decoding)"""
    verify_size: int = 0
    """draft nodes the target verifies; 0 = every drafted node"""
    sampler: str = "correct"
    """correct; resample-from-p (the known-wrong correction) or off-by-one (keeps the first rejected draft
    token): negative controls of the monitor and of the per-token argmax check"""
    seed: int = 0
    """seed of the sampling generator"""
    threads: int = 0
    """torch intra-op threads (0 = torch's default)"""

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler={self.sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}.")
        if self.verify_size < 0 or self.threads < 0:
            raise ValueError(f"verify_size={self.verify_size} and threads={self.threads} must be >= 0 "
                             "(0 = all / default).")
        if self.env.max_new_tokens is None:
            raise ValueError("env.max_new_tokens must be set for draftrl generate (a prompt has no suggested budget).")


@dataclass
class CollectConfig:
    """``draftrl collect``: the env whose prompts are decoded (at each of its sampling classes) and recorded."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """workload, models and the action grid (the traces hold max(env.depths) levels of env.width nodes)"""
    threads: int = 0
    """torch intra-op threads (0 = torch's default)"""
    continuations: int | None = None
    """recordings per prompt of each sampled class (K; None = ``DEFAULT_CONTINUATIONS``, 4); a greedy class
    records one. Collection time grows with K (``--continuations`` overrides)"""

    def __post_init__(self) -> None:
        if self.continuations is not None and int(self.continuations) < 1:
            raise ValueError(f"continuations={self.continuations} must be >= 1 (recordings per prompt and "
                             "temperature), or null for the default.")


@dataclass
class CalibrationConfig:
    """What ``draftrl calibrate`` measures (the ``calibrate:`` config section); models come from ``env``."""

    num_tokens: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    """tokens per target forward (a depth-d chain round feeds d + 1; 1 = a plain step is always added)"""
    contexts: tuple[int, ...] = (128, 512, 1024)
    """context lengths (tokens in the cache)"""
    widths: tuple[int, ...] = (1, 2, 4, 8)
    """draft tree widths"""
    levels: int = 4
    """draft levels timed per width"""
    repeats: int = 3
    """interleaved repeats per cell (median kept)"""
    def __post_init__(self) -> None:
        for name in ("num_tokens", "contexts", "widths"):
            values = tuple(int(v) for v in getattr(self, name))
            if not values or any(v < 1 for v in values):
                raise ValueError(f"calibrate.{name}={list(values)} must hold positive integers, e.g. 1,2,4,8.")
            setattr(self, name, tuple(sorted(set(values))))
        if self.repeats < 1 or self.levels < 1:
            raise ValueError(f"calibrate.repeats={self.repeats} and calibrate.levels={self.levels} must be >= 1.")


@dataclass
class CalibrateConfig:
    """``draftrl calibrate``: what to measure, for the models of the ``env`` section."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """target, drafter, device, dtype and temperature (the sampling transform the sample cost times)"""
    calibrate: CalibrationConfig = field(default_factory=CalibrationConfig)
    threads: int = 1
    """torch threads: the count your envs run with (1: on a shared CPU one thread is far steadier)"""
    seed: int = 0
    """seed of the measurement order"""
