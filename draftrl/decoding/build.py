"""Build a :class:`~draftrl.decoding.engine.SpeculativeDecoder` from an ``EnvConfig``: the one place it is done.

Models are never pickled or copied into subprocesses: every engine built in one process with the
same ``(target, dtype, device, kernels)`` gets the same loaded model object
(:func:`draftrl.models.shared_model`), and each caller gets its own engine (engines hold one
request's KV caches, so they are not shared). Vectorise envs with ``gymnasium.vector.SyncVectorEnv``
or SB3's ``DummyVecEnv``; ``AsyncVectorEnv`` / ``SubprocVecEnv`` would load one model per worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftrl.config.env import EnvConfig

if TYPE_CHECKING:
    from draftrl.decoding.engine import SpeculativeDecoder
    from draftrl.models import LoadedModel


def build_engine(config: EnvConfig, target: LoadedModel | None = None, *, max_new_tokens: int = 1,
                 seed: int | None = None, sampler: str = "correct",
                 token_stats: bool | None = None) -> tuple[SpeculativeDecoder, object]:
    """(engine, tokenizer) for ``config``; ``target`` defaults to the shared copy of ``config.target``.

    A separate draft model is loaded once per process too. An env sets the engine's
    ``max_new_tokens`` per episode; ``seed`` (default ``config.seed``, else 0) seeds the sampler.
    ``token_stats`` (default ``config.monitor``): compute the per-token exactness statistics a
    monitor reads (``EngineConfig.token_stats``); a caller that runs its own monitor over an env
    built with ``monitor=False`` (the evaluation, the grid) turns them on.
    """
    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.drafters.registry import build_drafter, check_drafter_spec
    from draftrl.models import check_model_spec, shared_model

    if target is None:
        check_model_spec(config.target, "EnvConfig.target")
    check_drafter_spec(config.drafter)
    check_draft_device(config)
    target = target if target is not None else load_target(config)
    drafter = build_drafter(config.drafter, target, sampled=config.draft_sampling, dtype=config.dtype,
                            device=draft_device(config),
                            load=lambda spec, dtype, device: shared_model(spec, dtype, device, config.kernels))
    engine_config = EngineConfig(
        max_new_tokens=max_new_tokens,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        seed=(config.seed or 0) if seed is None else seed,
        keyed=config.keyed,
        max_depth=max(16, config.max_depth),
        max_width=max(16, config.width),
        sampler=sampler,
        token_stats=config.monitor if token_stats is None else token_stats,
        compile=config.compile,
    )
    eos = [] if config.ignore_eos else target.eos_token_ids
    engine = SpeculativeDecoder(target.model, drafter, engine_config, eos_token_ids=eos)
    return engine, target.tokenizer


#: drafters with no weights of their own (n-gram lookup, none) or the target's (layerskip, self):
#: ``env.draft_device`` places nothing for them
NO_OWN_WEIGHTS = ("none", "ngram", "layerskip", "self")


def load_target(config: EnvConfig, *, shared: bool = True) -> LoadedModel:
    """``config``'s target on ``config.device``, or split over devices by ``config.device_map`` /
    ``config.max_memory`` (:mod:`draftrl.models.placement`); loaded once per process unless not
    ``shared`` (a one-shot command reads the folder as it is now)."""
    from draftrl.models import load_model, shared_model
    from draftrl.models.placement import check_main_device, model_devices

    if not shared:
        def load(spec, dtype, device, kernels, **placement):
            return load_model(spec, dtype=dtype, device=device, kernels=kernels, **placement)
    else:
        load = shared_model
    if config.device_map is None:
        return load(config.target, config.dtype, config.device, config.kernels)
    if isinstance(config.device_map, dict):  # before loading; a preset is checked once it has placed the model
        check_main_device(config.device, config.device_map.values(), config.section)
    loaded = load(config.target, config.dtype, config.device, config.kernels, device_map=config.device_map,
                  max_memory=config.max_memory, mixed_devices=config.mixed_devices)
    check_main_device(config.device, model_devices(loaded.model), config.section)
    return loaded


def check_draft_device(config: EnvConfig) -> None:
    """Refuse, before anything loads, an ``env.draft_device`` this machine lacks or that places nothing."""
    if config.draft_device is None:
        return
    from draftrl.models.placement import check_placement

    kind = config.drafter.partition(":")[0]
    if kind in NO_OWN_WEIGHTS:
        raise ValueError(f"{config.section}.draft_device={config.draft_device!r} places a drafter's own weights; "
                         f"drafter {config.drafter!r} has none of its own: drop draft_device.")
    check_placement(config.draft_device, f"{config.section}.draft_device")


def draft_device(config: EnvConfig) -> str:
    """Where the drafter's own weights go: ``env.draft_device``, else ``env.device`` (with a split
    target, the device of its inputs and logits: :func:`load_target` checks it holds part of it)."""
    return config.draft_device if config.draft_device is not None else config.device
