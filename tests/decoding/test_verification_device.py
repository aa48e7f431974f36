"""One generator on one device per round, and the agreement expectation from normalised p (issue 14).

On this CPU-only machine no second device exists, so the device tests (1) check the generator the
engine makes and hands to the drafter, (2) give the verification walk a generator that claims to
live on CUDA and expect the one-line refusal, and (3) record, in a real sampled-tree round, that
every p, q, children tensor and generator that verification and drafting receive share one
device. ``test_cuda_device.py`` runs the real thing on a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_lm import TinyLM, draft_of

from draftrl.decoding import acceptance
from draftrl.decoding.acceptance import accept_tree
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters import model as drafter_model
from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, check_generator_device, generator_for, logits_to_probs

PARAMS = SamplingParams(temperature=1.0)


def test_generator_for_is_seeded_on_the_device():
    gen = generator_for(torch.device("cpu"), 7)
    assert gen.device == torch.device("cpu")
    assert torch.equal(torch.rand(4, generator=gen), torch.rand(4, generator=torch.Generator().manual_seed(7)))


def test_a_generator_on_another_device_is_refused_with_the_fix():
    cpu = torch.Generator()
    check_generator_device(cpu, torch.device("cpu"))
    check_generator_device(None, torch.device("cuda", 0))  # the global generator: torch picks the device
    with pytest.raises(ValueError, match=r"generator is on cpu but the tensors are on cuda:0.*generator_for"):
        check_generator_device(cpu, torch.device("cuda", 0))
    on_gpu1 = SimpleNamespace(device=torch.device("cuda", 1))
    with pytest.raises(ValueError, match="cuda:1"):
        check_generator_device(on_gpu1, torch.device("cuda", 0))


def test_verification_refuses_a_generator_on_another_device_before_drawing():
    """A CUDA generator with CPU logits (faked: no GPU here) is refused up front, naming the fix."""
    tree = DraftTree()
    tree.add(1, -1, 0.0)
    logits = torch.randn(2, 5)
    fake_cuda = SimpleNamespace(device=torch.device("cuda", 0))
    with pytest.raises(ValueError, match="generator_for"):
        accept_tree(tree, logits, PARAMS, fake_cuda)


def test_the_engine_generator_lives_on_the_target_device(monkeypatch):
    """The engine asks for its generator on the device of the target's parameters (faked on meta)."""
    made = []

    def record(device, seed):
        made.append((torch.device(device), seed))
        return torch.Generator().manual_seed(seed)

    monkeypatch.setattr("draftrl.decoding.engine.generator_for", record)
    target = torch.nn.Linear(2, 2, device="meta")
    SpeculativeDecoder(target, None, EngineConfig(seed=5))
    assert made == [(torch.device("meta"), 5)]


def test_the_drafter_draws_children_on_the_generator_device(monkeypatch):
    """q is moved to the generator's device before the children are drawn (faked: meta)."""
    seen = []

    def fake_sample(q, generator, num_samples=None):
        seen.append((q.device, generator.device))
        return torch.zeros(num_samples, dtype=torch.long, device=q.device)

    monkeypatch.setattr(drafter_model, "sample", fake_sample)
    drafter = ModelDrafter(TinyLM(5), sampled=True)
    _, _, q = drafter._children(torch.randn(5), 2, PARAMS, SimpleNamespace(device=torch.device("meta")))
    assert seen == [(torch.device("meta"), torch.device("meta"))]
    assert q.device == torch.device("meta")


def test_a_sampled_tree_round_keeps_every_tensor_on_one_device(monkeypatch):
    """Spy on a real round: the drafter's draws and each node's verification see one device."""
    calls = []
    real_node, real_sample = acceptance.verify_node_sampled_batch, drafter_model.sample

    def spy_node(p, children, q, generator, method="correct", **kwargs):
        calls.append(("verify", p.device, children.device, q.device, generator.device))
        return real_node(p, children, q, generator, method, **kwargs)

    def spy_sample(q, generator, num_samples=None):
        calls.append(("draft", q.device, generator.device))
        return real_sample(q, generator, num_samples)

    monkeypatch.setattr(acceptance, "verify_node_sampled_batch", spy_node)
    monkeypatch.setattr(drafter_model, "sample", spy_sample)
    target = TinyLM(5)
    engine = SpeculativeDecoder(target, ModelDrafter(draft_of(target, 0.3, 1), sampled=True),
                                EngineConfig(max_new_tokens=8, temperature=1.0))
    engine.start([0, 1])
    for _ in range(3):
        engine.round(2, None, 2)
    assert {c[0] for c in calls} == {"draft", "verify"}
    assert all(set(c[1:]) == {engine.device} for c in calls), calls
    assert engine.generator.device == engine.device


def test_agree_expected_of_deterministic_children_uses_normalised_p():
    """Rows that do not sum to 1 (float32 rounding, here exaggerated) are normalised in float64."""
    tree = DraftTree()
    tree.add(1, -1, 0.0)
    tree.add(3, -1, -1.0)
    probs = logits_to_probs(torch.tensor([[0.5, 1.0, -0.2, 0.3], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), PARAMS)
    scaled = probs * 0.8  # what the verification walk must treat as probs itself
    verdict = accept_tree(tree, torch.zeros_like(probs), PARAMS, torch.Generator().manual_seed(0), probs=scaled)
    expected = float(scaled[0, [1, 3]].double().sum() / scaled[0].double().sum())
    assert expected > 0.5 and float(scaled[0, [1, 3]].sum()) < 0.5  # the unnormalised sum is far off
    assert verdict.stats.agree_expected[0] == pytest.approx(expected, rel=1e-12)
