"""Damaged and mismatched artifacts, tried as a user would: every case exits non-zero with exactly
one line on stderr, no traceback, before any model loads, and leaves the earlier files untouched.

Issue 13's findings: traces replaced or mixed (1), a policy without its normaliser (2), a grid
that does not match the network (6), tracebacks for damaged files (8), weak validation (9). The
policies are the session's small analytic run (tests/export/conftest.py), copied and damaged here.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from draftrl.cli import main
from draftrl.envs.traces import Traces
from draftrl.prompts import Prompt
from draftrl.runs import stored_cost_table_path
from draftrl.signals.costs import CostTable


def tiny_traces(token: int = 7) -> Traces:
    """One prompt, two positions, a one-node chain per position: enough to save and load."""
    return Traces(
        prompts=[Prompt("en-chat-000", "en", "chat", "tune", "hi", 2)], budgets=[2], stop_reasons=["length"],
        prompt_tokens=np.array([1, 2, 3]), cu_num_prompt_tokens=np.array([0, 3]),
        continuation=np.array([token, 8]), cu_num_positions=np.array([0, 2]),
        draft_features=np.zeros((2, 3)), cu_num_nodes=np.array([0, 1, 1]),
        node_tokens=np.array([token]), node_parents=np.array([-1]), node_depths=np.array([1]),
        node_scores=np.array([0.5]), max_depth=1, width=1,
        meta={"config": {}, "target": "smollm2-135m", "drafter": "ngram"},
    )


def table_dict(**changes) -> dict:
    data = CostTable(num_tokens=[1, 2], context_lens=[64], verify_seconds=[[0.02, 0.021]], draft_widths=[1],
                     draft_level_seconds=[1e-4]).to_dict()
    data["verify"].update(changes)
    return data


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def copy_run(run: Path, tmp: Path) -> Path:
    return Path(shutil.copytree(run, tmp / "run"))


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# ----------------------------------------------------------------------------- the cases
# Each builds its damaged input under ``tmp`` and returns (argv, expected text of the one line).

def collect_over_traces(tmp, run, exports):
    tiny_traces().save(tmp / "traces")
    return ["collect", "--out", str(tmp / "traces")], "already holds traces; pass --overwrite"


def collect_into_foreign_dir(tmp, run, exports):
    (tmp / "work").mkdir()
    (tmp / "work" / "notes.txt").write_text("mine")
    return ["collect", "--out", str(tmp / "work")], "holds notes.txt, not traces"


def collect_nan_cost_table(tmp, run, exports):
    (tmp / "bad.json").write_text(json.dumps(table_dict(seconds=[[0.02, float("nan")]])))
    return ["collect", "--out", str(tmp / "new"), "--cost-table", str(tmp / "bad.json")], "non-finite"


def collect_null_cost_table(tmp, run, exports):  # NaN written by a JSON writer that maps it to null
    (tmp / "bad.json").write_text(json.dumps(table_dict(seconds=[[0.02, None]])))
    return ["collect", "--out", str(tmp / "new"), "--cost-table", str(tmp / "bad.json")], "non-finite"


def export_without_normaliser(tmp, run, exports):
    d = copy_run(run, tmp)
    (d / "vecnormalize.pkl").unlink()
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "no VecNormalize statistics"


def eval_without_normaliser(tmp, run, exports):
    d = copy_run(run, tmp)
    (d / "vecnormalize.pkl").unlink()
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "no VecNormalize statistics"


def checkpoint_without_normaliser(tmp, run, exports):
    d = copy_run(run, tmp)
    (d / "checkpoints" / "ppo_vecnormalize_1024_steps.pkl").unlink()
    return (["export", str(d / "checkpoints" / "ppo_1024_steps.zip"), "--format", "onnx", "--out",
             str(tmp / "p.onnx")], "no VecNormalize statistics")


def eval_foreign_normaliser(tmp, run, exports):
    d = copy_run(run, tmp)
    shutil.copyfile(d / "checkpoints" / "ppo_vecnormalize_1024_steps.pkl", d / "vecnormalize.pkl")
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "vecnormalize.pkl does not match"


def export_grid_mismatch(tmp, run, exports):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.update(depths=m["depths"][:5]))
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "outputs [13, 1]"


def eval_grid_mismatch(tmp, run, exports):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.update(verify_sizes=[0, 4]))
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "outputs [13, 1]"


def eval_feature_mismatch(tmp, run, exports):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.update(feature_names=m["feature_names"][:-1]))
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "names 5 features but"


def export_manifest_missing_field(tmp, run, exports):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.pop("feature_names"))
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "lacks feature_names"


def export_truncated_policy(tmp, run, exports):
    d = copy_run(run, tmp)
    data = (d / "policy.zip").read_bytes()
    (d / "policy.zip").write_bytes(data[: len(data) // 2])
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "does not match"


def export_truncated_checkpoint(tmp, run, exports):
    d = copy_run(run, tmp)
    ckpt = d / "checkpoints" / "ppo_1024_steps.zip"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    return (["export", str(ckpt), "--format", "onnx", "--out", str(tmp / "p.onnx")],
            "is not a readable SB3 PPO model")


def export_policy_json_not_json(tmp, run, exports):
    d = copy_run(run, tmp)
    (d / "policy.json").write_text("{kind: size")
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "is not valid JSON"


def generate_policy_not_onnx(tmp, run, exports):
    shutil.copyfile(exports["onnx"].with_name("policy.onnx.json"), tmp / "policy.onnx.json")
    (tmp / "policy.onnx").write_bytes(b"this is not an onnx file")
    return ["generate", "--prompt", "hi", "--policy", str(tmp / "policy.onnx")], "is not a loadable ONNX model"


def generate_policy_manifest_missing_field(tmp, run, exports):
    shutil.copyfile(exports["onnx"], tmp / "policy.onnx")
    manifest = json.loads(exports["onnx"].with_name("policy.onnx.json").read_text())
    manifest.pop("action")
    (tmp / "policy.onnx.json").write_text(json.dumps(manifest))
    return ["generate", "--prompt", "hi", "--policy", str(tmp / "policy.onnx")], "lacks or mangles 'action'"


def generate_drafter_typo_offline(tmp, run, exports):
    return ["generate", "--prompt", "hi", "--drafter", "foo"], "'foo' is neither a known name"


CASES = [collect_over_traces, collect_into_foreign_dir, collect_nan_cost_table, collect_null_cost_table,
         export_without_normaliser, eval_without_normaliser, checkpoint_without_normaliser, eval_foreign_normaliser,
         export_grid_mismatch, eval_grid_mismatch, eval_feature_mismatch, export_manifest_missing_field,
         export_truncated_policy, export_truncated_checkpoint, export_policy_json_not_json, generate_policy_not_onnx,
         generate_policy_manifest_missing_field, generate_drafter_typo_offline]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_artifact_is_one_line_and_changes_nothing(case, analytic_run, analytic_exports, tmp_path, capsys,
                                                      monkeypatch):
    from draftrl.envs import engines

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    loaded = []
    monkeypatch.setattr(engines, "shared_model", lambda *a, **k: loaded.append(a) or pytest.fail("model loaded"))
    import draftrl.models

    monkeypatch.setattr(draftrl.models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    argv, expected = case(tmp_path, analytic_run, analytic_exports)
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, (out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert expected in lines[0], lines[0]
    assert lines[0].startswith(f"draftrl {argv[0]}: error: ")
    assert snapshot(tmp_path) == before  # nothing earlier was modified or removed
    assert not loaded


# ----------------------------------------------------------------------------- the library calls behind them
def test_traces_of_two_collections_are_refused(tmp_path):
    """Finding 1: a trace.json of one collection beside the trace.npz of another trained with exit 0."""
    tiny_traces(7).save(tmp_path / "a")
    tiny_traces(9).save(tmp_path / "b")
    assert Traces.load(tmp_path / "a").continuation[0] == 7
    shutil.copyfile(tmp_path / "b" / "trace.npz", tmp_path / "a" / "trace.npz")
    with pytest.raises(ValueError, match="come from different collections.*--overwrite"):
        Traces.load(tmp_path / "a")


def test_traces_with_inconsistent_arrays_are_refused(tmp_path):
    traces = tiny_traces()
    traces.cu_num_positions = np.array([0, 5])  # more positions than the continuation holds
    traces.save(tmp_path / "t")
    with pytest.raises(ValueError, match="cu_num_positions does not index continuation"):
        Traces.load(tmp_path / "t")


def test_saving_traces_replaces_the_unit_and_its_cost_table(tmp_path):
    """A new save drops the earlier cost table; a cost table of another collection is refused."""
    table = CostTable.from_dict(table_dict())
    first = tiny_traces(7).save(tmp_path / "t", cost_table=table)
    assert stored_cost_table_path(first) == first / "cost_table.json"
    stale = (first / "cost_table.json").read_text()
    tiny_traces(9).save(tmp_path / "t")  # no cost table this time: none may remain
    assert not (first / "cost_table.json").exists() and Traces.load(first).continuation[0] == 9
    (first / "cost_table.json").write_text(stale)  # a stale copy put back by hand
    with pytest.raises(ValueError, match="belongs to another collection"):
        stored_cost_table_path(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no temporary directories left behind


def test_traces_never_replace_a_foreign_directory(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="results.json, not traces"):
        tiny_traces().save(tmp_path / "t")
    assert (tmp_path / "t" / "results.json").read_text() == "{}"


@pytest.mark.parametrize("where", ["verify", "draft", "noise"])
def test_cost_table_refuses_non_finite_values(where):
    data = table_dict()
    if where == "verify":
        data["verify"]["seconds"] = [[0.02, math.inf]]
    elif where == "draft":
        data["draft"]["level_seconds"] = [float("nan")]
    else:
        data["noise"] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        CostTable.from_dict(data)


def test_policy_load_checks_normaliser_and_grid(analytic_run, tmp_path):
    """Finding 2 and 6 at the API: PPOPolicy.load (eval, demo, --resume's evaluation) refuses."""
    from draftrl.policies import PPOPolicy

    d = copy_run(analytic_run, tmp_path)
    PPOPolicy.load(d)
    (d / "vecnormalize.pkl").unlink()
    with pytest.raises(FileNotFoundError, match="normalised observations"):
        PPOPolicy.load(d)


def test_exported_onnx_runs_alone_and_refuses_non_finite_observations(analytic_run, analytic_exports, tmp_path):
    """The graph normalises raw observations itself, so the .onnx needs no JSON beside it; its
    actions equal SB3's on SB3-normalised observations; NaN observations are refused."""
    import onnxruntime

    from draftrl.export.artifacts import resolve
    from draftrl.export.controller import PolicyController
    from draftrl.export.network import load_sb3, sample_observations

    model, normalizer = load_sb3(resolve(analytic_run))
    obs = sample_observations(model, 256, seed=3)
    expected, _ = model.predict(normalizer.normalize_obs(obs), deterministic=True)
    session = onnxruntime.InferenceSession(str(analytic_exports["onnx"]))
    raw_actions = session.run(["action"], {"observation": obs})[0]  # no draftrl code, raw observations
    np.testing.assert_array_equal(raw_actions, expected)
    alone = tmp_path / "alone.onnx"
    shutil.copyfile(analytic_exports["onnx"], alone)  # no alone.onnx.json: the embedded manifest is used
    controller = PolicyController(alone)
    np.testing.assert_array_equal(controller.act_indices(obs), expected)
    bad = obs[0].copy()
    bad[2] = np.nan
    with pytest.raises(ValueError, match=f"features \\['{controller.feature_names[2]}'\\] are not finite"):
        controller.act(bad)


def test_saved_config_paths_resolve_from_the_run_directory(tmp_path, monkeypatch):
    """Finding 7: config.json stored `traces: runs/demo/traces` as given (relative to where training
    ran), so evaluating from another directory silently dropped the training cost table. Paths are
    now stored relative to the run directory and read back absolute from anywhere; a resume with
    the same config, given from the same place, still matches."""
    from draftrl.config import load_config
    from draftrl.runs import read_run_config
    from draftrl.train.config import TrainConfig
    from draftrl.train.state import open_run

    project = tmp_path / "project"
    (project / "runs" / "traces").mkdir(parents=True)
    (project / "runs" / "traces" / "cost_table.json").write_text("{}")
    monkeypatch.chdir(project)
    cfg = load_config(TrainConfig, None, ["env.traces=runs/traces", "env.cost_table=runs/traces/cost_table.json"])
    open_run(cfg, Path("runs/ppo"), resume=False)
    saved = json.loads((project / "runs" / "ppo" / "config.json").read_text())
    assert {k: saved["env"][k] for k in ("traces", "cost_table")} == {
        "traces": "../traces", "cost_table": "../traces/cost_table.json"}
    assert open_run(cfg, Path("runs/ppo"), resume=True)["sessions"] == 2  # the same config, given as before
    monkeypatch.chdir(tmp_path)  # evaluate from elsewhere
    kwargs = read_run_config(project / "runs" / "ppo")["env"]
    assert {k: kwargs[k] for k in ("traces", "cost_table")} == {"traces": str(project / "runs" / "traces"),
                      "cost_table": str(project / "runs" / "traces" / "cost_table.json")}
    moved = tmp_path / "moved"  # the whole tree moves: the run still finds its traces
    (project / "runs").rename(moved)
    assert read_run_config(moved / "ppo")["env"]["traces"] == str(moved / "traces")
