"""GPU checks: drafting and verification draw on the GPU with one CUDA generator (issue 14), and the
bfloat16 exactness checks hold on CUDA's bfloat16 kernels (issue 40).

Skipped without CUDA. ``benchmarks/gpu_check.sh`` (and ``gpu_serve.sh``) run it with

    python -m pytest -q -p no:cacheprovider -m "slow or not slow" tests/decoding/test_cuda_device.py

a law test on the tiny models; ``test_low_precision_controls.py``'s argmax check and streaming monitor,
each with its negative controls, on its tiny bfloat16 Llamas moved to the GPU; then SmolLM2-135M sampled
trees (fetched from PyPI: ``gpu_check.sh``, offline, deselects it).
"""

from __future__ import annotations

import pytest
import test_low_precision_controls as low_precision
import torch
from test_engine_law import LENGTH, NOISE, PROMPT, TEMPERATURE, run_requests
from tiny_lm import TinyLM, chisquare_law, draft_of, sequence_law

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.model import ModelDrafter
from draftrl.models.distribution import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ALPHA = 1e-4


@pytest.mark.parametrize("shape", ["chain", "deterministic-tree", "sampled-tree"])
def test_engine_law_on_cuda(shape):
    target = TinyLM(3, seed=0)
    law = sequence_law(target, PROMPT, LENGTH, SamplingParams(temperature=TEMPERATURE))
    models = (target.cuda(), draft_of(target, noise=NOISE, seed=1).cuda())
    good = run_requests(models, shape, "correct", 2000).heads
    assert chisquare_law(good, law)[0] > ALPHA
    bad = run_requests(models, shape, "resample-from-p", 500).heads
    assert chisquare_law(bad, law)[0] < ALPHA


@pytest.fixture(scope="module")
def bf16_on_cuda():
    return low_precision.build_models("cuda")


@pytest.mark.parametrize("shape", list(low_precision.SHAPES))
def test_bfloat16_argmax_check_and_its_control_on_cuda(bf16_on_cuda, shape):
    """cuBLAS reduces bfloat16 in its own orders: every emitted token is still its verifying row's argmax,
    and off-by-one is still caught."""
    low_precision.check_argmax_and_its_control(bf16_on_cuda, shape)


@pytest.mark.parametrize("shape", list(low_precision.SHAPES))
def test_bfloat16_monitor_and_its_controls_on_cuda(bf16_on_cuda, shape):
    """Temperature 1 in bfloat16 on CUDA: the monitor passes the correct sampler and fails off-by-one and
    resample-from-p."""
    low_precision.check_monitor_and_its_controls(bf16_on_cuda, shape)


def test_smollm2_sampled_tree_rounds_on_cuda():
    """Real model on the GPU: every q, the generator and the verification walk stay on the GPU,
    and a seed reproduces the output."""
    from draftrl.models import load_model

    model = load_model("smollm2-135m", device="cuda").model
    ids = [1, 2, 3, 4, 5]
    outputs = []
    for _ in range(2):
        engine = SpeculativeDecoder(model, ModelDrafter(model, sampled=True),
                                    EngineConfig(max_new_tokens=24, temperature=1.0, seed=3))
        assert engine.generator.device.type == "cuda"
        engine.start(ids)
        tree = engine.drafter.propose(engine.ids, 3, 3, engine.params, engine.generator)
        engine.drafter.commit(engine.ids, [])
        assert all(q.device.type == "cuda" for q in tree.q.values())
        engine.rewind(len(engine.ids))
        engine.start(ids)
        while not engine.finished:
            engine.round(3, None, 3)
        outputs.append(engine.output_ids)
    assert len(outputs[0]) == 24 and outputs[0] == outputs[1]
