"""Build the decoding engine an env drives, sharing loaded models within a process.

Models are never pickled or copied into subprocesses: every env made in one process with the
same ``(target, dtype, device)`` gets the same loaded model object, and each env gets its own
:class:`~draftrl.decoding.engine.SpeculativeDecoder` (engines hold one request's KV caches, so
they are not shared). Vectorise with ``gymnasium.vector.SyncVectorEnv`` or SB3's
``DummyVecEnv``; ``AsyncVectorEnv`` / ``SubprocVecEnv`` would load one model per worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftrl.config.env import EnvConfig

if TYPE_CHECKING:
    from draftrl.decoding.engine import SpeculativeDecoder
    from draftrl.models import LoadedModel

_LOADED: dict[tuple[str, str, str, str | None], "LoadedModel"] = {}


def shared_model(spec: str, dtype: str = "float32", device: str = "cpu", kernels: str | None = None) -> "LoadedModel":
    """``draftrl.models.load_model(spec)``, loaded once per process and then reused. Its few-token
    kernels are chosen at the first load, for the torch thread count set at that time."""
    from draftrl.models import load_model

    key = (spec, dtype, device, kernels)
    if key not in _LOADED:
        _LOADED[key] = load_model(spec, dtype=dtype, device=device, kernels=kernels)
    return _LOADED[key]


def build_engine(config: EnvConfig, target: "LoadedModel | None" = None, *, max_new_tokens: int = 1,
                 seed: int | None = None, sampler: str = "correct",
                 token_stats: bool | None = None) -> "tuple[SpeculativeDecoder, object]":
    """(engine, tokenizer) for ``config``; ``target`` defaults to the shared copy of ``config.target``.

    A separate draft model is loaded once per process too. An env sets the engine's
    ``max_new_tokens`` per episode; ``seed`` (default ``config.seed``, else 0) seeds the sampler.
    ``token_stats`` (default ``config.monitor``): compute the per-token exactness statistics a
    monitor reads (``EngineConfig.token_stats``); a caller that runs its own monitor over an env
    built with ``monitor=False`` (the evaluation, the grid) turns them on.
    """
    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.drafters.registry import build_drafter, check_drafter_spec
    from draftrl.models import check_model_spec

    if target is None:
        check_model_spec(config.target, "EnvConfig.target")
    check_drafter_spec(config.drafter)
    target = target if target is not None else shared_model(config.target, config.dtype, config.device,
                                                                  config.kernels)
    drafter = build_drafter(config.drafter, target, sampled=config.draft_sampling, dtype=config.dtype,
                            device=config.device,
                            load=lambda spec, dtype, device: shared_model(spec, dtype, device, config.kernels))
    engine_config = EngineConfig(
        max_new_tokens=max_new_tokens,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        seed=(config.seed or 0) if seed is None else seed,
        max_depth=max(16, config.max_depth),
        max_width=max(16, config.width),
        sampler=sampler,
        token_stats=config.monitor if token_stats is None else token_stats,
        compile=config.compile,
    )
    eos = [] if config.ignore_eos else target.eos_token_ids
    engine = SpeculativeDecoder(target.model, drafter, engine_config, eos_token_ids=eos)
    return engine, target.tokenizer


def check_engine(config: EnvConfig, engine: "SpeculativeDecoder") -> None:
    """Refuse an engine whose sampling or limits contradict the env config."""
    ec = engine.config
    for name in ("temperature", "top_k", "top_p"):
        if getattr(ec, name) != getattr(config, name):
            raise ValueError(
                f"engine {name}={getattr(ec, name)!r} differs from EnvConfig.{name}={getattr(config, name)!r}; "
                "build the engine from the same config with draftrl.envs.engines.build_engine(config, target)."
            )
    if config.max_depth > ec.max_depth:
        raise ValueError(
            f"EnvConfig.depths reach {config.max_depth} but the engine allows max_depth={ec.max_depth}; "
            "raise EngineConfig.max_depth or shrink the action space."
        )
    if config.width > ec.max_width:
        raise ValueError(f"EnvConfig.width={config.width} exceeds EngineConfig.max_width={ec.max_width}.")
    if max(config.verify_sizes) > ec.max_verify_size:
        raise ValueError(
            f"EnvConfig.verify_sizes reach {max(config.verify_sizes)} but EngineConfig.max_verify_size="
            f"{ec.max_verify_size}; raise it or shrink the action space."
        )
    if config.monitor and not ec.token_stats:
        raise ValueError("EnvConfig.monitor=True needs the engine's per-token statistics but it was built with "
                         "EngineConfig.token_stats=False; build it with token_stats=True or set monitor=False.")
    if config.max_depth > 0 and engine.drafter is None:
        raise ValueError(f"EnvConfig.depths={list(config.depths)} need a drafter but the engine has none; "
                         "use depths: [0] or a drafter.")
