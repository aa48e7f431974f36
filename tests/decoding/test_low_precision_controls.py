"""Exactness checks that hold in bfloat16, and the negative controls they catch, on tiny random Llamas (CPU).

In bfloat16 a speculative run need not reproduce plain decoding bit for bit (near-ties flip between
reduction orders; ``draftrl.eval.agreement``), so what is checked is the per-token guarantee, in
the rows the verification forward itself computed:

- temperature 0: the engine's argmax check (``decoding.argmax_check``, every round) passes on the
  correct sampler over rounds that reject, and raises in the first round where ``off-by-one`` keeps
  a rejected draft token;
- temperature 1: the streaming monitor (``decoding.monitor``), fed the engine's own per-token
  statistics, passes the correct sampler over ``TOKENS`` tokens and raises on ``off-by-one`` and
  ``resample-from-p`` within ``CONTROL_TOKENS``. Its false-alarm rate is ``ALPHA`` over the whole stream (all four tests
  together); the correct stream's agreement statistic (drafted tokens emitted minus their exact
  expectation) also stays within ``Z_TOLERANCE`` of its standard errors;
- p and q stay float32 whatever the model dtype (``models.distribution.logits_to_probs``).

Target: a random ``LAYERS``-layer Llama over ``VOCAB`` tokens in bfloat16; drafts (bfloat16 too): its
first layer alone (accepted in part) or an independent random Llama (mostly rejected); ``SHAPES``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_lm import tiny_llama

from draftrl.decoding.argmax_check import ArgmaxViolation
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.monitor import ExactnessMonitor, ExactnessViolation, MonitorConfig
from draftrl.drafters.model import ModelDrafter

VOCAB = 16
LAYERS = 3
SCALE = 6.0  # the output layer's scale: logits spread like a small LM's, informative at temperature 1
PROMPT = [0, 1, 2, 3]
ALPHA = 1e-3  # the monitor's probability of ever raising on a correct stream
Z_TOLERANCE = 4.0  # standard errors of the agreement statistic a correct stream stays within
TOKENS = 1200  # emitted tokens of the correct temperature-1 stream (about 500 drafted positions)
#: most emitted tokens a control stream may need: resample-from-p on the sampled chain (an independent
#: draft, mostly rejected, so its bias is small) was caught at 800-3200 tokens over 10 seeds (measured),
#: one checkpoint of the monitor beyond 1200; a control stream stops at its first detection
CONTROL_TOKENS = 6400
#: (drafter samples from q, width, draft): a sampled chain (rejection sampling against q) drafted by an
#: independent random Llama (often rejected: the residual matters), and a deterministic top-2 tree (one-hot
#: q: sample y ~ p, descend iff y is a child) drafted by the target's first layer (accepted in part)
SHAPES = {"sampled-chain": (True, 1, "independent"), "deterministic-tree": (False, 2, "first-layer")}

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def build_models(device: str = "cpu") -> dict:
    """{draft kind: (target, draft)}, every model in bfloat16 on ``device`` (``test_cuda_device.py``
    runs the checks below on CUDA's bfloat16 kernels)."""
    target = tiny_llama(VOCAB, seed=0, layers=LAYERS, scale=SCALE).to(torch.bfloat16)
    first_layer = copy.deepcopy(target)  # the target's first layer only: it agrees in part
    first_layer.model.layers = first_layer.model.layers[:1]
    first_layer.config.num_hidden_layers = 1
    independent = tiny_llama(VOCAB, seed=1, layers=1, scale=SCALE).to(torch.bfloat16)
    return {"first-layer": (target.to(device), first_layer.to(device)),
            "independent": (target.to(device), independent.to(device))}


@pytest.fixture(scope="module")
def models():
    return build_models()


def _engine(models, shape: str, temperature: float, sampler: str, tokens: int) -> SpeculativeDecoder:
    sampled, _, kind = SHAPES[shape]
    target, draft = models[kind]
    config = EngineConfig(max_new_tokens=tokens, temperature=temperature, seed=0, sampler=sampler)
    return SpeculativeDecoder(target, ModelDrafter(draft, sampled), config)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_argmax_check_passes_the_correct_sampler_and_catches_off_by_one_at_temperature_0(models, shape):
    check_argmax_and_its_control(models, shape)


def check_argmax_and_its_control(models: dict, shape: str) -> None:
    """Temperature 0: the engine's argmax check passes the correct sampler over rounds that reject,
    and raises in the first round where off-by-one keeps a rejected draft token."""
    width = SHAPES[shape][1]
    engine = _engine(models, shape, 0.0, "correct", 40)
    assert engine.dtype == torch.bfloat16
    rounds = rejections = 0
    for k in range(6):
        engine.start(PROMPT + [4 + k])
        while not engine.finished:
            r = engine.round(3, None, width)
            rounds += 1
            rejections += r.num_accepted < r.verified_depth  # the walk stopped above the deepest level
    assert rejections >= 10, f"only {rejections} of {rounds} rounds rejected a draft token: the check was not exercised"

    engine = _engine(models, shape, 0.0, "off-by-one", 40)
    with pytest.raises(ArgmaxViolation, match="but the argmax of the") as err:
        for k in range(6):
            engine.start(PROMPT + [4 + k])
            while not engine.finished:
                engine.round(3, None, width)
    assert err.value.failures[0]["statistic"] == "argmax"


def _stream(models, shape: str, sampler: str, tokens: int = TOKENS, stop: bool = False) -> tuple[dict, int | None]:
    """``tokens`` emitted tokens at temperature 1 through the monitor (it keeps accumulating after a
    failure, unless ``stop``); (its report, the emitted tokens when it first raised or None)."""
    width = SHAPES[shape][1]
    engine = _engine(models, shape, 1.0, sampler, 40)
    monitor = ExactnessMonitor(MonitorConfig(alpha=ALPHA))
    first = None
    k = 0
    while monitor.report()["num_tokens"] < tokens and not (stop and first is not None):
        engine.start(PROMPT + [k % VOCAB], seed=k)
        while not engine.finished:
            try:
                monitor.update(engine.round(3, None, width).token_stats)
            except ExactnessViolation as err:
                first = err.num_tokens if first is None else first
        k += 1
    return monitor.report(), first


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_monitor_passes_the_correct_sampler_and_catches_both_controls_at_temperature_1(models, shape):
    check_monitor_and_its_controls(models, shape)


def check_monitor_and_its_controls(models: dict, shape: str) -> None:
    """Temperature 1: the monitor passes ``TOKENS`` of the correct sampler and fails each control."""
    rep, first = _stream(models, shape, "correct")
    assert first is None and rep["verdict"] == "passed", rep["verdict_reason"]
    assert rep["num_drafted_positions"] > 300
    assert abs(rep["tests"]["agreement"]["z"]) < Z_TOLERANCE
    for sampler in ("off-by-one", "resample-from-p"):
        rep, first = _stream(models, shape, sampler, CONTROL_TOKENS, stop=True)
        assert first is not None and rep["verdict"] == "failed", (sampler, rep["verdict_reason"])


def test_p_and_q_are_float32_from_bfloat16_models(models, monkeypatch):
    """The acceptance walk's p and the drafter's q are float32 (from float64 softmaxes) whatever the dtype."""
    import draftrl.decoding.acceptance as acceptance
    import draftrl.drafters.model as model_drafter

    seen: list[tuple[str, torch.dtype, torch.dtype]] = []  # (p or q, logits dtype, probabilities dtype)

    def recording(module, name):
        inner = getattr(module, "logits_to_probs")

        def wrapped(logits, params):
            out = inner(logits, params)
            seen.append((name, logits.dtype, out.dtype))
            return out

        monkeypatch.setattr(module, "logits_to_probs", wrapped)

    recording(acceptance, "p")
    recording(model_drafter, "q")
    engine = _engine(models, "sampled-chain", 1.0, "correct", 12)
    engine.start(PROMPT, seed=0)
    while not engine.finished:
        engine.round(3)
    tree = engine.drafter.propose(engine.ids, 2, 1, engine.params, engine.generator)
    assert {name for name, _, _ in seen} == {"p", "q"}
    assert all(out == torch.float32 for _, _, out in seen)
    assert all(q.dtype == torch.float32 for q in tree.q.values())
