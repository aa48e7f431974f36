"""``EnvConfig``: one request-level decoding workload for the real and the replayed envs.

Defaults live here; YAML files in ``configs/`` override what differs under an ``env:`` section
(``draftrl.config.load_config``), e.g. ``configs/tiny_cpu.yaml``. The same config drives
``draftrl/SpecDecode-v2``, ``draftrl/SpecDecodeDepth-v2``, ``draftrl collect`` and
``draftrl/TraceReplay-v1``, so a policy trained on replay meets the same spaces on the real env.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from draftrl.config import from_dict, read_env_file
from draftrl.config.workload import WorkloadConfig

#: Reward modes (see ``draftrl.signals.rewards``).
REWARD_MODES: tuple[str, ...] = ("ratio", "throughput")


@dataclass
class EnvConfig(WorkloadConfig):
    """Workload (:class:`WorkloadConfig`), drafter, device, action grid and reward of a
    speculative-decoding env (TraceReplay-v1 replays the sampling classes its traces hold)."""

    # ---- workload: WorkloadConfig's fields (prompts, split, target, max_new_tokens, temperature, ...)
    ignore_eos: bool = False
    """decode every request to its max_new_tokens past EOS (vLLM's ignore_eos): benchmarks and
    negative controls run to length"""
    # ---- drafting
    drafter: str = "ngram"
    """a spec of ``draftrl.drafters.registry``: ngram | ngram:MIN:MAX[:earliest|latest] | layerskip:N | self | none |
    eagle3[:PATH] | sam:N[:PATH] | a draft model path or hub id (same tokenizer; its embedding matrix may be padded
    differently from the target's)"""
    dtype: str = "float32"
    device: str = "cpu"
    device_map: str | dict[str, str | int] | None = None
    """split the target over devices: auto | balanced | balanced_low_0 | sequential, or a mapping module ->
    device (0, cuda:1, cpu); transformers' from_pretrained(device_map=...) with accelerate's dispatch
    (draftrl.models.placement). ``device`` then names where the inputs and logits live (one of the map's
    devices, e.g. cuda:0). None: the whole target on ``device``"""
    max_memory: dict[str | int, str | int] | None = None
    """with a preset device_map: device -> limit, e.g. {0: 70GiB, 1: 70GiB} (keys: the devices it may fill)"""
    mixed_devices: bool = False
    """allow the target split over devices of different kinds (GPUs and CPU offload); refused by default,
    since such rounds time weight transfers more than the model"""
    draft_device: str | None = None
    """device of the drafter's own weights (a draft model or an EAGLE-3 head), e.g. cuda:1 beside a target
    on cuda:0; tokens and hidden states move to it and its proposals back. None: the target's (first) device"""
    kernels: str | None = None
    """few-token CPU kernels: auto (a timed probe, cached per machine), stock or fast_linear;
    None = $DRAFTRL_KERNELS, else auto (see draftrl.models.kernels)"""
    compile: str = "off"
    """``torch.compile`` the target's verify forward: off, default, reduce-overhead or max-autotune
    (torch.compile's modes, dynamic shapes). Off by default: not yet measured on a GPU, and each new
    shape it meets costs a compilation (seconds to minutes) before it can pay off"""
    draft_sampling: bool = False
    """model drafters sample proposals from q instead of taking the top children (exact, not replayable
    from traces: train such policies on the live env)"""
    keyed: bool = False
    """draw the token of each output position by the inverse CDF at a uniform keyed by (request seed, position):
    the same law, and then speculative decoding emits, in float32, token for token what plain decoding
    with the same seed emits, so a sampled run is checked like a greedy one (``EngineConfig.keyed``; needs
    deterministic drafts, draft_sampling off)"""
    # ---- action grid
    depths: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
    """draft depths the policy chooses from; 0 = no speculation (a plain target step)"""
    verify_sizes: tuple[int, ...] = (0,)
    """draft nodes the target verifies; 0 = all drafted nodes"""
    width: int = 1
    """tree width: draft nodes kept per level (1 = a chain)"""
    # ---- observation and reward
    history: int = 4
    """rounds of tokens-per-round history in the observation (feature names depend on it)"""
    ema_decay: float = 0.8
    """per-round decay of the tokens-per-round EMA and of the acceptance counts"""
    cost_decay: float = 0.9
    """per-sample decay of the running cost averages (verify, draft)"""
    reward: str = "ratio"
    """ratio: tokens - rho * seconds; throughput: tokens / seconds (see draftrl.signals.rewards)"""
    rho: float = 0.0
    """initial throughput estimate in tokens/s for reward=ratio; 0 = from the cost table or the first round"""
    rho_rate: float = 0.1
    """step of the per-episode rho update toward the last episode's tokens/s (0 keeps rho fixed)"""
    cost_table: str | None = None
    """JSON from draftrl calibrate: initial cost features; the seconds TraceReplay-v1 charges"""
    cost_noise: float = 0.0
    """TraceReplay-v1: lognormal sigma of multiplicative noise on replayed seconds (0 = none)"""
    cost_jitter: float = 0.0
    """TraceReplay-v1: lognormal sigma of a per-episode factor on the verify cost's growth
    (cost(n) - cost(1)) and on draft seconds: other machines, so that a policy learns to read
    the cost features instead of memorising one cost table (0 = none)"""
    monitor: bool = True
    """run the streaming exactness monitor on every emitted token (SpecDecode envs)"""
    depth_shaping: bool = False
    """SpecDecodeDepth-v2 with reward=ratio: pay -rho * draft seconds on every draft step"""

    def __post_init__(self) -> None:
        from draftrl.config import COMPILE_MODES, KERNELS

        super().__post_init__()
        if self.kernels is not None and self.kernels not in KERNELS:
            raise ValueError(f"{self.section}.kernels={self.kernels!r} is not a kernel choice; "
                             f"use one of {', '.join(KERNELS)}.")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"{self.section}.compile={self.compile!r} is not a torch.compile mode; use one of "
                             f"{', '.join(COMPILE_MODES)}.")
        if self.device_map is not None and self.compile != "off":
            raise ValueError(f"{self.section}.compile={self.compile!r} with {self.section}.device_map: torch.compile "
                             "over accelerate's device hooks (a .to() between devices inside every split forward) is "
                             "not measured yet; drop one of them (compile=off).")
        if self.draft_device is not None and not isinstance(self.draft_device, str):
            raise ValueError(f"{self.section}.draft_device={self.draft_device!r} must be a device string, e.g. cuda:1.")
        self.depths = _grid(self.depths, f"{self.section}.depths", minimum=0)
        self.verify_sizes = _grid(self.verify_sizes, f"{self.section}.verify_sizes", minimum=0)
        if self.width < 1:
            raise ValueError(f"{self.section}.width={self.width} must be >= 1 (1 = chain drafting).")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"{self.section}.reward={self.reward!r} is unknown; use one of {', '.join(REWARD_MODES)}.")
        if self.history < 1:
            raise ValueError(f"{self.section}.history={self.history} must be >= 1 round.")
        for name in ("ema_decay", "cost_decay"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{self.section}.{name}={value} must be in [0, 1).")
        if not 0.0 <= self.rho_rate <= 1.0:
            raise ValueError(f"{self.section}.rho_rate={self.rho_rate} must be in [0, 1] (0 keeps rho fixed).")
        if self.rho < 0:
            raise ValueError(f"{self.section}.rho={self.rho} must be >= 0 tokens/s (0 = estimate it).")
        for name in ("cost_noise", "cost_jitter"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.section}.{name}={getattr(self, name)} must be >= 0 (a lognormal sigma).")
        if self.keyed and self.draft_sampling:
            raise ValueError(f"{self.section}.keyed=true needs deterministic drafts but {self.section}.draft_sampling="
                             "true; turn one of them off.")
        if self.depth_shaping and self.reward != "ratio":
            raise ValueError(
                f"{self.section}.depth_shaping=true needs reward=ratio (got {self.reward!r}): only the ratio "
                "reward splits into per-step terms that sum to the round's reward."
            )

    @property
    def max_depth(self) -> int:
        """The deepest draft the action grid can ask for."""
        return max(self.depths)


def _grid(values, name: str, minimum: int) -> tuple[int, ...]:
    items = tuple(values)
    if not items:
        key = name.rpartition(".")[2]
        raise ValueError(f"{name} is empty; give at least one value, e.g. {key}: [0].")
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
            raise ValueError(f"{name}={list(items)} must hold integers >= {minimum}; {v!r} is not one.")
    if len(set(items)) != len(items):
        raise ValueError(f"{name}={list(items)} repeats a value; each action index must mean one setting.")
    return tuple(int(v) for v in items)


def load_env_config(path: str | None = None, overrides: list[str] | None = None) -> EnvConfig:
    """The ``env:`` section of a YAML config, then ``env.key=value`` overrides (``--set``).

    Other top-level sections belong to other commands and are left alone, so one file (e.g.
    ``configs/eval_tiny_cpu.yaml``) drives ``draftrl collect`` as well as the commands that own
    its other sections; the ``env`` section itself is strict (unknown keys fail), and a top-level
    key no command reads fails too (``draftrl.config.SECTIONS``).
    """
    import yaml

    data: dict[str, Any] = dict(read_env_file(path).get("env") or {}) if path is not None else {}
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip().startswith("env.") or key.count(".") != 1:
            raise ValueError(f"--set {item!r} must look like env.key=value, e.g. env.max_new_tokens=32")
        data[key.strip()[len("env."):]] = yaml.safe_load(raw)
    return from_dict(EnvConfig, data, prefix="env.")
