"""Exported policies as controllers of draftrl's vLLM proposer, driven with vLLM's ``propose``
arguments and no vLLM (tests/real_vllm/test_serve_export_real.py and tests/export/test_vllm_bundle.py
start them in vLLM):

- ``BatchPolicyControl`` (a serving-env policy): the observation it builds equals the env's, feature
  for feature, on the same batch sequence; its drafts never pass the policy's depth or budget;
  ``draftrl export --format vllm`` writes its bundle, and a refused export leaves ``--out`` untouched;
- ``RequestPolicyControl`` (a per-request policy): each request keeps its features across steps and
  row moves (the proposer's request keys), a new request starts fresh, the per-batch cap holds;
- bundles of earlier releases name classes that are gone: importing them says what to do.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scripted_vllm import Clock, ScriptedLLM, ScriptedTokenizer, ScriptedVLLMEngine, fake_vllm_config

from draftrl.cli import main
from draftrl.config.serve import ServeConfig
from draftrl.decoding.vllm import engine as engine_module
from draftrl.decoding.vllm.proposer import CLASS_PATH, CONFIG_ENV, DraftrlProposer
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.export.controller import PolicyController
from draftrl.export.features import serving_entry
from draftrl.export.vllm_control import BATCH_POLICY, BatchPolicyControl, RequestPolicyControl
from draftrl.signals.serving import FEATURE_NAMES

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ServeConfig(chat_template=False, shuffle=False, seed=0, num_requests=7, concurrency=3, max_new_tokens=24,
                     depths=(0, 2, 4), budgets=(0, 3, 8, 64), max_num_seqs=16)


class Scripted:
    """A serving policy that answers ``actions`` in order, keeping the observations it was asked about."""

    kind = "size"

    def __init__(self, entry: dict, actions):
        self.manifest, self.feature_names = {"features": entry}, list(FEATURE_NAMES)
        self.actions, self.seen = actions, []

    def act(self, obs):
        self.seen.append(np.array(obs))
        return self.actions(obs) if callable(self.actions) else self.actions[len(self.seen) - 1]


def entry_for(config: ServeConfig) -> dict:
    import dataclasses

    return serving_entry({"env": {"id": "draftrl/ServeVLLM-v1", "serve": dataclasses.asdict(config)}},
                         "draftrl/ServeVLLM-v1", list(FEATURE_NAMES))


def batch_policy_proposer(k: int, policy, clock) -> DraftrlProposer:
    proposer = DraftrlProposer(fake_vllm_config(k))
    proposer.set_controller(BatchPolicyControl(policy, clock=clock))
    return proposer


class Undriven(ScriptedVLLMEngine):
    """The scripted engine with a proposer whose controller chooses every action itself, as under
    ``vllm serve``: the env's actions are not handed over."""

    def step(self, action=None):
        return super().step(None)


def run_env(engine, config, choose, controller=None):
    """An episode of ServeVLLM-v1 over ``engine``: (observations, (depth, budget) per step); with
    ``controller``, the engine's proposer decides with it instead of the env's rule."""
    env = ServeVLLMEnv(config, engine=engine, tokenizer=ScriptedTokenizer())
    if controller is not None:
        engine.proposer.set_controller(controller)
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


