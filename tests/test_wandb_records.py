"""The offline-run reader of the tests (``tests/wandb_records.py``) on runs wandb itself wrote."""

from __future__ import annotations

import pytest
from wandb_records import BLOCK, read_run, read_runs, records

wandb = pytest.importorskip("wandb")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    return tmp_path


def _init(tmp_path, **kwargs):
    return wandb.init(project="p", group="g", job_type="grid", name="n", dir=str(tmp_path), mode="offline",
                      reinit="create_new", settings=wandb.Settings(silent=True), **kwargs)


def test_reads_what_wandb_wrote(offline):
    run = _init(offline, config={"a": 1, "nested": {"b": [1, 2]}})
    run.log({"x": 1.5, "t": wandb.Table(columns=["c", "v"], data=[["a", 1.0], ["b", 2.0]])})
    run.log({"x": 2.5})
    run.summary.update({"policy/ppo/speedup_vs_best_fixed": 1.07, "best/name": "d2_v0_w1"})
    run.finish(exit_code=3)
    (read,) = read_runs(offline / "wandb")
    assert (read.project, read.group, read.job_type, read.name, read.id) == ("p", "g", "grid", "n", run.id)
    assert read.config["a"] == 1 and read.config["nested"] == {"b": [1, 2]}
    assert [row["x"] for row in read.history] == [1.5, 2.5]
    assert read.summary["x"] == 2.5 and read.summary["policy/ppo/speedup_vs_best_fixed"] == 1.07
    assert read.table("t") == (["c", "v"], [["a", 1.0], ["b", 2.0]])
    assert read.exit_code == 3
    with pytest.raises(KeyError, match="no table"):
        read.table("x")


def test_records_split_across_blocks_are_joined(offline):
    """A record longer than a 32 KiB block is written as first / middle / last fragments."""
    big = "".join(chr(97 + i % 26) for i in range(3 * BLOCK))
    run = _init(offline)
    run.summary["big"] = big
    run.summary["after"] = 1
    run.finish()
    (read,) = read_runs(offline / "wandb")
    assert read.summary["big"] == big and read.summary["after"] == 1 and read.exit_code == 0


def test_a_damaged_file_is_refused(offline):
    run = _init(offline)
    run.summary["value"] = 1
    run.finish()
    (folder,) = (offline / "wandb").glob("offline-run-*")
    assert read_run(folder).summary["value"] == 1  # waits until the service wrote the run out
    (path,) = folder.glob("run-*.wandb")
    data = bytearray(path.read_bytes())
    assert sum(1 for _ in records(path)) > 3
    data[40] ^= 0xFF  # inside the first record
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        read_run(folder)
    path.write_bytes(b"LEVELDB" + bytes(data[7:]))
    with pytest.raises(ValueError, match="header"):
        list(records(path))
