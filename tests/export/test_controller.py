"""The runtime controller: numpy + onnxruntime only, clear errors, inputs by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from draftrl.export.controller import PolicyController

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_controller_imports_neither_torch_nor_sb3(analytic_exports):
    result = run_python(f"""
        import json, sys
        import numpy as np
        from draftrl.export.controller import PolicyController
        controller = PolicyController({str(analytic_exports["onnx"])!r})
        depth, verify_size = controller.act(np.zeros(len(controller.feature_names), dtype=np.float32))
        batch = controller.act_batch(np.ones((4, len(controller.feature_names)), dtype=np.float32))
        heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"torch", "stable_baselines3", "transformers"}})
        print(json.dumps({{"heavy": heavy, "depth": int(depth), "batch": batch.tolist(),
                          "onnxruntime": "onnxruntime" in sys.modules}}))
    """)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["heavy"] == [] and report["onnxruntime"]
    assert report["depth"] in range(13) and len(report["batch"]) == 4


def test_missing_onnxruntime_names_the_install_command(analytic_exports, analytic_run, tmp_path):
    result = run_python(f"""
        import sys
        sys.modules["onnxruntime"] = None  # as if it were not installed
        from draftrl.export.controller import PolicyController
        try:
            PolicyController({str(analytic_exports["onnx"])!r})
        except ImportError as err:
            print(err)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'onnxruntime is not installed; run pip install "draftrl[export]".'
    result = run_python(f"""
        import sys
        sys.modules["onnxruntime"] = None
        from draftrl.cli import main
        sys.exit(main(["export", {str(analytic_run)!r}, "--format", "onnx", "--out", {str(tmp_path / "p.onnx")!r}]))
    """)
    assert result.returncode == 2
    assert 'onnxruntime is not installed; run pip install "draftrl[export]".' in result.stderr


def test_inputs_are_checked_and_can_be_given_by_name(analytic_exports):
    controller = PolicyController(analytic_exports["onnx"])
    names = controller.feature_names
    obs = np.asarray([3.0, 0.6, 0.5, 0.55, 0.2, 0.9], dtype=np.float32)
    by_name = dict(reversed(list(zip(names, obs.tolist()))))  # a mapping's order is not the features' order
    np.testing.assert_array_equal(controller.observation(by_name), obs)
    with pytest.raises(ValueError, match="draft_confidence"):
        controller.act(obs[:5])
    with pytest.raises(ValueError, match="missing"):
        controller.observation({"progress": 0.1})
    with pytest.raises(ValueError, match="'size' policy; use act"):
        controller.act_step(obs)
    batch = controller.act_batch(np.stack([obs, obs * 0]))
    assert batch.dtype == np.int64 and batch.shape == (2, 2)
    assert tuple(batch[0]) == controller.act(obs)
    logits = controller.logits(obs)
    assert set(logits) == {"depth", "verify_size"} and logits["depth"].shape == (1, 13)


def test_controller_refuses_other_exports(analytic_exports):
    with pytest.raises(ValueError, match="TorchScript"):
        PolicyController(analytic_exports["torchscript"])


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
