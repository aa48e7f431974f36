"""``draftrl calibrate --engine vllm``: what one vLLM engine step costs on this machine.

For each batch size ``B`` (running sequences) and depth ``d`` the engine decodes ``B`` requests
whose proposer drafts exactly ``d`` tokens each (rule ``fill``: the n-gram continuation, padded
with the last token), so each step verifies ``B * (d + 1)`` tokens; the step's wall seconds are
recorded after a warm-up (the action changes one step before it is verified). The result is a
table of step seconds (median, p10, p90 over ``steps`` samples) and a least-squares fit

    seconds = base + per_seq * B + per_token * B * (d + 1)

with its residual standard deviation (the measurement noise), the cost model a serving
simulator needs (issue "Learning under load").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from draftrl.decoding.admission import StepAction

FORMAT = "draftrl-vllm-step-costs/1"


def calibrate(engine, *, batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16), depths: tuple[int, ...] = (0, 1, 2, 4, 8),
              steps: int = 8, warmup: int = 2, prompt_ids: list[int] | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Step seconds of ``engine`` (a ``VLLMEngine`` with draftrl's proposer) per (B, d)."""
    if engine.proposer is None:
        raise ValueError("calibration needs the engine built with method='draftrl' (its proposer sets the drafts).")
    if max(batch_sizes) > engine.max_num_seqs:
        raise ValueError(f"batch size {max(batch_sizes)} exceeds the engine's max_num_seqs={engine.max_num_seqs}.")
    depths = tuple(d for d in depths if d <= engine.max_depth)
    prompt_ids = prompt_ids or [int(t) for t in np.arange(400, 464)]
    rule = engine.proposer.rule
    engine.proposer.set_rule("fill")
    points = []
    try:
        for b in batch_sizes:
            for d in depths:
                engine.abort_all()
                for i in range(b):
                    engine.add_request(f"cal{b}-{d}-{i}", prompt_ids, warmup + steps + 4)
                samples = []
                for k in range(warmup + steps + 1):
                    result = engine.step(StepAction(d))
                    if k > warmup and len(result.requests) == b:
                        samples.append(result.seconds)
                engine.abort_all()
                s = np.asarray(samples)
                points.append({"num_seqs": b, "depth": d, "tokens_verified": b * (d + 1), "samples": len(s),
                               "seconds_median": float(np.median(s)), "seconds_p10": float(np.percentile(s, 10)),
                               "seconds_p90": float(np.percentile(s, 90)), "seconds": s.round(6).tolist()})
                if progress:
                    progress(f"B={b} d={d}: {np.median(s) * 1e3:.1f} ms")
    finally:
        engine.proposer.set_rule(rule)
    return {"format": FORMAT, "engine": engine.describe(), "points": points, "fit": fit(points),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def fit(points: list[dict]) -> dict[str, float]:
    """Least squares ``seconds = base + per_seq * B + per_token * tokens`` over every sample."""
    rows, y = [], []
    for p in points:
        for s in p["seconds"]:
            rows.append([1.0, p["num_seqs"], p["tokens_verified"]])
            y.append(s)
    x, y = np.asarray(rows), np.asarray(y)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ coef
    return {"base": float(coef[0]), "per_seq": float(coef[1]), "per_token": float(coef[2]),
            "residual_std": float(residual.std()), "num_samples": int(len(y))}


def predict(fit_: dict[str, float], num_seqs: int, tokens_verified: int) -> float:
    """Step seconds the fit predicts."""
    return fit_["base"] + fit_["per_seq"] * num_seqs + fit_["per_token"] * tokens_verified


@dataclass
class StepCostModel:
    """Step seconds ``base + per_seq * B + per_token * tokens`` with Gaussian measurement noise
    (``residual_std``) and a per-episode machine jitter: ``jitter_fixed`` scales ``base + per_seq * B``,
    ``jitter_token`` scales ``per_token * tokens`` (both 1 = the calibrated machine)."""

    base: float
    per_seq: float
    per_token: float
    residual_std: float = 0.0
    jitter_fixed: float = 1.0
    jitter_token: float = 1.0

    @classmethod
    def from_calibration(cls, calibration: dict[str, Any] | str | Path) -> "StepCostModel":
        """Refit on a calibration's points (``draftrl calibrate --engine vllm --out FILE``; a dict or the file)."""
        if not isinstance(calibration, dict):
            path = Path(calibration)
            if not path.is_file():
                raise ValueError(f"no step-cost calibration at {path}; run draftrl calibrate --engine vllm --out {path}.")
            from draftrl.io import read_json

            calibration = read_json(path, "calibration")
        if calibration.get("format") != FORMAT or not calibration.get("points"):
            raise ValueError(f"not a vLLM step-cost calibration (format {calibration.get('format')!r}, expected "
                             f"{FORMAT!r} with points); run draftrl calibrate --engine vllm --out FILE.")
        f = fit(calibration["points"])
        return cls(f["base"], f["per_seq"], f["per_token"], f["residual_std"])

    def mean(self, num_seqs: int, num_tokens: int) -> float:
        """Expected seconds of a step over ``num_seqs`` sequences processing ``num_tokens`` tokens."""
        return (self.base + self.per_seq * num_seqs) * self.jitter_fixed + self.per_token * num_tokens * self.jitter_token

    def seconds(self, num_seqs: int, num_tokens: int, rng: Any = None) -> float:
        """One step's seconds: the mean plus ``residual_std`` Gaussian noise drawn from ``rng``
        (None = no noise), floored at a tenth of the mean (a step never costs nothing)."""
        mean = self.mean(num_seqs, num_tokens)
        if rng is None or self.residual_std <= 0:
            return mean
        return max(0.1 * mean, mean + self.residual_std * float(rng.standard_normal()))

    def jittered(self, sigma: float, rng: Any) -> "StepCostModel":
        """This model on another machine: each jitter factor is a mean-one lognormal of ``sigma``
        drawn from ``rng`` (TraceReplay-v0's ``cost_jitter``)."""
        if sigma <= 0:
            return self
        draw = lambda: math.exp(sigma * float(rng.standard_normal()) - 0.5 * sigma * sigma)  # noqa: E731
        return StepCostModel(self.base, self.per_seq, self.per_token, self.residual_std, draw(), draw())
