"""``draftrl collect --ray`` (issue 47, item 2) on a local Ray cluster bound to 127.0.0.1 with two
workers: the traces are bitwise those of the one-process collection, every prompt exactly once; a
worker killed mid-collection stops the command with one line, and the same command then completes
the traces, equal to an uninterrupted run. Skipped without Ray (``pip install "draftrl[ray]"``),
except the check that both kinds of collection describe their kept prompts alike.

SmolLM2-135M (draftrl's cached default), four English prompts of 12 tokens, n-gram drafting. The Ray
tests are ``slow`` (3 and 5 minutes on a busy 2-core machine: a cluster start and two model loads each):
``pytest -m slow tests/replay/test_ray_collect.py``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from draftrl.cli import main
from draftrl.config.env import EnvConfig
from draftrl.replay.ray_collect import collect_on_ray, same_traces
from draftrl.replay.traces import Traces

ROOT = Path(__file__).resolve().parents[2]
SETS = ["--set", "env.max_new_tokens=12", "--set", "env.kernels=stock", "--threads", "1"]


def argv(out: Path, *extra: str) -> list[str]:
    return ["collect", "--config", str(ROOT / "configs" / "tiny_cpu.yaml"), *SETS, "--out", str(out), *extra]


def env_config() -> EnvConfig:
    from draftrl.cli import build_parser
    from draftrl.cli.collect import config

    return config(build_parser().parse_args(argv(Path("unused")))).env


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "traces"
    assert main(argv(out)) == 0
    return out


@pytest.fixture
def ray():
    """Ray's presence, checked without importing it (draftrl's local cluster sets what Ray reads at import)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip('Ray is not installed; run pip install "draftrl[ray]"')
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


def non_loopback_listeners() -> list[str]:
    """TCP/UDP listeners of Ray's processes (and of this one, the driver) on anything but 127.0.0.1."""
    import shutil
    import subprocess

    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed: cannot list the cluster's sockets")
    lines = subprocess.run(["ss", "-ltunpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    keys = ('"gcs_server"', '"raylet"', '"ray::', f"pid={os.getpid()},")
    ours = [line for line in lines if any(k in line for k in keys)]
    return [line for line in ours if not line.split()[4].startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))]


@pytest.mark.slow
def test_two_workers_write_the_traces_one_process_writes(ray, one_process, tmp_path, capsys):
    out = tmp_path / "traces"
    assert main(argv(out, "--ray", "--ray-workers", "2")) == 0
    err = capsys.readouterr().err
    pids = {line.rsplit("worker ", 1)[1].rstrip(")") for line in err.splitlines() if "(worker " in line}
    assert len(pids) == 2, err  # both workers recorded prompts
    reference, sharded = Traces.load(one_process), Traces.load(out)
    assert same_traces(sharded, reference)
    ids = [p.id for p in sharded.prompts]
    assert len(ids) == len(set(ids)) == 4  # every prompt exactly once
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in one_process.iterdir())


@pytest.mark.slow
def test_a_killed_worker_loses_only_its_prompt_and_the_same_command_completes(ray, one_process, tmp_path):
    cfg = env_config()
    out = tmp_path / "traces"
    partial = out / ".partial"
    killed = []

    def kill_the_first(index, done, total, pid):
        if not killed:
            assert non_loopback_listeners() == []  # the local cluster listens on 127.0.0.1 only
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(RuntimeError, match=r"Ray worker was lost .* run the same command again"):
        collect_on_ray(cfg, partial, workers=2, threads=1, progress=kill_the_first)
    kept = sorted(p.name for p in partial.glob("[0-9]*.npz"))
    assert 1 <= len(kept) < 4, kept
    assert main(argv(out, "--ray", "--ray-workers", "2")) == 0  # the same command: the missing prompts only
    assert same_traces(Traces.load(out), Traces.load(one_process))


def test_ray_refusals_are_one_line(tmp_path, capsys):
    """Before any model loads: vLLM recordings whose split target needs more GPUs than a worker asks, a
    GPU device with no GPU asked of Ray, and (where Ray is missing) the install line."""
    import importlib.util

    def line(extra: list[str], command: list[str] | None = None) -> str:
        code = main(command or argv(tmp_path / "t", *extra))
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert code == 2 and len(lines) == 1, lines
        return lines[0]

    assert "pass --ray-gpus 2" in line([], ["collect", "--engine", "vllm", "--out", str(tmp_path / "r"), "--ray",
                                            "--tensor-parallel-size", "2", "--ray-gpus", "1"])
    assert "pass --ray-gpus 1" in line(["--ray", "--device", "cuda"])
    if importlib.util.find_spec("ray") is None:
        assert 'pip install "draftrl[ray]"' in line(["--ray"])
