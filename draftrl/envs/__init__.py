"""Gymnasium environments: round results in, observations and rewards out; no model code.

Importing this package registers every draftrl env id (``draftrl.envs.ids``). Registration
names an entry-point string, so it imports neither torch nor transformers: ``gymnasium.make``
imports an env's module only when that env is made. An installed draftrl also registers the ids
in interpreters that never import it, as soon as gymnasium's registry loads (the start-up hook
``_draftrl_gym``), so ``gym.make("draftrl/SpecDecode-v0")`` works without ``import draftrl``.
"""

from gymnasium.envs.registration import register, registry

from draftrl.envs.ids import register_all

register_all(registry, register)
