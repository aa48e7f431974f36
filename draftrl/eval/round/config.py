"""``EvalConfig``: the workload, the grid, the policies and the logging of ``draftrl grid`` / ``eval``.

One YAML file drives both commands (and ``draftrl demo``, whose ``DemoConfig`` adds the training
steps); ``configs/eval_tiny_cpu.yaml`` is an example. Sections:

- ``env``: an :class:`~draftrl.config.env.EnvConfig`: prompts (languages, tasks, how many per
  group, token budget), target and drafter, sampling, and the observation settings the
  policies see. Its ``split`` is ignored: ``draftrl grid`` always tunes on ``tune`` and
  ``draftrl eval`` always reports on ``heldout``.
- ``grid``: :class:`GridConfig`, the fixed settings ``draftrl grid`` times.
- ``eval``: :class:`PolicyEvalConfig`, the policies ``draftrl eval`` compares.
- ``wandb``: :class:`~draftrl.config.wandb.WandbConfig`; ``WANDB_MODE`` in the environment wins over ``mode``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from draftrl.config import SAMPLERS
from draftrl.config.env import EnvConfig
from draftrl.config.wandb import WandbConfig


@dataclass
class GridConfig:
    """The fixed (depth, verify_size, width) settings timed by ``draftrl grid`` on the tune split."""

    depths: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
    """draft depths; 0 (plain decoding, the reference) is always added"""
    verify_sizes: tuple[int, ...] = (0,)
    """draft nodes the target verifies; 0 = every drafted node"""
    widths: tuple[int, ...] = (1,)
    """tree widths (1 = chain); cells with verify_size >= depth * width repeat "all" and are dropped"""
    repeats: int = 3
    """interleaved passes over the prompts; each (cell, prompt) keeps its median-time run"""
    warmup: bool = True
    """decode a few untimed tokens with every cell first (caches, allocator, lazy init)"""
    limit_per_group: int | None = None
    """prompts per (language, task) group; None = env.limit_per_group"""
    replay_rank: bool = False
    """rank every cell on ``traces`` in the replay first (``draftrl.eval.round.grid.ReplayRanking``, temperature
    0), then time only plain decoding and the ``top_cells`` best (and every cell the replay cannot play) live"""
    traces: str | None = None
    """a ``draftrl collect`` directory (greedy traces with their cost table) for ``replay_rank``; ``draftrl demo``
    fills in its own (``DIR/traces``)"""
    top_cells: int = 3
    """with ``replay_rank``: how many of the replay's best cells are timed live"""

    def __post_init__(self) -> None:
        if self.top_cells < 1:
            raise ValueError(f"grid.top_cells={self.top_cells} must be >= 1 (the replay's best cells timed live).")
        for name in ("depths", "verify_sizes", "widths"):
            values = tuple(int(v) for v in getattr(self, name))
            if not values or any(v < 0 for v in values) or len(set(values)) != len(values):
                raise ValueError(f"grid.{name}={list(values)} must be distinct integers >= 0, at least one.")
            setattr(self, name, values)
        if any(w < 1 for w in self.widths):
            raise ValueError(f"grid.widths={list(self.widths)} must be >= 1 (1 = chain drafting).")
        if self.repeats < 1:
            raise ValueError(f"grid.repeats={self.repeats} must be >= 1 (3 or more for a stable median).")
        if 0 not in self.depths:
            self.depths = (0, *self.depths)  # plain decoding is the reference of every speedup


