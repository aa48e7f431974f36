"""``tensor_parallel_size`` on every vLLM path (issue 47, item 1), checked before vLLM loads (no vLLM
needed here): the engine config gives vLLM its parallelism and the head's, a serving config passes
them on, and the one-line refusals: pipeline parallelism with speculation (vLLM composes speculation
with tensor parallelism only, vLLM #57755), draftrl's stepped proposer over several workers, a draft
tensor parallelism vLLM refuses. ``export`` writes the size into the bundle's ready lines. The run on
vLLM's CPU build (two worker processes, greedy identity) is ``tests/byo/test_byo_tensor_parallel.py``.
"""

from __future__ import annotations

import json

import pytest

from draftrl.cli import main
from draftrl.config.serve import ServeConfig
from draftrl.decoding.vllm.engine import VLLMEngineConfig, check_parallelism


def test_engine_config_gives_vllm_its_parallelism():
    assert VLLMEngineConfig(method="none").parallel_args == {}  # one worker: vLLM's defaults, untouched
    split = VLLMEngineConfig(method="ngram", num_speculative_tokens=3, tensor_parallel_size=2)
    assert split.parallel_args == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1,
                                   "distributed_executor_backend": "mp"}
    assert "draft_tensor_parallel_size" not in split.speculative_config()
    recording = VLLMEngineConfig(method="none", pipeline_parallel_size=2)  # no speculation: pipeline allowed
    assert recording.parallel_args["pipeline_parallel_size"] == 2


def test_refusals_name_why():
    with pytest.raises(ValueError, match="not pipeline parallelism.*#57755"):
        VLLMEngineConfig(method="ngram", pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="method='draftrl'.*each tensor-parallel worker.*vllm-ngram"):
        VLLMEngineConfig(method="draftrl", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="only a stock eagle3 head"):
        VLLMEngineConfig(method="ngram", draft_tensor_parallel_size=1)
    with pytest.raises(ValueError, match="must be 1 or the target's tensor_parallel_size=4"):
        check_parallelism("eagle3", 4, 1, 2)
    with pytest.raises(ValueError, match="tensor_parallel_size=0 must be an integer >= 1"):
        check_parallelism("none", 0)
    check_parallelism("eagle3", 4, 1, 1)  # controls: a head on one GPU beside a target on four, or on all four
    check_parallelism("eagle3", 4, 1, 4)
    check_parallelism("custom_class", 2)  # vLLM runs a custom_class proposer in each worker
    check_parallelism("draftrl", 1)


def test_serving_config_passes_them_on():
    config = ServeConfig(tensor_parallel_size=2, draft_tensor_parallel_size=1)
    assert VLLMEngineConfig.serving(config, method="none").tensor_parallel_size == 2
    ngram = VLLMEngineConfig.serving(config, method="ngram", num_speculative_tokens=3)
    assert ngram.tensor_parallel_size == 2 and ngram.draft_tensor_parallel_size is None  # the head's only
    with pytest.raises(ValueError, match="method='draftrl'"):
        VLLMEngineConfig.serving(config, method="draftrl")


def one_line(capsys, argv) -> str:
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    return lines[0]


def test_commands_refuse_before_vllm_loads(tmp_path, capsys):
    """eval names the policy that cannot run split (its default fixed:4 steers draftrl's proposer);
    calibrate measures draftrl's proposer, so it runs on one worker; nothing is written."""
    line = one_line(capsys, ["eval", "--engine", "vllm", "--tensor-parallel-size", "2", "--out", str(tmp_path / "e")])
    assert "policy 'fixed:4'" in line and "tensor_parallel_size=2 with method='draftrl'" in line
    line = one_line(capsys, ["eval", "--engine", "vllm", "--policies", "none,vllm-ngram:3", "--set",
                             "env.pipeline_parallel_size=2", "--out", str(tmp_path / "e")])
    assert "policy 'vllm-ngram:3'" in line and "#57755" in line
    line = one_line(capsys, ["calibrate", "--engine", "vllm", "--tensor-parallel-size", "2"])
    assert "method='draftrl'" in line
    assert one_line(capsys, ["calibrate", "--tensor-parallel-size", "2"]).endswith(
        "--tensor-parallel-size is read by draftrl calibrate --engine vllm only; drop it, or add --engine vllm.")
    assert not (tmp_path / "e").exists()


def test_export_writes_the_size_into_the_ready_lines(tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["export", "vllm-eagle3:1-1:2,2-16:1", "--format", "vllm", "--out", str(out),
                 "--tensor-parallel-size", "2"]) == 0
    bundle = json.loads((out / "vllm.json").read_text())
    assert bundle["engine_args"]["tensor_parallel_size"] == 2
    assert "--tensor-parallel-size 2" in bundle["serve"] and "tensor_parallel_size=2" in bundle["python"]
    control = tmp_path / "one"
    assert main(["export", "vllm-eagle3:2", "--format", "vllm", "--out", str(control)]) == 0
    assert "tensor" not in json.loads((control / "vllm.json").read_text())["serve"]
    capsys.readouterr()
    line = one_line(capsys, ["export", "vllm-eagle3:2", "--format", "vllm", "--out", str(tmp_path / "s.json"),
                             "--tensor-parallel-size", "2"])
    assert "--tensor-parallel-size is read by --format vllm with a bundle folder" in line
