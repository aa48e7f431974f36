"""Registers ``tests/AnalyticDepth-v0`` (:mod:`analytic_depth`) for the depth recipes' fast tests.

The env lives in a module of its own name: ``SubprocVecEnv``'s processes unpickle its class by module
name, and every test folder's conftest is a module named ``conftest``.
"""

from __future__ import annotations

from analytic_depth import AnalyticDepthEnv

from draftrl.envs.ids import register_id

# made from a training section like Analytic-v0 (env.analytic.*), plus the depth envs' verify_size
register_id(id="tests/AnalyticDepth-v0", entry_point=AnalyticDepthEnv, max_episode_steps=16384, section="analytic",
            takes=("verify_size",))
