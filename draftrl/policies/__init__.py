"""Drafting policies behind one interface (``Policy``): PPO and the baselines it is compared with.

``act(obs) -> (depth, verify_size)`` values each round, ``reset()`` at episode start,
``observe(info)`` after each round, ``act_step(obs) -> CONTINUE/STOP`` on step-level envs.
``evaluate_policy`` rolls any of them out on the same seeded episodes.
"""

from draftrl.policies.base import CONTINUE, LEVEL_FEATURE, STOP, Policy, env_grids
from draftrl.policies.baselines import ConfidenceThreshold, DynamicSD, Fixed, HFHeuristic, LookAhead, UCBBandit
from draftrl.policies.evaluate import compare, evaluate_policy, paired_difference
from draftrl.policies.ppo import PPOPolicy

__all__ = [
    "CONTINUE",
    "STOP",
    "LEVEL_FEATURE",
    "Policy",
    "env_grids",
    "Fixed",
    "HFHeuristic",
    "ConfidenceThreshold",
    "UCBBandit",
    "DynamicSD",
    "LookAhead",
    "PPOPolicy",
    "evaluate_policy",
    "paired_difference",
    "compare",
]
