"""The draftrl gymnasium ids and their ``register`` arguments, defined once.

``import draftrl.envs`` registers them. Entry points are strings, so this module imports nothing
and ``gymnasium.make`` imports an env's module only when that env is made. Time limits live here
(``max_episode_steps``), not in ``step``. An id's version goes up whenever its reward or spaces
change (its env's docstring keeps the Version History). One env class per control level; a
variant is a registration with ``kwargs`` (Gymnasium's ``LunarLanderContinuous`` pattern): the
replayed ids are the live envs' classes with ``kwargs={"engine": "replay"}``.
"""

from __future__ import annotations

from typing import Any, Callable

#: ``gymnasium.register`` keyword arguments of every draftrl id.
ENVS: tuple[dict[str, Any], ...] = (
    # The article's analytic model (numpy only). Every round emits >= 1 token, so 1024 rounds never
    # truncate an episode of max_new_tokens <= 1024 (default 256); the limit is a safety net.
    dict(id="draftrl/Analytic-v0", entry_point="draftrl.envs.analytic:AnalyticEnv", max_episode_steps=1024),
    # The real engine (torch + transformers, imported only when made). Rewards are wall clock, so
    # the ids are marked nondeterministic (gymnasium's checker then skips step determinism).
    dict(id="draftrl/SpecDecode-v1", entry_point="draftrl.envs.spec_decode:SpecDecodeEnv", max_episode_steps=1024,
         nondeterministic=True),
    # One step per draft level: a round is at most max(depths) + 1 steps.
    dict(id="draftrl/SpecDecodeDepth-v1", entry_point="draftrl.envs.spec_decode_depth:SpecDecodeDepthEnv",
         max_episode_steps=16384, nondeterministic=True),
    # SpecDecode-v1 over the replay of recorded greedy traces, seconds from a cost table: deterministic
    # given the seed.
    dict(id="draftrl/TraceReplay-v0", entry_point="draftrl.envs.spec_decode:SpecDecodeEnv", kwargs={"engine": "replay"},
         max_episode_steps=1024),
    # Per-level CONTINUE/STOP on recorded traces (SpecDecodeDepth-v1 at replay speed).
    dict(id="draftrl/TraceReplayDepth-v0", entry_point="draftrl.envs.spec_decode_depth:SpecDecodeDepthEnv",
         kwargs={"engine": "replay"}, max_episode_steps=16384),
    # Per-round (drafter, depth) over several drafters' traces: deterministic given the seed.
    dict(id="draftrl/TraceChoice-v0", entry_point="draftrl.envs.trace_choice:TraceChoiceEnv", max_episode_steps=1024),
    # A serving engine under load (vLLM in-process by default): one step = one engine step over the
    # batch; wall-clock rewards.
    dict(id="draftrl/ServeVLLM-v0", entry_point="draftrl.envs.serve_vllm:ServeVLLMEnv", max_episode_steps=8192,
         nondeterministic=True),
    # ServeVLLM-v0 over its replay: recorded greedy continuations, recomputed drafts, a calibrated step cost.
    dict(id="draftrl/ServeReplay-v0", entry_point="draftrl.envs.serve_vllm:ServeVLLMEnv", kwargs={"engine": "replay"},
         max_episode_steps=8192),
)


def register_all(registry: dict[str, Any], register: Callable[..., Any]) -> None:
    """``register(**kwargs)`` for every id of :data:`ENVS` not in ``registry`` yet (a reloaded
    ``draftrl.envs`` registers nothing twice: gymnasium would warn "Overriding environment")."""
    for kwargs in ENVS:
        if kwargs["id"] not in registry:
            register(**kwargs)
