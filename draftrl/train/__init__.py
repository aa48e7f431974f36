"""Training recipes, one readable script each (CleanRL style), sharing ``TrainConfig``.

- ``ppo_size``: PPO choosing ``(depth, verify_size)`` every round (round-level envs).
- ``ppo_depth``: PPO choosing CONTINUE/STOP after every draft step (``draftrl/SpecDecodeDepth-v2``).
- ``cotrain``: Learning to Draft's alternating co-training of the two.

``draftrl train --config configs/NAME.yaml --out DIR`` runs ``draftrl.train.<recipe>.train``.
"""

from draftrl.train.config import PPOConfig, TrainConfig, TrainEnvConfig, WandbConfig

__all__ = ["PPOConfig", "TrainConfig", "TrainEnvConfig", "WandbConfig"]
