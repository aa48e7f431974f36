"""The one registry of env variants, ``draftrl/envs/ids.py``: what Gymnasium registers, and what a
training env section passes to each id (``section``, ``takes``), read from the entry, never from
the id's name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import pytest

import draftrl.envs  # noqa: F401  registers the draftrl/* ids
from draftrl.config import load_config, to_dict
from draftrl.config.env import EnvConfig
from draftrl.config.serve import ServeConfig
from draftrl.envs.ids import ENVS, GYM_KEYS, SECTIONS, find, make_kwargs, register_id, section_of
from draftrl.train.config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

#: The arguments each id gets from a section holding every key it needs.
EXPECTED = {
    "draftrl/Analytic-v0": {"alpha", "draft_cost"},
    "draftrl/SpecDecode-v2": {"config"},
    "draftrl/SpecDecodeDepth-v2": {"config", "verify_size"},
    "draftrl/TraceReplay-v1": {"config", "traces"},
    "draftrl/TraceReplayDepth-v1": {"config", "traces", "verify_size"},
    "draftrl/ServeVLLM-v1": {"config"},
    "draftrl/ServeReplay-v1": {"config", "recordings", "calibration", "cost_jitter", "cost_noise", "loads"},
}


def _section(env_id: str) -> dict:
    """A section for ``env_id`` with every required key set (as ``to_dict`` of the typed section holds it)."""
    section = {**to_dict(EnvConfig()), "id": env_id, "traces": "runs/traces/t", "verify_size": 3,
               "analytic": {"alpha": 0.7, "draft_cost": 0.1, "depths": None},
               "serve": {**to_dict(ServeConfig()), "recordings": "rec", "calibration": "costs.json",
                         "cost_jitter": 0.2, "cost_noise": False, "loads": [{"rate": 2.0}]}}
    return section


def test_every_entry_registers_only_gymnasiums_keys():
    for entry in ENVS:
        assert entry["section"] in SECTIONS and isinstance(entry.get("takes", ()), tuple)
        spec = gym.spec(entry["id"])
        assert (spec.entry_point, spec.kwargs, spec.max_episode_steps) == (
            entry["entry_point"], entry.get("kwargs", {}), entry["max_episode_steps"])
        assert set(entry) - set(GYM_KEYS) <= {"section", "takes", "holds_model"}


@pytest.mark.parametrize("env_id", sorted(EXPECTED))
def test_make_kwargs_reads_the_entry(env_id):
    kwargs = make_kwargs(_section(env_id))
    assert set(kwargs) == EXPECTED[env_id]
    if section_of(env_id) == "env":
        assert kwargs["config"] == EnvConfig()
    if section_of(env_id) == "serve":
        assert isinstance(kwargs["config"], ServeConfig) and kwargs["config"].drafter == ServeConfig().drafter
    if "verify_size" in kwargs:
        assert kwargs["verify_size"] == 3
    if env_id == "draftrl/ServeReplay-v1":
        assert (kwargs["recordings"], kwargs["cost_noise"], kwargs["loads"]) == ("rec", False, [{"rate": 2.0}])


def test_the_name_of_an_id_says_nothing():
    """Negative control of the old id-name families: a registered id named like a depth replay id gets
    only what its entry takes, and an id named like nothing gets what its entry says."""
    register_id(id="tests/LooksLikeTraceReplayDepth-v1", entry_point="draftrl.envs.analytic:AnalyticEnv",
                max_episode_steps=8, section="analytic")
    register_id(id="tests/Plain-v0", entry_point="draftrl.envs.spec_decode:SpecDecodeEnv",
                kwargs={"engine": "replay"}, max_episode_steps=8, section="env", takes=("traces", "verify_size"))
    assert set(make_kwargs(_section("tests/LooksLikeTraceReplayDepth-v1"))) == {"alpha", "draft_cost"}
    assert set(make_kwargs(_section("tests/Plain-v0"))) == {"config", "traces", "verify_size"}
    assert gym.spec("tests/Plain-v0").kwargs == {"engine": "replay"}  # section and takes stay draftrl's
    made = gym.make("tests/LooksLikeTraceReplayDepth-v1", **make_kwargs(_section("tests/LooksLikeTraceReplayDepth-v1")))
    assert made.unwrapped.draft_cost == 0.1


def test_unknown_and_unmade_ids_are_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"^depth_env\.id='tests/Nowhere-v0' is not a draftrl env id; .*"
                                         r"register it with draftrl\.envs\.ids\.register_id"):
        make_kwargs({"id": "tests/Nowhere-v0"}, "depth_env")
    with pytest.raises(ValueError, match="is not made from a training env section"):
        make_kwargs({"id": "draftrl/TraceChoice-v0"})
    with pytest.raises(ValueError, match=r"env\.traces is not set; draftrl/TraceReplay-v1 needs traces"):
        make_kwargs({**_section("draftrl/TraceReplay-v1"), "traces": None})
    with pytest.raises(ValueError, match=r"env\.id='tests/Nowhere-v0'"):
        load_config(TrainConfig, None, ["env.id=tests/Nowhere-v0"])
    assert find("draftrl/TraceChoice-v0")["section"] is None


def test_register_id_checks_its_entry():
    entry = dict(entry_point="draftrl.envs.analytic:AnalyticEnv", max_episode_steps=8)
    with pytest.raises(ValueError, match="section='env_config'"):
        register_id(id="tests/Bad-v0", section="env_config", **entry)
    with pytest.raises(ValueError, match="takes="):
        register_id(id="tests/Bad-v0", section="env", takes="traces", **entry)
    with pytest.raises(ValueError, match=r"\['reward_threshold'\]"):
        register_id(id="tests/Bad-v0", section="env", reward_threshold=1.0, **entry)
    with pytest.raises(ValueError, match="draftrl registers that id itself"):
        register_id(id="draftrl/Analytic-v0", section="analytic", **entry)
    with pytest.raises(ValueError, match="is not a draftrl env id"):  # none of the refused ones was recorded
        find("tests/Bad-v0")


@pytest.mark.parametrize("name", ["analytic_regimes.yaml", "cpu_default.yaml", "serve_replay_cpu.yaml"])
def test_a_saved_section_makes_what_training_made(name):
    """A run's config.json section (JSON, read back) gives the same arguments, or the same refusal,
    as the typed section training made its env from."""
    cfg = load_config(TrainConfig, CONFIGS / name)
    for key in ("env", "depth_env", "finetune_env"):
        spec = getattr(cfg, key)
        saved = json.loads(json.dumps(to_dict(spec)))
        try:
            typed = make_kwargs(to_dict(spec), key)
        except ValueError as error:  # e.g. a default depth_env without traces in this config
            with pytest.raises(ValueError, match=re.escape(str(error))):
                make_kwargs(saved, key)
            continue
        assert make_kwargs(saved, key) == typed
