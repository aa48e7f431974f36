"""``TrainEnvConfig``: a training env section, ``EnvConfig``'s fields plus the env id and its id's own arguments.

``draftrl train`` reads the same ``env.*`` keys as every decoding command (``env.target``,
``env.depths``, ``--target``...), plus what only training needs: which gymnasium id to make
(``env.id``), the arguments of ids that are not driven by an :class:`EnvConfig` (``env.traces``,
``env.analytic.*``, ``env.serve.*``) and the evaluation env's overrides (``env.eval``).

Which of them an id takes is its registry entry's (``draftrl.envs.ids.ENVS``: ``section`` and
``takes``), not its name's: ``draftrl.envs.ids.make_kwargs`` turns a section into
``gymnasium.make`` arguments, here for training and from a run's saved section for ``draftrl
export`` and ``draftrl eval``, so all three make a run's env the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from draftrl.config import from_dict
from draftrl.config.env import EnvConfig
from draftrl.config.serve import ServeConfig
from draftrl.envs.ids import section_of


@dataclass
class AnalyticEnvConfig:
    """Arguments of ``draftrl/Analytic-v0`` (``draftrl.envs.analytic.AnalyticEnv``); None = the env's default."""

    alpha: float | None = None
    """acceptance probability (not with regimes)"""
    regimes: list[float] | None = None
    """acceptance probability of each regime"""
    regime_switch: float | list[list[float]] | None = None
    """per-round probability of another regime, or a row-stochastic matrix"""
    draft_cost: float | None = None
    """one draft step, in target steps"""
    verify_cost: float | dict[int, float] | None = None
    """g(n) for n verified tokens, in target steps: a number or {n: cost}"""
    depths: list[int] | None = None
    verify_sizes: list[int] | None = None
    max_new_tokens: int | None = None
    stochastic: bool | None = None
    """sample acceptances; false emits expected values"""
    reward: str | None = None
    rho: float | None = None
    rho_rate: float | None = None
    signal_noise: float | None = None
    accept_window: int | None = None
    ema_decay: float | None = None

    def kwargs(self) -> dict[str, Any]:
        """The arguments that are set."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass
class ServeEnvConfig(ServeConfig):
    """``draftrl/ServeVLLM-v1``'s ``ServeConfig`` fields, and ``draftrl/ServeReplay-v1``'s recordings and costs."""

    section: ClassVar[str] = "env.serve"

    recordings: str | None = None
    """ServeReplay-v1: a directory from draftrl collect --engine vllm"""
    calibration: str | None = None
    """ServeReplay-v1: the JSON from draftrl calibrate --engine vllm"""
    cost_jitter: float = 0.0
    """ServeReplay-v1: lognormal sigma of per-episode factors on the step-cost coefficients (0 = none)"""
    cost_noise: bool = True
    """ServeReplay-v1: add the calibration's residual noise to every step"""
    loads: list[dict[str, Any]] = field(default_factory=list)
    """ServeReplay-v1: each episode draws one of these arrival settings (e.g. {arrival: poisson, rate: 4.0})"""

    def serve_config(self) -> ServeConfig:
        """The ``ServeConfig`` part."""
        return ServeConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ServeConfig)})