# ----------------------------------------------------------------------------- BatchPolicyControl
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exported_controller_observes_what_the_env_observes(seed, monkeypatch):
    """Greedy (seeds 0, 1) and a temperature mix (seed 2: the batch's sampling entries, read by the
    controller from the runner's persistent batch, the env's from the engine's)."""
    config = CONFIG if seed < 2 else dataclasses.replace(CONFIG, temperature_mix={0: 0.4, 0.7: 0.3, 1.0: 0.3})
    rng = np.random.default_rng(seed)
    script = [np.array([rng.integers(3), rng.integers(4)]) for _ in range(400)]
    # the in-process driver: VLLMEngine.step + DraftrlProposer keyed by request id, the env's features
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(perf_counter=clock, thread_time=time.thread_time))
    driver = ScriptedVLLMEngine(DraftrlProposer(fake_vllm_config(4)), clock)
    expected, actions = run_env(driver, config, lambda k: script[k])
    # the exported controller alone (requests keyed by content, as under vllm serve), its own clock,
    # the same actions
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(perf_counter=clock, thread_time=time.thread_time))
    policy = Scripted(entry_for(config), actions)
    run_env(Undriven(DraftrlProposer(fake_vllm_config(4)), clock, attach_runner=False), config,
            lambda k: np.array([0, 0]), BatchPolicyControl(policy, clock=clock))
    assert len(policy.seen) == len(actions) > 20  # one observation per engine step, before it drafts
    got = np.stack(policy.seen)
    want = np.stack(expected[: len(actions)])
    for i, name in enumerate(FEATURE_NAMES):
        np.testing.assert_allclose(got[:, i], want[:, i], rtol=1e-6, atol=1e-7, err_msg=name)
    assert want[:, FEATURE_NAMES.index("accept_mean")].max() > 0 and want[:, FEATURE_NAMES.index("running")].max() > 0
    share, top = want[:, FEATURE_NAMES.index("greedy_share")], want[:, FEATURE_NAMES.index("temperature_max")]
    if config.mixed:  # some steps mix greedy and sampled requests
        assert ((share > 0) & (share < 1)).any() and top.max() == pytest.approx(1.0)
    else:
        assert top.max() == 0 and share.max() == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_proposer_never_drafts_past_the_policy_depth_or_budget(seed):
    rng = np.random.default_rng(seed)
    chosen = []

    def pick(obs):
        chosen.append((int(rng.choice(CONFIG.depths)), int(rng.choice(CONFIG.budgets))))
        return chosen[-1]

    llm = ScriptedLLM(batch_policy_proposer(4, Scripted(entry_for(CONFIG), pick), Clock()), Clock(), max_num_seqs=8)
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


