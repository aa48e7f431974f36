"""Gymnasium environments: round results in, observations and rewards out; no model code.

Importing this package registers every draftrl env id (``draftrl.envs.ids``), the way Gymnasium
1.x documents for third-party envs::

    import gymnasium as gym
    import draftrl.envs
    gym.register_envs(draftrl.envs)   # optional: keeps linters from dropping the import
    env = gym.make("draftrl/SpecDecode-v2")
    env = gym.make("draftrl.envs:draftrl/SpecDecode-v2")   # the same, with no import beforehand

Registration names an entry-point string, so it imports neither torch nor transformers:
``gymnasium.make`` imports an env's module only when that env is made.
"""

from gymnasium.envs.registration import register, registry

from draftrl.envs.ids import register_all

register_all(registry, register)
