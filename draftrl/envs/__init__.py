"""Gymnasium environments: round results in, observations and rewards out; no model code.

Importing this package (``import draftrl`` does) registers every draftrl env id. Registration
names an entry-point string, so it imports neither torch nor transformers: ``gymnasium.make``
imports an env's module only when that env is made. One ``register`` call per env; time limits
live here (``max_episode_steps``), not in ``step``.
"""

from gymnasium.envs.registration import register

# The article's analytic model (numpy only). Every round emits >= 1 token, so 1024 rounds never
# truncate an episode of max_new_tokens <= 1024 (default 256); the limit is a safety net.
register(
    id="draftrl/Analytic-v0",
    entry_point="draftrl.envs.analytic:AnalyticEnv",
    max_episode_steps=1024,
)

# The real engine (torch + transformers, imported only when made). Rewards are wall clock, so
# the ids are marked nondeterministic (gymnasium's checker then skips step determinism).
register(
    id="draftrl/SpecDecode-v0",
    entry_point="draftrl.envs.spec_decode:SpecDecodeEnv",
    max_episode_steps=1024,
    nondeterministic=True,
)
# One step per draft level: a round is at most max(depths) + 1 steps.
register(
    id="draftrl/SpecDecodeDepth-v0",
    entry_point="draftrl.envs.spec_decode_depth:SpecDecodeDepthEnv",
    max_episode_steps=16384,
    nondeterministic=True,
)
# Recorded greedy traces with seconds from a cost table: deterministic given the seed.
register(
    id="draftrl/TraceReplay-v0",
    entry_point="draftrl.envs.replay:TraceReplayEnv",
    max_episode_steps=1024,
)
# Per-level CONTINUE/STOP on recorded traces (SpecDecodeDepth-v0 at replay speed).
register(
    id="draftrl/TraceReplayDepth-v0",
    entry_point="draftrl.envs.replay_depth:TraceReplayDepthEnv",
    max_episode_steps=16384,
)
# A serving engine under load (vLLM in-process by default): one step = one engine step over the
# batch; wall-clock rewards.
register(
    id="draftrl/ServeVLLM-v0",
    entry_point="draftrl.envs.serve:ServeVLLMEnv",
    max_episode_steps=8192,
    nondeterministic=True,
)
# ServeVLLM-v0 simulated: recorded greedy continuations, recomputed drafts, a calibrated step cost.
register(
    id="draftrl/ServeReplay-v0",
    entry_point="draftrl.envs.serve_replay:ServeReplayEnv",
    max_episode_steps=8192,
)
