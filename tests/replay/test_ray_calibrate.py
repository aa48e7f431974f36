"""``draftrl calibrate --engine vllm --ray`` (issue 47, item 2): two Ray workers on a local cluster bound
to 127.0.0.1, each with its own vLLM engine (SmolLM2-135M, float32, CPU), share the cells out; the
merged ``vllm_costs.json`` holds every cell exactly once with its samples and one fit over all of them.
``slow`` and ``vllm`` (two vLLM engines load at once: about 2 minutes here): ``pytest -m slow
tests/replay/test_ray_calibrate.py``. The merge's negative control and the refusal run without either.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from draftrl.cli import main

TINY = ["--batch-sizes", "1,2", "--depths", "1,2", "--steps", "2", "--rounds", "1", "--prefill-lens", "32",
        "--prefill-batch-sizes", "1", "--threads", "1"]


@pytest.mark.slow
@pytest.mark.vllm
def test_two_workers_measure_every_cell_once_into_one_table(tmp_path):
    from draftrl.decoding.vllm.engine import INSTALL_CPU, vllm_available

    if importlib.util.find_spec("ray") is None:
        pytest.skip('Ray is not installed; run pip install "draftrl[ray]"')
    if not vllm_available():
        pytest.skip(f"vllm is not installed ({INSTALL_CPU})")
    out = tmp_path / "vllm_costs.json"
    assert main(["calibrate", "--engine", "vllm", *TINY, "--ray", "--ray-workers", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    cells = [(p["kind"], p["num_seqs"], p.get("depth", p.get("prompt_len"))) for p in result["points"]]
    assert cells == [("decode", 1, 1), ("decode", 1, 2), ("decode", 2, 1), ("decode", 2, 2), ("prefill", 1, 32)]
    assert all(1 <= p["samples"] <= 2 for p in result["points"])  # steps where a sequence had finished are dropped
    assert result["engine"]["ray_workers"] == 2 and result["fit"]["prefill_calibrated"]


def test_a_cell_measured_twice_is_refused(tmp_path, capsys):
    from draftrl.replay.serve_calibrate import merge_calibrations

    point = {"kind": "decode", "num_seqs": 1, "depth": 0, "tokens_verified": 1, "prompt_tokens": 0, "samples": 2,
             "seconds": [0.01, 0.011]}
    part = {"engine": {"model": "m"}, "points": [point]}
    assert [p["depth"] for p in merge_calibrations([part, {**part, "points": [{**point, "depth": 2}]}])["points"]] \
        == [0, 2]
    with pytest.raises(RuntimeError, match="measured a cell twice"):
        merge_calibrations([part, part])
    assert main(["calibrate", "--ray", "--out", str(tmp_path / "c.json")]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and "--ray shares out the cells of --engine vllm calibrations" in lines[0], lines
