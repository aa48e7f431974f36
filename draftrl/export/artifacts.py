"""Find the files of a trained policy from whatever path the user points at.

``draftrl train --out DIR`` writes the layout of ``draftrl.runs`` (policy, manifest, config,
summary with the final evaluation, checkpoints).

``resolve(path)`` accepts ``DIR``, ``DIR/policy.zip`` or a checkpoint zip and pairs the model
with the statistics saved *with it* (a checkpoint's own VecNormalize file, never the final one).
The files are checked against each other (``draftrl.policies.ppo.check_policy_files``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftrl.runs import (
    POLICY_FILE,
    SUMMARY_FILE,
    is_checkpoint,
    policy_files,
    read_run_config,
    resolved_config,
    run_dir_of,
)


@dataclass
class TrainedPolicy:
    """A trained policy's files and what they say."""

    model_path: Path
    """the SB3 PPO zip"""
    vecnormalize_path: Path | None
    """VecNormalize statistics saved with this model; None when training did not normalise"""
    policy_manifest: dict[str, Any]
    """``policy.json``: kind, env_id, depths, verify_sizes, feature_names, ..."""
    train_config: dict[str, Any] | None
    """the resolved TrainConfig (``config.json``, else the summary's copy); None if neither exists"""
    summary: dict[str, Any] | None
    """``train_summary.json``; None for a checkpoint (its evaluation describes the final policy)"""
    run_dir: Path
    is_checkpoint: bool

    @property
    def kind(self) -> str:
        return str(self.policy_manifest["kind"])

    @property
    def env_id(self) -> str:
        return str(self.policy_manifest.get("env_id", ""))

    @property
    def feature_names(self) -> list[str]:
        return list(self.policy_manifest["feature_names"])

    @property
    def depths(self) -> list[int]:
        return [int(d) for d in self.policy_manifest["depths"]]

    @property
    def verify_sizes(self) -> list[int]:
        return [int(v) for v in self.policy_manifest["verify_sizes"]]

    def evaluation(self, name: str = "ppo") -> dict[str, Any] | None:
        """The summary's evaluation of this policy (``evaluate_policy``'s dict), if any."""
        if self.summary is None:
            return None
        return (self.summary.get("evaluation") or {}).get("results", {}).get(name)

    def sha256(self) -> str:
        return hashlib.sha256(self.model_path.read_bytes()).hexdigest()


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); restore it from the run directory.") from None


def resolve(path: str | Path) -> TrainedPolicy:
    """The trained policy at ``path`` (a run directory, its ``policy.zip``, or a checkpoint zip).

    :raises FileNotFoundError: naming the missing file and what writes it.
    """
    model, vecnorm, manifest_file = policy_files(path)
    if not model.is_file():
        raise FileNotFoundError(
            f"{model} does not exist; point at a run directory written by `draftrl train --out DIR`, "
            f"its {POLICY_FILE}, or a checkpoint zip."
        )
    checkpoint = is_checkpoint(model)
    run_dir = run_dir_of(model)
    if not manifest_file.is_file():
        raise FileNotFoundError(
            f"{manifest_file} does not exist; it holds the policy's grids and feature names and "
            "`draftrl train` writes it when a run completes (finish the run with --resume)."
        )
    from draftrl.policies.ppo import check_policy_files, read_policy_manifest

    manifest = read_policy_manifest(manifest_file)
    summary = _read_json(run_dir / SUMMARY_FILE)
    config = read_run_config(run_dir)
    check_policy_files(manifest, manifest_file, model, vecnorm if vecnorm.is_file() else None, run_config=config)
    if config is None and summary is not None and summary.get("config"):
        config = resolved_config(summary["config"], run_dir)
    return TrainedPolicy(
        model_path=model,
        vecnormalize_path=vecnorm if vecnorm.is_file() else None,
        policy_manifest=manifest,
        train_config=config,
        summary=None if checkpoint else summary,
        run_dir=run_dir,
        is_checkpoint=checkpoint,
    )