def test_the_controller_logs_every_steps_decision_and_the_batchs_temperatures(tmp_path, monkeypatch):
    """``DRAFTRL_CONTROL_LOG`` (how ``vllm serve`` is told): one JSON line per engine step with the
    temperatures vLLM's batch holds, the observation the policy read and its decision."""
    from draftrl.export import vllm_control

    log = tmp_path / "control.jsonl"
    monkeypatch.setenv(vllm_control.LOG_ENV, str(log))
    share = FEATURE_NAMES.index("greedy_share")
    policy = Scripted(entry_for(CONFIG), lambda obs: (4, 8) if obs[share] == 1 else (2, 3))
    monkeypatch.setattr(vllm_control, "_policy", lambda config, proposer, what: policy)  # no .onnx needed
    proposer = DraftrlProposer(fake_vllm_config(4))
    proposer.set_controller(BatchPolicyControl.from_config({"policy": "policy.onnx"}, proposer))
    llm = ScriptedLLM(proposer, Clock(), max_num_seqs=8)
    for i in range(4):
        llm.add_request(str(i), list(range(10 + i, 30 + i)) * 2, 12, temperature=(0.0, 1.0)[i // 2])
    while llm.has_unfinished_requests():
        llm.step()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == len(policy.seen) > 5
    assert [line["step"] for line in lines] == sorted({line["step"] for line in lines})
    temps = {t for line in lines for t in line["temperatures"]}
    assert temps == {0.0, 1.0}
    for line, obs in zip(lines, policy.seen):
        np.testing.assert_allclose(line["observation"], obs, atol=1e-5)
        assert (line["depth"], line["budget"]) == ((4, 8) if obs[share] == 1 else (2, 3))
        assert line["depth_cap"] == line["depth"] and 0 <= line["proposed"] <= line["budget"]
        assert len(line["keys"]) == len(line["temperatures"])


def test_the_driver_refuses_to_drive_a_controller_that_chooses_its_own_action():
    """VLLMEngine.step hands its action to a built-in rule only: a policy controller's action would be
    overwritten silently otherwise. The control: the same engine with the proposer's rule takes it."""
    clock = Clock()
    engine = ScriptedVLLMEngine(batch_policy_proposer(4, Scripted(entry_for(CONFIG), lambda obs: (2, 3)), clock), clock)
    engine.add_request("a", list(range(10, 30)) * 2, 8)
    with pytest.raises(ValueError, match="chooses each step's action itself") as err:
        engine.step(engine_module.StepAction(2))
    assert "\n" not in str(err.value)
    engine.step()  # without an action it runs, under the policy's
    engine.proposer.set_controller(DraftrlProposer(fake_vllm_config(4)).controller)
    engine.step(engine_module.StepAction(1))
    assert engine.proposer.controller.action == engine_module.StepAction(1)


def test_export_writes_a_serving_bundle_that_runs(serve_run, tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    assert main(["export", str(serve_run), "--format", "vllm", "--out", str(out), "--check-observations", "64"]) == 0
    bundle = json.loads((out / "vllm.json").read_text())
    assert bundle["speculative_config"] == {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": 8}
    proposer_json = json.loads((out / "proposer.json").read_text())
    assert proposer_json == {"controller": BATCH_POLICY, "policy": "policy.onnx", "depth": 8, "rule": "match",
                             "drafter": "ngram:1:3:latest"}
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
    proposer = DraftrlProposer(fake_vllm_config(8))
    assert isinstance(proposer.controller, BatchPolicyControl) and proposer.controller.control.rule == "match"
    chosen = []
    act = proposer.controller.policy.act
    proposer.controller.policy.act = lambda obs: chosen.append(act(obs)) or chosen[-1]
    llm = ScriptedLLM(proposer, Clock(), max_num_seqs=4)
    for i in range(6):
        llm.add_request(str(i), list(range(10 + i, 30 + i)) * 2, 16)
    while llm.has_unfinished_requests():
        llm.step()
    assert chosen and all(d in (0, 2, 8) and b in (0, 4, 128) for d, b in chosen)
    for (depth, budget), drafts in zip(chosen, llm.drafts_per_step):
        assert sum(map(len, drafts)) <= budget and max(map(len, drafts), default=0) <= depth
    # the bundle's `vllm serve` line, as tools/serve_openai_mix.py starts it (through vLLM's module, loopback)
    spec = importlib.util.spec_from_file_location("serve_openai_mix", ROOT / "tools" / "serve_openai_mix.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    command, env = tool.serve_command(bundle, "MODEL", 8123)
    assert env == bundle["env"] and command[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "MODEL"]
    assert json.loads(command[command.index("--speculative-config") + 1]) == bundle["speculative_config"]
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "8123"
    with pytest.raises(ValueError, match="re-run draftrl export"):
        tool.serve_command({"serve": "vllm serve MODEL_DIR"}, "MODEL", 8123)


def test_a_refused_export_leaves_out_untouched(analytic_run, serve_run, tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["export", str(analytic_run), "--format", "vllm", "--out", str(out)]) != 0
    assert "cannot drive an engine" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing written, no staging folder left
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    assert main(["export", str(serve_run), "--format", "vllm", "--out", str(out), "--budget", "4",
                 "--overwrite"]) != 0  # beside the user's file, refused for --budget
    assert "drop --budget" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_a_proposer_config_the_controller_cannot_use_is_one_line(tmp_path, monkeypatch):
    """A controller without its policy, a key nobody reads, a controller that is not importable."""
    for config, why in (({"controller": BATCH_POLICY, "depth": 4}, "names controller .* but no policy"),
                        ({"controller": BATCH_POLICY, "policy": "p.onnx", "budget": 4},
                         "names budget, which controller"),
                        ({"policy": "p.onnx"}, "names policy, which the built-in rules do not read"),
                        ({"controller": "draftrl.export.nowhere:X"}, "No module named"),
                        ({"controller": "draftrl.export.vllm_control:Nope"}, "has no class Nope"),
                        ({"controller": "vllm_control.BatchPolicyControl"}, "must look like module:Class")):
        path = tmp_path / "proposer.json"
        path.write_text(json.dumps(config))
        monkeypatch.setenv(CONFIG_ENV, str(path))
        with pytest.raises(ValueError, match=why) as err:
            DraftrlProposer(fake_vllm_config(4))
        assert "\n" not in str(err.value), config


def test_the_manifest_names_the_envs_drafter_and_refuses_a_head():
    """The exported serving controller drafts with the env's drafter (``env.serve.drafter``); one that
    runs an EAGLE-3 head, which that proposer does not, is refused naming the head rule bundle."""
    assert entry_for(ServeConfig(drafter="ngram:1:4:latest"))["drafter"] == "ngram:1:4:latest"
    with pytest.raises(ValueError, match=r"env.serve.drafter='eagle3'.*draftrl export fixed:K@eagle3") as err:
        entry_for(ServeConfig(drafter="eagle3"))
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- RequestPolicyControl
MAX_LEN = 256


class FixedDepth:
    """The real manifest; every request gets ``depth`` (act_batch, as the controller calls it)."""

    def __init__(self, controller: PolicyController, depth: int):
        self.depth, self.batches = depth, []
        for name in ("kind", "manifest", "feature_names", "width", "depths", "verify_sizes", "path"):
            setattr(self, name, getattr(controller, name))

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        self.batches.append(np.array(obs))
        return np.tile([self.depth, 0], (len(obs), 1))


class Batch:
    """vLLM's persistent batch, as the proposer sees it: rows of tokens, and per step the sampled
    tokens. Each request's 'target' emits a fixed repeating text; drafts matching it are accepted."""

    def __init__(self, max_reqs: int = 4):
        self.token_ids_cpu = np.zeros((max_reqs, MAX_LEN), dtype=np.int32)
        self.num_tokens = np.zeros(max_reqs, dtype=np.int32)
        self.rows: list[dict] = []

    def add(self, prompt: list[int], truth: list[int]) -> None:
        row = len(self.rows)
        self.rows.append({"truth": truth, "pos": 0, "drafts": [], "sampled": []})
        self.token_ids_cpu[row, : len(prompt)] = prompt
        self.num_tokens[row] = len(prompt)
        self._emit(row, 1)  # the prefill's token

    def _emit(self, row: int, count: int) -> None:
        r = self.rows[row]
        tokens = r["truth"][r["pos"]: r["pos"] + count]
        n = self.num_tokens[row]
        self.token_ids_cpu[row, n: n + len(tokens)] = tokens
        self.num_tokens[row] += len(tokens)
        r["pos"] += len(tokens)
        r["sampled"] = list(tokens)

    def verify(self, drafts: list[list[int]]) -> None:
        for row, draft in enumerate(drafts[: len(self.rows)]):
            r = self.rows[row]
            accepted = 0
            while accepted < len(draft) and draft[accepted] == r["truth"][r["pos"] + accepted]:
                accepted += 1
            self._emit(row, accepted + 1)

    def finish(self, row: int) -> None:
        """Remove a request; later rows move up (vLLM condenses its batch)."""
        del self.rows[row]
        self.token_ids_cpu[row:-1] = self.token_ids_cpu[row + 1:].copy()
        self.num_tokens[row:-1] = self.num_tokens[row + 1:].copy()
        self.num_tokens[-1] = 0

    def sampled(self) -> list[list[int]]:
        return [r["sampled"] for r in self.rows]

    def propose(self, proposer: DraftrlProposer) -> list[list[int]]:
        return proposer.propose(self.sampled(), self.num_tokens, self.token_ids_cpu)[: len(self.rows)]


def repeating(start: int, period: int, length: int) -> list[int]:
    return [start + (i % period) for i in range(length)]


def request_policy_proposer(policy, k: int, depth_by_batch=None) -> DraftrlProposer:
    """draftrl's proposer keyed by content (as under vllm serve), deciding with ``policy``."""
    proposer = DraftrlProposer(fake_vllm_config(k, MAX_LEN))
    proposer.set_controller(RequestPolicyControl(policy, max_model_len=MAX_LEN, depth_by_batch=depth_by_batch))
    return proposer


def features_of(proposer: DraftrlProposer, row: int):
    """The feature builder the controller keeps for the request in ``row`` (every row decoding) at the last step."""
    return proposer.requests[proposer.last.keys[row]].memory["features"]


def test_each_request_keeps_its_features_across_steps_and_row_moves(replay_exports):
    policy = FixedDepth(PolicyController(replay_exports["onnx"]), depth=4)
    proposer = request_policy_proposer(policy, k=3)
    batch = Batch()
    batch.add(repeating(10, 5, 20), repeating(10, 5, 200))  # the continuation repeats the prompt's pattern
    batch.add(repeating(50, 7, 21), repeating(50, 7, 200))
    drafts = batch.propose(proposer)
    assert [len(d) for d in drafts] == [3, 3]  # depth 4 capped at num_speculative_tokens
    second = features_of(proposer, 1)
    for _ in range(4):
        batch.verify(drafts)
        drafts = batch.propose(proposer)
    assert all(r["sampled"] and len(r["sampled"]) == 4 for r in batch.rows)  # every n-gram draft accepted
    assert features_of(proposer, 1) is second
    names = list(policy.feature_names)
    last = policy.batches[-1]
    assert last[1, names.index("last_tokens_1")] == 4.0 and last[1, names.index("accept_rate_1")] > 0.5
    assert last[1, names.index("verify_cost_4")] > 1.0  # table costs: verifying 3 drafts costs more than 1 step
    # the first request finishes: the second moves to row 0 and keeps its history
    batch.verify(drafts)
    batch.finish(0)
    drafts = batch.propose(proposer)
    assert features_of(proposer, 0) is second and len(proposer.last.keys) == 1
    assert len(drafts) == 1 and len(drafts[0]) == 3
    # a new request in the freed row starts with empty history
    batch.verify(drafts)
    batch.add(repeating(80, 3, 12), repeating(80, 3, 100))
    batch.propose(proposer)
    fresh = policy.batches[-1][1]
    assert fresh[names.index("last_tokens_1")] == 0.0 and features_of(proposer, 1) is not second


def test_the_per_batch_cap_applies_and_prefilling_rows_are_skipped(replay_exports):
    policy = FixedDepth(PolicyController(replay_exports["onnx"]), depth=4)
    proposer = request_policy_proposer(policy, k=4, depth_by_batch=[[1, 1, 4], [2, 512, 1]])
    batch = Batch()
    batch.add(repeating(10, 5, 20), repeating(10, 5, 200))
    assert [len(d) for d in batch.propose(proposer)] == [4]
    batch.add(repeating(50, 7, 21), repeating(50, 7, 200))
    sampled = batch.sampled()
    sampled[1] = []  # still prefilling: vLLM passes no sampled tokens
    drafts = proposer.propose(sampled, batch.num_tokens, batch.token_ids_cpu)
    assert len(drafts[0]) == 1 and drafts[1] == []  # batch of 2: capped at k(2) = 1


# ----------------------------------------------------------------------------- bundles of earlier releases
@pytest.mark.parametrize("module,controller", [("draftrl.export.vllm_proposer", "RequestPolicyControl"),
                                               ("draftrl.export.vllm_serve_proposer", "BatchPolicyControl")])
def test_an_earlier_bundles_proposer_class_is_refused_naming_the_fix(module, controller):
    """vLLM imports the class an old bundle's speculative_config names: the import fails in one line
    that says to re-export and what new bundles load."""
    with pytest.raises(ImportError, match="is gone: re-run draftrl export RUN --format vllm") as err:
        importlib.import_module(module)
    assert f"draftrl.export.vllm_control:{controller}" in str(err.value) and "\n" not in str(err.value)


def test_each_request_starts_with_its_sampling_from_vllms_batch(replay_exports, monkeypatch):
    """RequestPolicyControl reads each request's sampling from vLLM's persistent batch (the runner's
    ``input_batch``, here through ``propose``'s caller as under vllm serve) at its first step and starts
    the training env's features with it where they read it (``start_episode(sampling=...)``)."""
    from draftrl.export import vllm_control
    from draftrl.export.features import make_feature_builder

    started = []

    class ReadsSampling:
        """The training env's features, plus a ``sampling`` argument (the round envs' request group)."""

        def __init__(self, inner):
            self.inner = inner

        def start_episode(self, max_new_tokens, sampling=None):
            started.append(sampling)
            self.inner.start_episode(max_new_tokens)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(vllm_control, "make_feature_builder",
                        lambda entry, names: ReadsSampling(make_feature_builder(entry, names)))
    proposer = request_policy_proposer(FixedDepth(PolicyController(replay_exports["onnx"]), depth=4), k=3)
    batch = Batch()
    batch.input_batch = SimpleNamespace(vocab_size=49152, temperature_cpu=np.array([0.0, 0.7, 0, 0], np.float32),
                                        top_k_cpu=np.array([49152, 20, 0, 0]),
                                        top_p_cpu=np.array([1.0, 0.8, 1, 1], np.float32))
    batch.add(repeating(10, 5, 20), repeating(10, 5, 200))
    batch.add(repeating(50, 7, 21), repeating(50, 7, 200))
    batch.propose(proposer)
    labels = [proposer.requests[k].memory["sampling"].label for k in proposer.last.keys]
    assert labels == ["T0", "T0.7:k20:p0.8"] and [s.label for s in started[-2:]] == labels
    assert proposer.last.temperature.tolist() == pytest.approx([0.0, 0.7])
