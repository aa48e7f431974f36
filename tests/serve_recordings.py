"""Synthetic serving recordings and calibrations: what the serving replay's tests stand in for the
vLLM ones with (``tests/real_vllm`` checks the replay against vLLM itself)."""

from __future__ import annotations

import numpy as np

from draftrl.prompts import Prompt
from draftrl.replay.recordings import Recording, Recordings
from draftrl.replay.serve_calibrate import FORMAT, StepCostModel

COST = StepCostModel(base=0.03, per_seq=0.002, per_token=0.0005, residual_std=0.002)
TOKENS = 40
LOOKAHEAD = 9


def synthetic_recordings(num: int = 12, seed: int = 0) -> Recordings:
    """Requests whose continuations repeat pieces of their prompts (the n-gram drafter matches
    some positions, fails on others), some ending early at 'EOS'."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(num):
        motif = rng.integers(0, 60, size=10).tolist()
        prompt = motif * 2 + rng.integers(0, 60, size=int(rng.integers(5, 30))).tolist()
        cont: list[int] = []
        while len(cont) < TOKENS + LOOKAHEAD:
            cont += motif[: int(rng.integers(2, 10))] + rng.integers(60, 90, size=int(rng.integers(1, 4))).tolist()
        length = TOKENS + LOOKAHEAD if i % 4 else int(rng.integers(5, TOKENS))  # every 4th ends at 'EOS'
        recs.append(Recording(Prompt(f"p{i:02d}", ("en", "it", "zh", "es")[i % 4], ("qa", "code_edit")[i % 2],
                                     "tune", f"prompt {i}", TOKENS), prompt, TOKENS, cont[:length], LOOKAHEAD))
    return Recordings(recs, {"config": {"target": "smollm2-135m", "chat_template": True}})


def synthetic_calibration(coef, sd, seed=0, prefill=None):
    """Decode points of ``coef = (base, per_seq, per_token)`` and, given ``prefill`` (seconds per
    prompt token), prefill points of 1 and 4 prompts of 32..384 tokens."""
    rng = np.random.default_rng(seed)
    points = []
    for b in (1, 2, 4, 8, 16):
        for d in (0, 1, 2, 4, 8):
            tokens = b * (d + 1)
            s = coef[0] + coef[1] * b + coef[2] * tokens + sd * rng.standard_normal(8)
            points.append({"kind": "decode", "num_seqs": b, "depth": d, "tokens_verified": tokens,
                           "prompt_tokens": 0, "seconds": s.tolist()})
    for b in (1, 4) if prefill is not None else ():
        for length in (32, 128, 384):
            s = coef[0] + coef[1] * b + prefill * b * length + sd * rng.standard_normal(8)
            points.append({"kind": "prefill", "num_seqs": b, "prompt_len": length, "tokens_verified": 0,
                           "prompt_tokens": b * length, "seconds": s.tolist()})
    return {"format": FORMAT, "points": points}
