"""The sampled serving replay's law against real vLLM (issue 46): per-step accepted drafts of the
n-gram proposer at a fixed depth cap, replayed from continuations vLLM sampled without speculation
(``draftrl collect --engine vllm`` at T = 0.7 and 1.0), match vLLM's own speculative steps on the
same requests (other seeds); the greedy continuation replayed at T > 0 is rejected by the same test.

The test (``serve_recordings.accepted_law_test``): Pearson's chi-square between the two histograms of
accepted drafts per verified step, its p value from swapping whole requests between the two sides
(exact under the null; steps of one request are not independent). Power: the negative control is
the alternative it must reject, on the same requests and steps.
"""

from __future__ import annotations

import pytest
from serve_recordings import accepted_law_test

from draftrl.config.serve import ServeConfig
from draftrl.config.workload import SamplingClass
from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.control import rule_controller
from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine
from draftrl.replay.recordings import record_workload
from draftrl.replay.serve_calibrate import StepCostModel
from draftrl.replay.serve_engine import ReplayEngine

CONFIG = ServeConfig(split="heldout", languages=("en", "it", "zh", "es"), tasks=("code_edit", "summarize"),
                     limit_per_group=2, max_new_tokens=32, shuffle=False,
                     temperature_mix={0: 1.0, 0.7: 1.0, 1.0: 1.0}, seed=0)
REPEATS = 3  # requests per prompt and temperature, each following its own recorded continuation
DEPTH = 4
ALPHA = 1e-3


@pytest.fixture(scope="module")
def recordings(vllm_tokenizer):
    return record_workload(CONFIG, engine=shared_engine(VLLMEngineConfig(method="none")), tokenizer=vllm_tokenizer,
                           continuations=REPEATS)


def _requests(recordings):
    """``(request id, prompt ids, repeat)``: every prompt ``REPEATS`` times."""
    return [(f"{r.prompt.id}/{k}", r.prompt_ids, k) for r in recordings.requests if r.temperature == 0
            for k in range(REPEATS)]


def _steps(engine, requests, sampling: SamplingClass, seeds) -> dict[str, list[tuple[int, int]]]:
    """Every request's ``(drafted, accepted)`` per step, all added at once at ``sampling``, depth cap
    ``DEPTH`` with no budget, the proposer's ``match`` rule."""
    out = {rid: [] for rid, _, _ in requests}
    for (rid, ids, k), seed in zip(requests, seeds):
        engine.add_request(rid, ids, CONFIG.max_new_tokens, temperature=sampling.temperature, seed=seed)
    while engine.has_unfinished_requests():
        for r in engine.step(StepAction(DEPTH, None)).requests:
            out[r.request_id].append((r.num_verified, r.num_accepted))
    return out


@pytest.mark.parametrize("temperature", [pytest.param(0.7, marks=pytest.mark.slow), 1.0])  # T0.7: pytest -m slow
def test_replayed_acceptance_follows_vllms_law_at_temperature(recordings, temperature):
    sampling = SamplingClass(temperature)
    requests = _requests(recordings)
    real_engine = shared_engine(VLLMEngineConfig(method="draftrl"))
    real_engine.set_controller(rule_controller("match"))
    real = _steps(real_engine, requests, sampling, [1_000_003 + i for i in range(len(requests))])

    def replay(at: SamplingClass):
        engine = ReplayEngine(recordings, StepCostModel(0.05, 0.002, 0.001), max_depth=real_engine.max_depth,
                              max_num_seqs=real_engine.max_num_seqs, max_model_len=real_engine.config.max_model_len,
                              rule="match")
        return _steps(engine, requests, at, [k for _, _, k in requests])  # seed % REPEATS = k

    ids = [rid for rid, _, _ in requests]
    sampled, greedy = replay(sampling), replay(SamplingClass(0.0))
    statistic, pvalue, dof = accepted_law_test([real[i] for i in ids], [sampled[i] for i in ids], DEPTH)
    control = accepted_law_test([real[i] for i in ids], [greedy[i] for i in ids], DEPTH)
    verified = [sum(d > 0 for i in ids for d, _ in side[i]) for side in (real, sampled, greedy)]
    mean = [sum(a for i in ids for d, a in side[i] if d) / max(1, n) for side, n in zip((real, sampled, greedy),
                                                                                      verified)]
    print(f"T={temperature}: {len(ids)} requests; verified steps vLLM/replay/greedy replay {verified}; accepted per "
          f"verified step {mean[0]:.3f}/{mean[1]:.3f}/{mean[2]:.3f}; replay chi2={statistic:.1f} dof={dof} "
          f"p={pvalue:.3f}; greedy control chi2={control[0]:.1f} p={control[1]:.4f}")
    assert min(verified[:2]) >= 200
    assert pvalue > ALPHA
    assert control[1] < ALPHA  # the test has the power to reject the greedy continuation at this size
