"""One wandb group per pipeline folder, a step run again continues its own run, a failed step is
marked failed (``draftrl.config.wandb``), read back from the offline files wandb wrote."""

from __future__ import annotations

import json

import pytest
from wandb_records import read_runs

from draftrl.config.wandb import EXACTNESS_FAILED, WandbConfig, logged_run, pipeline, start_run, sync_command
from draftrl.runs import WANDB_FILE

pytest.importorskip("wandb")


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)


def test_one_group_per_pipeline_folder(tmp_path, offline):
    demo = tmp_path / "demo"
    settings = pipeline(WandbConfig(), demo)
    assert settings.dir == str(demo) and settings.group.startswith("demo-") and len(settings.group) == len("demo-") + 6
    assert json.loads((demo / WANDB_FILE).read_text())["group"] == settings.group
    assert pipeline(WandbConfig(), demo).group == settings.group  # recorded: a resumed pipeline keeps it
    other = pipeline(WandbConfig(), tmp_path / "elsewhere" / "demo")
    assert other.group != settings.group and other.group.startswith("demo-")  # same name, another folder
    assert pipeline(WandbConfig(group="mine"), tmp_path / "x").group == "mine"
    (demo / WANDB_FILE).unlink()  # what --overwrite does
    assert pipeline(WandbConfig(), demo).group != settings.group
    assert sync_command(settings, demo) == f"wandb sync {demo / 'wandb'}"


def test_steps_share_the_group_and_a_step_run_again_continues_its_run(tmp_path, offline):
    settings = pipeline(WandbConfig(project="p"), tmp_path)
    for job_type in ("grid", "eval", "grid"):
        with logged_run(settings, tmp_path / job_type, job_type=job_type) as run:
            run.summary["step"] = job_type
    runs = read_runs(tmp_path / "wandb")  # the steps' folders' runs all land in the pipeline's wandb/
    assert [r.job_type for r in runs] == ["grid", "eval", "grid"]
    assert {r.group for r in runs} == {settings.group} and {r.project for r in runs} == {"p"}
    assert runs[0].id == runs[2].id != runs[1].id  # wandb sync uploads both grid sessions into one run
    recorded = json.loads((tmp_path / WANDB_FILE).read_text())["runs"]
    assert recorded == {"grid:grid": runs[0].id, "eval:eval": runs[1].id}
    assert sync_command(settings, tmp_path) == f"wandb sync {tmp_path / 'wandb'}"


def test_a_shared_wandb_dir_syncs_only_the_pipelines_runs(tmp_path, offline, monkeypatch):
    shared = tmp_path / "everyone"
    monkeypatch.setenv("WANDB_DIR", str(shared))
    settings = pipeline(WandbConfig(), tmp_path / "demo")
    with logged_run(settings, tmp_path / "demo" / "grid", job_type="grid") as run:
        run_id = run.id
    command = sync_command(settings, tmp_path / "demo")
    assert command == f"wandb sync {shared / 'wandb'}/offline-run-*-{run_id}"
    assert len(list((shared / "wandb").glob(command.split("/")[-1]))) == 1


def test_a_failed_step_is_marked_failed(tmp_path, offline):
    settings = pipeline(WandbConfig(), tmp_path)
    with pytest.raises(RuntimeError):
        with logged_run(settings, tmp_path, job_type="calibrate"):
            raise RuntimeError("the step broke")
    with pytest.raises(KeyboardInterrupt):
        with logged_run(settings, tmp_path, job_type="collect"):
            raise KeyboardInterrupt
    with logged_run(settings, tmp_path, job_type="eval", code=EXACTNESS_FAILED):
        pass
    with logged_run(settings, tmp_path, job_type="grid"):
        pass
    assert [(r.job_type, r.exit_code) for r in read_runs(tmp_path / "wandb")] == \
        [("calibrate", 1), ("collect", 130), ("eval", 3), ("grid", 0)]


def test_disabled_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert start_run(WandbConfig(), tmp_path, job_type="grid") is None
    assert pipeline(WandbConfig(), tmp_path) == WandbConfig() and sync_command(WandbConfig(), tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="wandb.mode"):
        WandbConfig(mode="cloud")
    with pytest.raises(ValueError, match="wandb.group"):
        WandbConfig(group=" ")
