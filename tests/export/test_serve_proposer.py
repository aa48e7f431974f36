"""A serving-env policy exported for vLLM, without vLLM (tests/real_vllm/test_serve_export_real.py
runs it in vLLM): the proposer's observation equals the env's, feature for feature, on the same
batch sequence; it never drafts past the policy's depth or budget; ``draftrl export --format vllm``
writes its bundle, and a refused export leaves ``--out`` untouched."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from draftrl.cli import main
from draftrl.config.serve import ServeConfig
from draftrl.decoding.vllm import engine as engine_module
from draftrl.decoding.vllm.proposer import CONFIG_ENV, DraftrlProposer
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.export.features import serving_entry
from draftrl.export.vllm_serve_proposer import CLASS_PATH, ServePolicyProposer
from draftrl.signals.serving import FEATURE_NAMES

from scripted_vllm import Clock, ScriptedLLM, ScriptedTokenizer, ScriptedVLLMEngine, fake_vllm_config

CONFIG = ServeConfig(chat_template=False, shuffle=False, seed=0, num_requests=7, concurrency=3, max_new_tokens=24,
                     depths=(0, 2, 4), budgets=(0, 3, 8, 64), max_num_seqs=16)


class Scripted:
    """A controller that answers ``actions`` in order, keeping the observations it was asked about."""

    kind = "size"

    def __init__(self, entry: dict, actions):
        self.manifest, self.feature_names = {"features": entry}, list(FEATURE_NAMES)
        self.actions, self.seen = actions, []

    def act(self, obs):
        self.seen.append(np.array(obs))
        return self.actions(obs) if callable(self.actions) else self.actions[len(self.seen) - 1]


def entry_for(config: ServeConfig) -> dict:
    import dataclasses

    return serving_entry({"env": {"id": "draftrl/ServeVLLM-v0", "serve": dataclasses.asdict(config)}},
                         "draftrl/ServeVLLM-v0", list(FEATURE_NAMES))


def run_env(engine, config, choose):
    """An episode of ServeVLLM-v0 over ``engine``: (observations, (depth, budget) per step)."""
    env = ServeVLLMEnv(config, engine=engine, tokenizer=ScriptedTokenizer())
    obs, _ = env.reset(seed=0)
    observations, actions = [obs], []
    done = False
    while not done:
        action = choose(len(actions))
        actions.append((env.depths[action[0]], env.budgets[action[1]]))
        obs, _, done, truncated, _ = env.step(action)
        observations.append(obs)
        done = done or truncated
    return observations, actions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exported_proposer_observes_what_the_env_observes(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    script = [np.array([rng.integers(3), rng.integers(4)]) for _ in range(400)]
    # the in-process driver: VLLMEngine.step + DraftrlProposer keyed by request id, the env's features
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(perf_counter=clock, thread_time=time.thread_time))
    driver = ScriptedVLLMEngine(DraftrlProposer(fake_vllm_config(4)), clock)
    expected, actions = run_env(driver, CONFIG, lambda k: script[k])
    # the exported proposer alone (keyed by content, as under vllm serve), its own clock, the same actions
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(perf_counter=clock, thread_time=time.thread_time))
    controller = Scripted(entry_for(CONFIG), actions)
    proposer = ServePolicyProposer(fake_vllm_config(4), controller=controller, clock=clock)
    run_env(ScriptedVLLMEngine(proposer, clock, attach_runner=False), CONFIG, lambda k: np.array([0, 0]))
    assert len(controller.seen) == len(actions) > 20  # one observation per engine step, before it drafts
    got = np.stack(controller.seen)
    want = np.stack(expected[: len(actions)])
    for i, name in enumerate(FEATURE_NAMES):
        np.testing.assert_allclose(got[:, i], want[:, i], rtol=1e-6, atol=1e-7, err_msg=name)
    assert want[:, FEATURE_NAMES.index("accept_mean")].max() > 0 and want[:, FEATURE_NAMES.index("running")].max() > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_proposer_never_drafts_past_the_policy_depth_or_budget(seed):
    rng = np.random.default_rng(seed)
    chosen = []

    def pick(obs):
        chosen.append((int(rng.choice(CONFIG.depths)), int(rng.choice(CONFIG.budgets))))
        return chosen[-1]

    proposer = ServePolicyProposer(fake_vllm_config(4), controller=Scripted(entry_for(CONFIG), pick), clock=Clock())
    llm = ScriptedLLM(proposer, Clock(), max_num_seqs=8)
    for i in range(12):
        llm.add_request(str(i), list(range(10 + i, 30 + i)) * 2, 20 + i)
    while llm.has_unfinished_requests():
        llm.step()
    assert len(chosen) == len(llm.drafts_per_step)
    drafted = 0
    for (depth, budget), drafts in zip(chosen, llm.drafts_per_step):
        assert sum(map(len, drafts)) <= budget and max(map(len, drafts), default=0) <= depth
        drafted += sum(map(len, drafts))
    assert drafted > 0 and any(sum(map(len, d)) == b > 0 for (_, b), d in zip(chosen, llm.drafts_per_step))


def test_export_writes_a_serving_bundle_that_runs(serve_run, tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    assert main(["export", str(serve_run), "--format", "vllm", "--out", str(out), "--check-observations", "64"]) == 0
    bundle = json.loads((out / "vllm.json").read_text())
    assert bundle["speculative_config"] == {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": 8}
    proposer_json = json.loads((out / "proposer.json").read_text())
    assert proposer_json == {"policy": "policy.onnx", "depth": 8, "rule": "match", "drafter": "ngram:1:3:latest"}
    manifest = json.loads((out / "policy.onnx.json").read_text())
    assert manifest["features"]["builder"] == "draftrl.signals.serving.ServingFeatures"
    assert manifest["features"]["settings"] == {"max_num_seqs": 16, "max_model_len": 1024, "max_depth": 8,
                                                "max_budget": 128, "ema_decay": 0.8}
    # vLLM builds the class from the config file alone (run from the bundle folder, whose paths are
    # relative to it); the policy's actions bound every step's drafts
    assert bundle["env"] == {"DRAFTRL_PROPOSER_CONFIG": "proposer.json"}
    for key, value in bundle["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(out)
    proposer = ServePolicyProposer(fake_vllm_config(8))
    chosen = []
    act = proposer.controller.act
    proposer.controller.act = lambda obs: chosen.append(act(obs)) or chosen[-1]
    llm = ScriptedLLM(proposer, Clock(), max_num_seqs=4)
    for i in range(6):
        llm.add_request(str(i), list(range(10 + i, 30 + i)) * 2, 16)
    while llm.has_unfinished_requests():
        llm.step()
    assert chosen and all(d in (0, 2, 8) and b in (0, 4, 128) for d, b in chosen)
    for (depth, budget), drafts in zip(chosen, llm.drafts_per_step):
        assert sum(map(len, drafts)) <= budget and max(map(len, drafts), default=0) <= depth


def test_a_refused_export_leaves_out_untouched(analytic_run, serve_run, tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["export", str(analytic_run), "--format", "vllm", "--out", str(out)]) != 0
    assert "cannot drive an engine" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing written, no staging folder left
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    assert main(["export", str(serve_run), "--format", "vllm", "--out", str(out), "--budget", "4"]) != 0
    assert "drop --budget" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_proposer_without_its_config_is_one_line(monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    with pytest.raises(ValueError, match="DRAFTRL_PROPOSER_CONFIG"):
        ServePolicyProposer(fake_vllm_config(4))


def test_the_manifest_names_the_envs_drafter_and_refuses_a_head():
    """The exported serving proposer drafts with the env's drafter (``env.serve.drafter``); one that
    runs an EAGLE-3 head, which that proposer does not, is refused naming the head rule bundle."""
    assert entry_for(ServeConfig(drafter="ngram:1:4:latest"))["drafter"] == "ngram:1:4:latest"
    with pytest.raises(ValueError, match=r"env.serve.drafter='eagle3'.*draftrl export fixed:K@eagle3") as err:
        entry_for(ServeConfig(drafter="eagle3"))
    assert "\n" not in str(err.value)