@dataclass
class TrainEnvConfig(EnvConfig):
    """The env a training phase makes: an id, the EnvConfig fields, the id's own arguments.

    Each config section has its own subclass (``DepthTrainEnvConfig``, ``FinetuneTrainEnvConfig``, see
    ``ENV_SECTIONS``), so errors name the section the bad key is in."""

    id: str = "draftrl/TraceReplay-v1"
    """gymnasium id: draftrl/TraceReplay-v1 (recorded traces), draftrl/Analytic-v0, draftrl/SpecDecode-v2, ..."""
    traces: str | None = None
    """TraceReplay ids: a directory from draftrl collect (recorded with the same target, drafter, width)"""
    verify_size: int = 0
    """depth ids: the verify size at STOP when no size policy picks it (0 = every drafted node)"""
    analytic: AnalyticEnvConfig = field(default_factory=AnalyticEnvConfig)
    """Analytic ids: the analytic model's arguments"""
    serve: ServeEnvConfig = field(default_factory=ServeEnvConfig)
    """Serve ids: the serving env's settings"""
    eval: dict[str, Any] = field(default_factory=dict)
    """keys of this section that differ for the final evaluation (e.g. {traces: held-out traces})"""

    def __post_init__(self) -> None:
        super().__post_init__()
        kind = section_of(self.id, f"{self.section}.id")
        default = EnvConfig()
        if kind != "env":
            changed = [f.name for f in dataclasses.fields(EnvConfig)
                       if getattr(self, f.name) != getattr(default, f.name)]
            if changed:
                name, section = changed[0], self.section
                raise ValueError(f"{section}.{name} is not an argument of {self.id}; set {section}.{kind}.{name} "
                                 f"(its arguments are {section}.{kind}.*).")
        if self.eval:
            self.evaluation()  # unknown or ill-typed keys fail now, not after training

    @classmethod
    def moved_key(cls, data: dict[str, Any], key: str, prefix: str) -> str | None:
        """Where a key of the section's old shape ``{id, kwargs, eval_kwargs}`` went, for the error."""
        if key not in ("kwargs", "eval_kwargs"):
            return None
        value = data[key]
        inner = next(iter(value), None) if isinstance(value, dict) else None
        try:
            kind = section_of(data.get("id", cls.id))
        except ValueError:
            kind = None
        kind_fields = {f.name for f in dataclasses.fields(AnalyticEnvConfig if kind == "analytic" else ServeEnvConfig)}
        section = f"{kind}." if kind != "env" and kind is not None and inner in kind_fields else ""
        new = f"{prefix}eval." if key == "eval_kwargs" else prefix
        if inner is None:
            return f"{prefix}{key} is gone: its keys are {new}* now"
        return f"{prefix}{key}.{inner} is now {new}{section}{inner}"

    def env_config(self) -> EnvConfig:
        """The EnvConfig fields, as the env reads them."""
        return EnvConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EnvConfig)})

    def evaluation(self) -> TrainEnvConfig:
        """The section of the final evaluation's env: this one with ``eval``'s keys on top.

        The fields' own checks name ``section.key``; a bad value here came from the eval block
        (the section itself was checked when it was built), so the error names ``section.eval.key``."""
        prefix = f"{self.section}.eval."
        try:
            return from_dict(type(self), self.eval, prefix=prefix, base=dataclasses.replace(self, eval={}))
        except ValueError as error:
            message = str(error)
            if prefix in message:
                raise
            raise ValueError(message.replace(f"{self.section}.", prefix, 1)) from None


@dataclass
class DepthTrainEnvConfig(TrainEnvConfig):
    """The step-level env of depth policies (a section of its own so that its id defaults right)."""

    section: ClassVar[str] = "depth_env"
    id: str = "draftrl/TraceReplayDepth-v1"
    """draftrl/TraceReplayDepth-v1 (recorded traces) or draftrl/SpecDecodeDepth-v2 (real engine)."""


@dataclass
class FinetuneTrainEnvConfig(TrainEnvConfig):
    """The real-engine env of the fine-tuning phase."""

    section: ClassVar[str] = "finetune_env"
    id: str = "draftrl/SpecDecode-v2"
    """draftrl/SpecDecode-v2 (size policies) or draftrl/SpecDecodeDepth-v2 (depth policies)."""


#: The training config's env sections, each with its spec class (its default id, its name in errors).
ENV_SECTIONS: dict[str, type[TrainEnvConfig]] = {"env": TrainEnvConfig, "depth_env": DepthTrainEnvConfig,
                                                  "finetune_env": FinetuneTrainEnvConfig}
