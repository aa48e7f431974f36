"""The CLI's last line of defence: every failure is one line on stderr (no traceback), with
``--debug`` for the traceback; YAML mistakes name FILE:LINE:COLUMN; misspelled sections fail;
damaged or mismatched artifacts (traces, cost tables, policies, exports) are refused before any
work and leave the earlier files untouched."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from draftrl.cli import main
from draftrl.signals.costs import CostTable


def one_error_line(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_unexpected_error_is_one_line_with_the_debug_hint(tmp_path, capsys):
    """An --out below a file (an OSError) is one line, and --debug re-raises it."""
    (tmp_path / "file.txt").write_text("x")
    out = str(tmp_path / "file.txt" / "traces")
    line = one_error_line(capsys, ["collect", "--out", out])
    assert line.startswith("draftrl collect: error: ") and "Error" in line and "--debug" in line
    with pytest.raises(OSError):
        main(["--debug", "collect", "--out", out])


def test_yaml_syntax_error_names_file_line_column(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  depths: [0, 2\n  width: 1\n")
    line = one_error_line(capsys, ["collect", "--config", str(bad), "--out", str(tmp_path / "t")])
    assert f"{bad}:3:" in line and "YAML syntax error" in line
    line = one_error_line(capsys, ["train", "--config", str(bad), "--out", str(tmp_path / "run")])
    assert f"{bad}:3:" in line


def test_misspelled_section_is_refused(tmp_path, capsys):
    """A misspelled section (`enviroment:`) fails instead of leaving the default 256-prompt workload to run."""
    bad = tmp_path / "typo.yaml"
    bad.write_text("enviroment:\n  max_new_tokens: 8\n")
    line = one_error_line(capsys, ["collect", "--config", str(bad), "--out", str(tmp_path / "t")])
    assert "unknown section 'enviroment'; did you mean 'env'?" in line
    assert not (tmp_path / "t").exists()


def _fake_eval(monkeypatch, calls: list):
    """``run_eval`` replaced by one that writes what the real one writes (results, report, a plot)."""

    def fake_run_eval(config, out, **kwargs):
        calls.append(out)
        for name in ("results.json", "report.md", "trajectory.png"):
            (Path(out) / name).write_text("{}")
        return {"prompts": [], "policies": {}, "exactness": {"passed": True, "monitor_overhead": {"fraction": 0}}}

    monkeypatch.setattr("draftrl.eval.round.compare.run_eval", fake_run_eval)
    monkeypatch.setattr("draftrl.cli.eval.print_policy_table", lambda *a, **k: None)


def test_eval_never_silently_replaces_earlier_results(tmp_path, capsys, monkeypatch):
    """`eval --out EXISTING` must not replace results.json, report and plots (nor leave stale plots)."""
    calls = []
    _fake_eval(monkeypatch, calls)
    out = tmp_path / "e"
    argv = ["eval", "--policies", "none,heuristic", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    (out / "acceptance_hist.png").write_text("stale plot of the earlier run")
    line = one_error_line(capsys, argv)
    assert "already holds the outputs of an earlier eval" in line and "--overwrite" in line
    assert len(calls) == 1 and (out / "acceptance_hist.png").exists()  # refused before any work, nothing touched
    assert main([*argv, "--overwrite"]) == 0
    assert len(calls) == 2 and not (out / "acceptance_hist.png").exists()  # no stale plot beside new results


def test_out_of_another_kind_or_unwritable_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    calls = []
    _fake_eval(monkeypatch, calls)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    assert "files draftrl eval did not write (thesis.tex)" in one_error_line(
        capsys, ["eval", "--policies", "none", "--out", str(foreign), "--quiet"])
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert "is not writable" in one_error_line(capsys, ["eval", "--policies", "none", "--out", str(blocker / "sub"),
                                                        "--quiet"])
    assert "is not writable" in one_error_line(capsys, ["grid", "--out", str(blocker / "sub"), "--quiet"])
    assert calls == [] and (foreign / "thesis.tex").read_text() == "mine"


# ----------------------------------------------------------------------------- damaged artifacts
def table_dict(**verify) -> dict:
    """A valid cost table's JSON, with ``verify`` keys replaced."""
    data = CostTable(num_tokens=[1, 2], context_lens=[64], verify_seconds=[[0.02, 0.021]], draft_widths=[1],
                     draft_level_seconds=[1e-4]).to_dict()
    data["verify"].update(verify)
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
# Each builds its damaged input under ``tmp`` (from the analytic run, its exports or ``traces()``, a
# tiny Traces) and returns (argv, expected text of the one line).

def collect_over_traces(tmp, run, exports, traces):
    traces().save(tmp / "traces")
    return ["collect", "--out", str(tmp / "traces")], "already holds traces; pass --overwrite"


def collect_into_foreign_dir(tmp, run, exports, traces):
    (tmp / "work").mkdir()
    (tmp / "work" / "notes.txt").write_text("mine")
    return ["collect", "--out", str(tmp / "work")], "holds notes.txt, not traces"


def collect_nan_cost_table(tmp, run, exports, traces):
    (tmp / "bad.json").write_text(json.dumps(table_dict(seconds=[[0.02, float("nan")]])))
    return ["collect", "--out", str(tmp / "new"), "--cost-table", str(tmp / "bad.json")], "non-finite"


def collect_null_cost_table(tmp, run, exports, traces):  # NaN written by a JSON writer that maps it to null
    (tmp / "bad.json").write_text(json.dumps(table_dict(seconds=[[0.02, None]])))
    return ["collect", "--out", str(tmp / "new"), "--cost-table", str(tmp / "bad.json")], "non-finite"