@dataclass
class PolicyEvalConfig:
    """What ``draftrl eval`` compares on the held-out split."""

    policies: tuple[str, ...] = ("none", "best-grid", "heuristic", "threshold", "bandit")
    """policy names (``draftrl.eval.policy_names``; ``none``, the reference, is always added)"""
    repeats: int = 1
    """interleaved passes over the requests; each (policy, request) keeps its median-time run"""
    limit_per_group: int | None = None
    """held-out prompts per (language, task) group; None = env.limit_per_group"""
    greedy_reference: int = 2
    """temperature 0: requests also checked against Hugging Face generate(do_sample=False)"""
    monitor: bool = True
    """run the streaming exactness monitor on every emitted token"""
    sampler: str = "correct"
    """correct; resample-from-p (the known-wrong correction) or off-by-one (keeps the first rejected draft
    token): negative controls"""
    near_tie_ulps: float | None = None
    """bfloat16/float16 targets at temperature 0: a divergence from plain decoding is a rounding near-tie
    (reported) when the target's margin between the two disputed tokens is within this many ulps of the
    dtype at their logits' magnitude, else a violation (raised); None = the dtype's default
    (``draftrl.eval.agreement.NEAR_TIE_ULPS``); float32 demands bitwise identity and ignores it"""
    power_tokens: int = 0
    """> 0: also measure how many tokens each monitor statistic needs to catch resample-from-p"""
    anchors: bool = True
    """temperature 0: also time stock Hugging Face generate and its prompt lookup on the same requests
    (``draftrl.eval.round.anchors``), in the grid and in the evaluation"""
    anchor_gammas: tuple[int, ...] = (1, 2, 4, 8)
    """prompt-lookup gammas timed as anchors (the evaluation times only the grid's best one when given a grid)"""

    def __post_init__(self) -> None:
        self.policies = tuple(self.policies)
        self.anchor_gammas = tuple(int(g) for g in self.anchor_gammas)
        if any(g < 1 for g in self.anchor_gammas):
            raise ValueError(f"eval.anchor_gammas={list(self.anchor_gammas)} must be >= 1 (prompt-lookup tokens).")
        if self.repeats < 1:
            raise ValueError(f"eval.repeats={self.repeats} must be >= 1.")
        if self.greedy_reference < 0 or self.power_tokens < 0:
            raise ValueError(
                f"eval.greedy_reference={self.greedy_reference} and eval.power_tokens={self.power_tokens} must be >= 0."
            )
        if self.near_tie_ulps is not None and not (0 < self.near_tie_ulps < float("inf")):
            from draftrl.eval.agreement import NEAR_TIE_ULPS

            defaults = ", ".join(f"{v:g} for {k}" for k, v in NEAR_TIE_ULPS.items())
            raise ValueError(f"eval.near_tie_ulps={self.near_tie_ulps} must be a positive number of ulps, or null "
                             f"for the dtype's default ({defaults}).")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"eval.sampler={self.sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}.")


def _default_env() -> EnvConfig:
    # the grid and eval pick the split themselves; shuffling is irrelevant (requests are named)
    return EnvConfig(split=None, shuffle=False)


@dataclass
class EvalConfig:
    """Everything ``draftrl grid`` and ``draftrl eval`` read."""

    env: EnvConfig = field(default_factory=_default_env)
    """workload, models, sampling and observation settings (split is set per command)"""
    grid: GridConfig = field(default_factory=GridConfig)
    eval: PolicyEvalConfig = field(default_factory=PolicyEvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    threads: int = 0
    """torch intra-op threads (0 = torch's default)"""
    seed: int = 0
    """grid: seed of the sampling seeds (one per prompt, shared by every cell); eval: seed of the envs
    (prompt sampling seeds) and of the monitor-power run"""

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError(f"threads={self.threads} must be >= 0 (0 = torch's default).")


def env_for_split(env: EnvConfig, split: str, limit_per_group: int | None = None, **changes) -> EnvConfig:
    """``env`` restricted to ``split`` (and ``limit_per_group`` when given), in file order, monitor off
    (the evaluation runs its own monitor over every policy's stream)."""
    limit = env.limit_per_group if limit_per_group is None else limit_per_group
    return dataclasses.replace(env, split=split, limit_per_group=limit, shuffle=False, monitor=False, **changes)
