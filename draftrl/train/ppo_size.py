"""Recipe ``ppo_size``: one PPO policy choosing ``(depth, verify_size)`` every round.

Reads top to bottom like CleanRL's ``ppo.py``, with SB3 doing the PPO:

1. open (or resume) the run directory and its wandb run;
2. phases: the main phase on ``cfg.env`` (trace replay, or the analytic model) up to
   ``total_timesteps``, then optionally ``finetune_real_timesteps`` more on ``cfg.finetune_env``
   (the real engine), both counted by the same step counter;
3. PPO ("MlpPolicy" over the flat observation, ``MultiDiscrete([len(depths), len(verify_sizes)])``
   actions) from scratch or from the newest checkpoint, VecNormalize statistics included;
4. save ``policy.zip`` + ``vecnormalize.pkl`` + ``policy.json``;
5. evaluate the saved policy, every fixed setting and the baselines on the same seeded episodes
   and write ``train_summary.json``.

Run it with ``draftrl train --config configs/analytic_regimes.yaml --out runs/analytic``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from draftrl.train.config import TrainConfig
from draftrl.train.loop import run_recipe


def train(
    cfg: TrainConfig, out: str | Path, resume: bool = False, callbacks: Sequence[BaseCallback] = ()
) -> dict[str, Any] | None:
    """Train, save and evaluate a size policy in ``out``.

    :param cfg: the resolved config.
    :param out: run directory (created; a fresh run refuses one that holds a run).
    :param resume: continue the run in ``out`` from its newest checkpoint, same run id.
    :param callbacks: extra SB3 callbacks; one returning False stops the session early (the run
        stays resumable).
    :return: the training summary, or None when the session stopped before the last phase's end.
    """
    return run_recipe(cfg, out, kind="size", spec=cfg.env, finetune_spec=cfg.finetune_env, resume=resume,
                      callbacks=callbacks)