def export_without_normaliser(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    (d / "vecnormalize.pkl").unlink()
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "no VecNormalize statistics"


def eval_without_normaliser(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    (d / "vecnormalize.pkl").unlink()
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "no VecNormalize statistics"


def checkpoint_without_normaliser(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    (d / "checkpoints" / "ppo_vecnormalize_1024_steps.pkl").unlink()
    return (["export", str(d / "checkpoints" / "ppo_1024_steps.zip"), "--format", "onnx", "--out",
             str(tmp / "p.onnx")], "no VecNormalize statistics")


def eval_foreign_normaliser(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    shutil.copyfile(d / "checkpoints" / "ppo_vecnormalize_1024_steps.pkl", d / "vecnormalize.pkl")
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "vecnormalize.pkl does not match"


def export_grid_mismatch(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.update(depths=m["depths"][:5]))
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "outputs [13, 1]"


def eval_grid_mismatch(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.update(verify_sizes=[0, 4]))
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "outputs [13, 1]"


def eval_feature_mismatch(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.update(feature_names=m["feature_names"][:-1]))
    return ["eval", "--policies", f"ar,ppo:{d}", "--out", str(tmp / "eval")], "names 5 features but"


def export_manifest_missing_field(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    edit_json(d / "policy.json", lambda m: m.pop("feature_names"))
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "lacks feature_names"


def export_truncated_policy(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    data = (d / "policy.zip").read_bytes()
    (d / "policy.zip").write_bytes(data[: len(data) // 2])
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "does not match"


def export_truncated_checkpoint(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    ckpt = d / "checkpoints" / "ppo_1024_steps.zip"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    return (["export", str(ckpt), "--format", "onnx", "--out", str(tmp / "p.onnx")],
            "is not a readable SB3 PPO model")


def export_policy_json_not_json(tmp, run, exports, traces):
    d = copy_run(run, tmp)
    (d / "policy.json").write_text("{kind: size")
    return ["export", str(d), "--format", "onnx", "--out", str(tmp / "p.onnx")], "is not valid JSON"


def generate_policy_not_onnx(tmp, run, exports, traces):
    shutil.copyfile(exports["onnx"].with_name("policy.onnx.json"), tmp / "policy.onnx.json")
    (tmp / "policy.onnx").write_bytes(b"this is not an onnx file")
    return ["generate", "--prompt", "hi", "--policy", str(tmp / "policy.onnx")], "is not a loadable ONNX model"


def generate_policy_manifest_missing_field(tmp, run, exports, traces):
    shutil.copyfile(exports["onnx"], tmp / "policy.onnx")
    manifest = json.loads(exports["onnx"].with_name("policy.onnx.json").read_text())
    manifest.pop("action")
    (tmp / "policy.onnx.json").write_text(json.dumps(manifest))
    return ["generate", "--prompt", "hi", "--policy", str(tmp / "policy.onnx")], "lacks or mangles 'action'"


def generate_drafter_typo_offline(tmp, run, exports, traces):
    return ["generate", "--prompt", "hi", "--drafter", "foo"], "'foo' is neither a known name"


CASES = [collect_over_traces, collect_into_foreign_dir, collect_nan_cost_table, collect_null_cost_table,
         export_without_normaliser, eval_without_normaliser, checkpoint_without_normaliser, eval_foreign_normaliser,
         export_grid_mismatch, eval_grid_mismatch, eval_feature_mismatch, export_manifest_missing_field,
         export_truncated_policy, export_truncated_checkpoint, export_policy_json_not_json, generate_policy_not_onnx,
         generate_policy_manifest_missing_field, generate_drafter_typo_offline]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_artifact_is_one_line_and_changes_nothing(case, analytic_run, analytic_exports, tiny_traces, tmp_path,
                                                      capsys, monkeypatch):
    """Damaged and mismatched artifacts, tried as a user would: every case exits non-zero with
    exactly one line on stderr, no traceback, before any model loads, and leaves the earlier files
    untouched."""
    import draftrl.models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    loaded = []
    monkeypatch.setattr(draftrl.models, "shared_model", lambda *a, **k: loaded.append(a) or pytest.fail("model loaded"))

    monkeypatch.setattr(draftrl.models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    argv, expected = case(tmp_path, analytic_run, analytic_exports, tiny_traces)
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


def test_export_refuses_to_replace_an_earlier_export_without_overwrite(tmp_path, capsys):
    """A second export to the same --out is refused in one line; with --overwrite a bundle folder's
    earlier files go first, so a route (b) proposer.json never survives beside a stock vllm.json."""
    out = tmp_path / "bundle"
    assert main(["export", "fixed:4@sam:2", "--format", "vllm", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["drafter", "proposer.json", "vllm.json"]  # the head, copied
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["export", "vllm-eagle3:2", "--format", "vllm", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite" in err and "proposer.json" in err
    assert main(["export", "vllm-eagle3:2", "--format", "vllm", "--out", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["drafter", "notes.txt", "vllm.json"]
    static = tmp_path / "static.json"
    static.write_text("{}")
    assert main(["export", "vllm-eagle3:2", "--format", "vllm", "--out", str(static)]) == 2
    assert "already exist" in capsys.readouterr().err and static.read_text() == "{}"


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_calibrate_refuses_to_replace_an_earlier_calibration_without_overwrite(tmp_path, capsys, engine):
    """Both engines' calibrations take minutes; an existing --out is refused before any of it, untouched."""
    out = tmp_path / "costs.json"
    out.write_text('{"earlier": true}')
    line = one_error_line(capsys, ["calibrate", "--engine", engine, "--out", str(out)])
    assert "--overwrite" in line and str(out) in line
    assert out.read_text() == '{"earlier": true}'
