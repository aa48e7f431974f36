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
