"""The draftrl gymnasium ids and their ``register`` arguments, defined once.

Two callers register them: ``import draftrl.envs``, and, in an interpreter that has not imported
draftrl, the start-up hook ``_draftrl_gym`` (``draftrl_gym.pth``) right after gymnasium's
registry module loads. The hook loads this file by path, so it must import nothing: entry points
are strings, and ``gymnasium.make`` imports an env's module only when that env is made. Time
limits live here (``max_episode_steps``), not in ``step``.
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
    dict(id="draftrl/SpecDecode-v0", entry_point="draftrl.envs.spec_decode:SpecDecodeEnv", max_episode_steps=1024,
         nondeterministic=True),
    # One step per draft level: a round is at most max(depths) + 1 steps.
    dict(id="draftrl/SpecDecodeDepth-v0", entry_point="draftrl.envs.spec_decode_depth:SpecDecodeDepthEnv",
         max_episode_steps=16384, nondeterministic=True),
    # Recorded greedy traces with seconds from a cost table: deterministic given the seed.
    dict(id="draftrl/TraceReplay-v0", entry_point="draftrl.envs.trace_replay:TraceReplayEnv", max_episode_steps=1024),
    # Per-level CONTINUE/STOP on recorded traces (SpecDecodeDepth-v0 at replay speed).
    dict(id="draftrl/TraceReplayDepth-v0", entry_point="draftrl.envs.trace_replay_depth:TraceReplayDepthEnv",
         max_episode_steps=16384),
    # A serving engine under load (vLLM in-process by default): one step = one engine step over the
    # batch; wall-clock rewards.
    dict(id="draftrl/ServeVLLM-v0", entry_point="draftrl.envs.serve_vllm:ServeVLLMEnv", max_episode_steps=8192,
         nondeterministic=True),
    # ServeVLLM-v0 simulated: recorded greedy continuations, recomputed drafts, a calibrated step cost.
    dict(id="draftrl/ServeReplay-v0", entry_point="draftrl.envs.serve_replay:ServeReplayEnv", max_episode_steps=8192),
)


def register_all(registry: dict[str, Any], register: Callable[..., Any]) -> None:
    """``register(**kwargs)`` for every id of :data:`ENVS` not in ``registry`` yet (the start-up hook
    may have registered them first; registering again would warn "Overriding environment")."""
    for kwargs in ENVS:
        if kwargs["id"] not in registry:
            register(**kwargs)
