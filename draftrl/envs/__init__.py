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
