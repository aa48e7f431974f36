"""``draftrl calibrate --engine vllm``: what one vLLM engine step costs on this machine.

For each batch size ``B`` (running sequences) and depth ``d`` the engine decodes ``B`` requests
whose proposer drafts exactly ``d`` tokens each (the rule ``fill``,
:class:`~draftrl.decoding.vllm.control.FillRule`: the n-gram continuation, padded with the last
token; the proposer's own controller is put back afterwards), so each step verifies
``B * (d + 1)`` tokens; the step's wall seconds are recorded after a warm-up (the action changes
one step before it is verified). Prefill is timed too: ``B`` fresh requests of ``P`` random
prompt tokens each (never seen before, so no cached prefix) admitted together, and the seconds of
the one step that runs their prompts. The cells are measured in ``rounds`` passes over a shuffled
order, so a burst of load on a shared machine spreads over many cells instead of bending one. The
result is a table of step seconds (median, p10, p90 per cell) and a non-negative least-squares fit
over the cells' medians (:func:`fit`; a physically impossible ordinary fit is named in its ``problem``)

    seconds = base + per_seq * B + per_token * B * (d + 1) + per_prefill_token * B * P

(``P = 0`` in decode steps, ``d + 1 = 0`` in prefill steps) with its residual standard deviation
(the measurement noise), the cost model the serving replay needs (issue "Learning under load").

With a proposer that runs an EAGLE-3 head (``--drafter eagle3[:PATH]``, route (b) of serving a head),
every decode cell with ``d >= 1`` is measured twice, interleaved on the same engine: ``decode`` with
the head idle (n-gram lookup fills the drafts, the head only takes its rows) and ``head`` with the
head drafting all ``d`` levels for all ``B`` requests. The difference of the two medians is what the
head's drafting adds to a step (:func:`head_table`), the term the replay engine charges when it replays
the head's proposals; measured side by side so that machine drift does not enter it.
Why a separate prefill slope: one prompt token costs far less than one verified decode token
(the prompt runs as one large matrix product); charging prompts at the decode slope put the
replayed time to first token ~30x above vLLM's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.control import FillRule

FORMAT = "draftrl-vllm-step-costs/1"


@dataclass(frozen=True)
class CalibrationSizes:
    """The cells :func:`calibrate` measures (``draftrl calibrate --engine vllm``'s defaults)."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    """running sequences per decode cell"""
    depths: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
    """draft tokens per sequence per decode cell: every depth of the serving action grid, since a
    CPU step is not linear in rows (measured on an Intel Xeon: depth 6 interpolated between 4 and
    8 was priced so cheap that the replay gave it 1.78x no speculation at batch 1, vLLM 1.65x)"""
    steps: int = 8
    """timed steps per cell, over all rounds"""
    prefill_lens: tuple[int, ...] = (32, 128, 384)
    """prompt tokens per prefill cell"""
    prefill_batch_sizes: tuple[int, ...] = (1, 4)
    """prompts prefilled together"""
    rounds: int = 4
    """shuffled passes over the cells: a burst of load then bends one sample of many cells, which
    their medians drop, instead of one cell (4 x 2 steps costs what 2 x 4 did)"""


def calibration_engine(model: str, sizes: CalibrationSizes, *, dtype: str = "float32", threads: int = 1,
                       drafter: str | None = None, gpu_memory_utilization: float | None = None,
                       enforce_eager: bool | None = None, tensor_parallel_size: int = 1):
    """The process's shared engine for ``model`` with draftrl's proposer, deep and wide enough for
    ``sizes``; ``drafter`` a head spec (``eagle3[:PATH]``) adds the head's cells. ``enforce_eager``
    None measures what production runs (CUDA graphs on a GPU; eager on CPU, and wherever the proposer
    runs a head: ``VLLMEngineConfig.enforce_eager``)."""
    from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

    extra = {"drafter": drafter} if drafter else {}
    return shared_engine(VLLMEngineConfig(model=model, method="draftrl", num_speculative_tokens=max(sizes.depths),
                                          dtype=dtype, max_num_seqs=max(sizes.batch_sizes + sizes.prefill_batch_sizes),
                                          threads=threads, gpu_memory_utilization=gpu_memory_utilization,
                                          enforce_eager=enforce_eager, tensor_parallel_size=tensor_parallel_size,
                                          **extra), max_engines=1)


def calibrate_model(model: str, sizes: CalibrationSizes, *, seed: int = 0,
                    progress: Callable[[str], None] | None = None, **engine: Any) -> dict[str, Any]:
    """:func:`calibrate` the engine of :func:`calibration_engine` (``engine``: its keywords)."""
    return calibrate(calibration_engine(model, sizes, **engine), **asdict(sizes), seed=seed, progress=progress)


def calibrate(engine, *, batch_sizes: tuple[int, ...] = CalibrationSizes.batch_sizes,
              depths: tuple[int, ...] = CalibrationSizes.depths, steps: int = CalibrationSizes.steps, warmup: int = 2,
              prompt_ids: list[int] | None = None, prefill_lens: tuple[int, ...] = CalibrationSizes.prefill_lens,
              prefill_batch_sizes: tuple[int, ...] = CalibrationSizes.prefill_batch_sizes,
              rounds: int = CalibrationSizes.rounds, seed: int = 0,
              progress: Callable[[str], None] | None = None, shard: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Step seconds of ``engine`` (a ``VLLMEngine`` with draftrl's proposer) per decode cell
    (B, d) and per prefill cell (B, P) (module docstring); ``steps`` samples per cell in all.

    ``shard=(w, W)``: only the ``w``-th of every ``W`` (B, d) or (B, P) pairs (a Ray worker's,
    ``draftrl.replay.ray_calibrate``; a decode cell and its head cell stay together, measured side by
    side); :func:`merge_calibrations` joins the shards."""
    if engine.proposer is None:
        raise ValueError("calibration needs the engine built with method='draftrl' (its proposer sets the drafts).")
    if max(batch_sizes) > engine.max_num_seqs or max(prefill_batch_sizes, default=1) > engine.max_num_seqs:
        raise ValueError(f"batch size {max(batch_sizes + tuple(prefill_batch_sizes))} exceeds the engine's "
                         f"max_num_seqs={engine.max_num_seqs}.")
    if max(prefill_lens, default=0) + 2 > engine.config.max_model_len:
        raise ValueError(f"prefill length {max(prefill_lens)} leaves no room below max_model_len="
                         f"{engine.config.max_model_len}; lower --prefill-lens.")
    if rounds < 1 or steps < rounds:
        raise ValueError(f"steps={steps} must be >= rounds={rounds} >= 1 (each round takes steps / rounds samples).")
    depths = tuple(d for d in depths if d <= engine.max_depth)
    prompt_ids = prompt_ids or [int(t) for t in np.arange(400, 464)]
    rng = np.random.default_rng(seed)
    cells = [("decode", b, d) for b in batch_sizes for d in depths] + \
        [("prefill", b, p) for b in prefill_batch_sizes for p in prefill_lens]
    samples: dict[tuple, list[float]] = {c: [] for c in cells}
    proposer = engine.proposer
    has_head = getattr(proposer, "head", None) is not None
    if has_head:
        cells += [("head", b, d) for b in batch_sizes for d in depths if d >= 1]
        samples.update({c: [] for c in cells if c[0] == "head"})
    pairs = list(dict.fromkeys((kind == "prefill", b, x) for kind, b, x in cells))
    mine = set(pairs[shard[0]::shard[1]])
    cells = [c for c in cells if (c[0] == "prefill", c[1], c[2]) in mine]
    previous, fill = proposer.controller, FillRule()
    engine.set_controller(fill)
    try:
        for r in range(rounds):
            per_round = steps // rounds + (1 if r < steps % rounds else 0)
            for i in rng.permutation(len(cells)):
                kind, b, x = cells[i]
                if has_head:  # the head drafts in the head cells only (its largest step: none elsewhere)
                    fill.head_max_batch = None if kind == "head" else 0
                measure = _prefill_samples if kind == "prefill" else _decode_samples
                samples[cells[i]] += measure(engine, b, x, per_round, warmup, prompt_ids, rng)
    finally:
        engine.abort_all()
        engine.set_controller(previous)
    points = []
    for kind, b, x in cells:
        s = np.asarray(samples[(kind, b, x)])
        point = {"kind": kind, "num_seqs": b}
        point.update({"depth": x, "tokens_verified": b * (x + 1), "prompt_tokens": 0} if kind != "prefill"
                     else {"prompt_len": x, "tokens_verified": 0, "prompt_tokens": b * x})
        point.update({"samples": len(s), "seconds_median": float(np.median(s)),
                      "seconds_p10": float(np.percentile(s, 10)), "seconds_p90": float(np.percentile(s, 90)),
                      "seconds": s.round(6).tolist()})
        points.append(point)
        if progress:
            what = {"decode": f"d={x}", "head": f"head d={x}"}.get(kind, f"prefill P={x}")
            progress(f"B={b} {what}: {np.median(s) * 1e3:.1f} ms")
    result = _calibration(engine.describe(), points, head=has_head)
    if progress and result["fit"]["problem"]:
        progress(f"warning: {result['fit']['problem']}")
    return result


def merge_calibrations(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One calibration from the shards of :func:`calibrate` (``shard``), measured by engines on one
    device kind: the points in the one-engine order, each cell exactly once (else a one-line
    ``RuntimeError``), the fit and the head's table over all of them."""
    kinds = ("decode", "prefill", "head")
    points = sorted((p for part in parts for p in part["points"]),
                    key=lambda p: (kinds.index(p["kind"]), p["num_seqs"], p.get("depth", p.get("prompt_len"))))
    cells = [(p["kind"], p["num_seqs"], p.get("depth", p.get("prompt_len"))) for p in points]
    if len(cells) != len(set(cells)):
        raise RuntimeError(f"calibration shards measured a cell twice ({len(cells) - len(set(cells))} repeated): "
                           "run the command again.")
    return _calibration({**parts[0]["engine"], "ray_workers": len(parts)}, points,
                        head=any(p["kind"] == "head" for p in points))


def _calibration(engine: dict[str, Any], points: list[dict], *, head: bool) -> dict[str, Any]:
    """The calibration file's content from its points: the fit over all of them, the head's table
    (``head``: an engine whose proposer drafts with a head), the time."""
    result = {"format": FORMAT, "engine": engine, "points": points, "fit": fit(points)}
    if head:
        result["head"] = {str(b): dict(zip(["levels", "seconds"], row)) for b, row in head_table(points).items()}
    return {**result, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _decode_samples(engine, b: int, d: int, n: int, warmup: int, prompt_ids: list[int], rng) -> list[float]:
    """``n`` step seconds with ``b`` requests each verifying ``d`` drafts, after ``warmup`` steps."""
    engine.abort_all()
    for i in range(b):
        engine.add_request(f"cal{b}-{d}-{i}", prompt_ids, warmup + n + 4)
    out = []
    for k in range(warmup + n + 1):
        result = engine.step(StepAction(d))
        if k > warmup and len(result.requests) == b:
            out.append(result.seconds)
    engine.abort_all()
    return out


def _prefill_samples(engine, b: int, p: int, n: int, warmup: int, prompt_ids: list[int], rng) -> list[float]:
    """``n`` seconds of a step that runs ``b`` fresh prompts of ``p`` random tokens (and nothing else)."""
    out = []
    for k in range(n):
        engine.abort_all()
        for i in range(b):
            engine.add_request(f"pre{b}-{p}-{k}-{i}", rng.integers(1000, 30000, size=p).tolist(), 2)
        result = engine.step(StepAction(0))
        if len(result.requests) != b:  # a prompt was split over steps (chunked prefill): not this cell's cost
            raise ValueError(f"{b} prompts of {p} tokens did not run in one step; lower --prefill-lens or the "
                             "prefill batch sizes below vLLM's max_num_batched_tokens.")
        out.append(result.seconds)
    engine.abort_all()
    return out


def _is_decode(point: dict) -> bool:
    """A decode cell: no prompt prefilled and not a head cell (those price the head, not the target)."""
    return not point.get("prompt_tokens", 0) and point.get("kind") != "head"


#: the fit's decode terms, in order (every one is >= 0 on a real machine)
TERMS: tuple[str, ...] = ("base", "per_seq", "per_token")


def fit(points: list[dict], quantile: float = 0.5) -> dict[str, Any]:
    """Non-negative least squares ``seconds = base + per_seq * B + per_token * tokens`` over the
    decode cells' medians (``quantile`` of each cell's samples; ``residual_std``: every decode sample's
    residual), then
    ``per_prefill_token`` (>= 0) over the prefill samples' seconds beyond ``base + per_seq * B``.

    Why medians and non-negative: the cells are measured in interleaved rounds, so a burst of load
    bends a few samples of many cells; their medians drop it, where a fit over every sample
    followed it (a calibration taken at load average 8 fitted a negative per-step base and the
    replay then ranked policies against vLLM at Kendall tau -0.46). No coefficient of a step's cost
    is negative on a real machine, so the ordinary fit is kept beside (``unconstrained``) and a
    negative one named in ``problem`` (:func:`fit_problem`), the fitted terms held at >= 0.
    Decode first and alone: prefill steps last seconds and vary by hundreds of milliseconds, and
    fitted together they bent the decode terms (measured here: a plain batch-1 step predicted 40%
    too slow). A calibration without prefill points (older files) gets ``per_prefill_token = 0``
    and ``prefill_calibrated = False``: a prompt then costs one sequence."""
    from scipy.optimize import nnls

    decode = [p for p in points if _is_decode(p)]
    if not decode:
        raise ValueError("the step-cost calibration has no decode cells; run draftrl calibrate --engine vllm with "
                         "--depths.")
    x = np.asarray([[1.0, p["num_seqs"], p["tokens_verified"]] for p in decode], dtype=float)
    medians = np.asarray([cell_seconds(p, quantile) for p in decode])
    unconstrained, *_ = np.linalg.lstsq(x, medians, rcond=None)
    coef, _ = nnls(x, medians)
    residual = np.concatenate([np.asarray(p["seconds"], dtype=float) - row @ coef for p, row in zip(decode, x)])
    pre_rows, pre_y = [], []
    for p in points:
        if p.get("prompt_tokens", 0):
            pre_rows += [(p["num_seqs"], p["prompt_tokens"])] * len(p["seconds"])
            pre_y += list(p["seconds"])
    per_prefill = 0.0
    if pre_rows:
        seqs, prompt = np.asarray(pre_rows, dtype=float).T
        beyond = np.asarray(pre_y) - coef[0] - coef[1] * seqs
        per_prefill = max(0.0, float(beyond @ prompt / (prompt @ prompt)))
    result: dict[str, Any] = {**{t: float(c) for t, c in zip(TERMS, coef)}, "per_prefill_token": per_prefill,
                              "prefill_calibrated": bool(pre_rows), "residual_std": float(residual.std()),
                              "num_samples": int(len(residual) + len(pre_y)),
                              "unconstrained": {t: float(c) for t, c in zip(TERMS, unconstrained)}}
    result["problem"] = fit_problem(result)
    return result


def fit_problem(fit_: dict[str, Any]) -> str | None:
    """One line naming the physically impossible coefficients of ``fit_``'s ordinary least squares
    (``unconstrained``: a negative base, per-sequence or per-token cost) and the fix, or None.
    Such a fit means the measurement noise (load from other processes) exceeds what the cells
    resolve; the held non-negative fit is then a guess, not a measurement."""
    negative = {t: v for t, v in fit_.get("unconstrained", {}).items() if v < 0}
    if not negative:
        return None
    terms = ", ".join(f"{t} {v * 1e3:.2f} ms" for t, v in negative.items())
    return (f"the step-cost fit is physically impossible ({terms} < 0; residual sd "
            f"{fit_['residual_std'] * 1e3:.1f} ms): calibrate again on an idle machine (uptime's load average "
            "below the cores) or with more steps (--steps, --rounds).")


def cell_seconds(point: dict, quantile: float = 0.5) -> float:
    """One cell's step seconds: the ``quantile`` of its samples (0.5: the median). Why a lower one
    on a loaded machine: other jobs only ever add time to a step, so the fast end of a cell's
    samples keeps the cost's shape where the median follows the load (a calibration at load
    average 9.7 on 2 cores: medians of 89 ms plain vs 45 ms verifying 4 tokens at batch 1, and
    141 ms plain vs 81 ms verifying 16 at batch 8; their 10% quantiles grow with tokens at batch
    4, 8 and 16 cell by cell)."""
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile={quantile} must be in [0, 1] (0.5: each cell's median).")
    return float(np.quantile(point["seconds"], quantile))


def decode_table(points: list[dict], quantile: float = 0.5) -> dict[int, tuple[list[int], list[float]]]:
    """Batch size -> (tokens verified, seconds) of the decode cells, as measured (each cell's
    :func:`cell_seconds` at ``quantile``, the median by default). Why not
    made non-decreasing in tokens: on vLLM 0.32's CPU runner more tokens do cost less at small
    batches, reproducibly (a 2-core AMD EPYC, two calibrations: 1 request verifying 2 tokens 53 and
    57 ms, 3-5 tokens 38-41 ms, 1 token 46-49 ms), and the running maximum that flattened it priced
    depths 2-4 as depth 1, so the replay's best fixed depth at concurrency 1 was 8 (1.69x no
    speculation) where vLLM's was 4 (1.82x; the table as measured gives 1.79x)."""
    rows: dict[int, list[tuple[int, float]]] = {}
    for p in points:
        if _is_decode(p):
            rows.setdefault(int(p["num_seqs"]), []).append((int(p["tokens_verified"]), cell_seconds(p, quantile)))
    return {b: ([t for t, _ in sorted(cells)], [s for _, s in sorted(cells)]) for b, cells in sorted(rows.items())}


def head_table(points: list[dict]) -> dict[int, tuple[list[int], list[float]]]:
    """Head-drafting batch size -> (levels, seconds the head's drafting adds to a step): per cell,
    the ``head`` median minus the ``decode`` median of the same (B, d), floored at 0 and made
    non-decreasing in levels (a running maximum: a difference of two medians is noisier than either,
    and one more level of the head's forward never costs less); empty for a calibration without a head."""
    medians = {(p.get("kind"), int(p["num_seqs"]), int(p["depth"])): float(np.median(p["seconds"]))
               for p in points if p.get("kind") in ("decode", "head")}
    rows: dict[int, list[tuple[int, float]]] = {}
    for (kind, b, d), seconds in sorted(medians.items()):
        if kind == "head" and ("decode", b, d) in medians:
            rows.setdefault(b, []).append((d, max(0.0, seconds - medians[("decode", b, d)])))
    return {b: ([d for d, _ in cells], np.maximum.accumulate([s for _, s in cells]).tolist())
            for b, cells in rows.items()}


def predict(fit_: dict[str, float], num_seqs: int, tokens_verified: int, prompt_tokens: int = 0) -> float:
    """Step seconds the fit predicts."""
    return (fit_["base"] + fit_["per_seq"] * num_seqs + fit_["per_token"] * tokens_verified
            + fit_.get("per_prefill_token", 0.0) * prompt_tokens)


@dataclass
class StepCostModel:
    """Step seconds of ``B`` sequences verifying ``tokens`` decode tokens and prefilling
    ``prompt_tokens``: ``fixed + decode + per_prefill_token * prompt_tokens`` with ``fixed = base +
    per_seq * B``, Gaussian measurement noise (``residual_std``) and a per-episode machine jitter
    (``jitter_fixed`` scales ``fixed``, ``jitter_token`` the rest; both 1 = the calibrated machine).

    ``decode`` is ``per_token * tokens`` or, with a ``table`` (:func:`decode_table`, what
    :meth:`from_calibration` builds), the measured medians interpolated: piecewise linear in
    tokens within a calibrated batch size, linear between batch sizes, extended past the grid with
    the fitted slopes. Why a table: on a CPU a step costs about the same for 1 to ~5 tokens and
    then grows linearly, which one line misprices where speculation is decided (measured here: a
    plain batch-1 step 13% too slow, a 9-token one right)."""

    base: float
    per_seq: float
    per_token: float
    residual_std: float = 0.0
    jitter_fixed: float = 1.0
    jitter_token: float = 1.0
    per_prefill_token: float = 0.0
    """seconds per prompt token in a prefill (0 = uncalibrated: a prompt costs its sequence only)"""
    table: dict[int, tuple[list[int], list[float]]] | None = None
    """measured decode medians per batch size (None = the linear model)"""
    head: dict[int, tuple[list[int], list[float]]] | None = None
    """what an EAGLE-3 head's drafting adds to a step, per head-drafting batch size (:func:`head_table`;
    None = not calibrated)"""

    def __post_init__(self) -> None:
        self._decode_cache: dict[tuple[int, int], float] = {}

    @classmethod
    def from_calibration(cls, calibration: dict[str, Any] | str | Path, quantile: float = 0.5) -> StepCostModel:
        """Refit on a calibration's points (``draftrl calibrate --engine vllm --out FILE``; a dict or
        the file): the fit, the decode table (each cell at ``quantile``: :func:`cell_seconds`), the
        noise as the decode samples' spread around it, and the head's table when the calibration
        has head cells (``--drafter eagle3``)."""
        points = _calibration_points(calibration)
        f = fit(points, quantile)
        model = cls(f["base"], f["per_seq"], f["per_token"], per_prefill_token=f["per_prefill_token"],
                    table=decode_table(points, quantile), head=head_table(points) or None)
        spread = [s - model.decode_seconds(p["num_seqs"], p["tokens_verified"]) for p in points
                  if _is_decode(p) for s in p["seconds"]]
        model.residual_std = float(np.std(spread))
        return model

    def decode_seconds(self, num_seqs: int, num_tokens: int) -> float:
        """Seconds of a step of ``num_seqs`` sequences verifying ``num_tokens`` tokens (no jitter, no prefill)."""
        if self.table is None:
            return self.base + self.per_seq * num_seqs + self.per_token * num_tokens
        key = (num_seqs, num_tokens)
        if key not in self._decode_cache:
            sizes = sorted(self.table)

            def row(b: int) -> float:
                tokens, secs = self.table[b]
                t = min(max(num_tokens, tokens[0]), tokens[-1])
                return float(np.interp(t, tokens, secs)) + self.per_token * (num_tokens - t)

            self._decode_cache[key] = _across_sizes(sizes, num_seqs, row,
                                                    lambda b: row(b) + self.per_seq * (num_seqs - b))
        return self._decode_cache[key]

    def head_seconds(self, num_seqs: int, levels: int) -> float:
        """Seconds an EAGLE-3 head adds to a step by drafting ``levels`` levels for ``num_seqs``
        requests (one padded forward per level; no jitter): the calibrated cells interpolated as
        :meth:`decode_seconds` does, 0 when it drafts nothing."""
        if num_seqs <= 0 or levels <= 0:
            return 0.0
        if not self.head:
            raise ValueError("this step-cost calibration has no head cells; run draftrl calibrate --engine vllm "
                             "--drafter eagle3 --out FILE.")
        sizes = sorted(self.head)

        def row(b: int) -> float:
            lv, secs = self.head[b]
            slope = (secs[-1] - secs[0]) / (lv[-1] - lv[0]) if len(lv) > 1 else secs[0] / lv[0]
            return float(np.interp(min(levels, lv[-1]), [0] + lv, [0.0] + secs)) + slope * max(0, levels - lv[-1])

        return _across_sizes(sizes, num_seqs, row, lambda b: row(b) * max(1.0, num_seqs / b))

    def mean(self, num_seqs: int, num_tokens: int, prompt_tokens: int = 0, head: tuple[int, int] = (0, 0)) -> float:
        """Expected seconds of a step over ``num_seqs`` sequences verifying ``num_tokens`` decode
        tokens and prefilling ``prompt_tokens`` prompt tokens, its proposer drafting ``head = (requests,
        levels)`` with an EAGLE-3 head (:meth:`head_seconds`)."""
        fixed = self.base + self.per_seq * num_seqs
        rest = self.decode_seconds(num_seqs, num_tokens) - fixed + self.per_prefill_token * prompt_tokens
        return fixed * self.jitter_fixed + (rest + self.head_seconds(*head)) * self.jitter_token

    def seconds(self, num_seqs: int, num_tokens: int, rng: Any = None, prompt_tokens: int = 0,
                head: tuple[int, int] = (0, 0)) -> float:
        """One step's seconds: the mean plus ``residual_std`` Gaussian noise drawn from ``rng``
        (None = no noise), floored at a tenth of the mean (a step never costs nothing)."""
        mean = self.mean(num_seqs, num_tokens, prompt_tokens, head)
        if rng is None or self.residual_std <= 0:
            return mean
        return max(0.1 * mean, mean + self.residual_std * float(rng.standard_normal()))

    def jittered(self, sigma: float, rng: Any) -> StepCostModel:
        """This model on another machine: each jitter factor is a mean-one lognormal of ``sigma``
        drawn from ``rng`` (TraceReplay-v1's ``cost_jitter``)."""
        if sigma <= 0:
            return self
        draw = lambda: math.exp(sigma * float(rng.standard_normal()) - 0.5 * sigma * sigma)  # noqa: E731
        other = StepCostModel(self.base, self.per_seq, self.per_token, self.residual_std, draw(), draw(),
                              self.per_prefill_token, self.table, self.head)
        other._decode_cache = self._decode_cache  # the decode table's values do not depend on the jitter
        return other


def _across_sizes(sizes: list[int], num_seqs: int, row: Callable[[int], float], edge: Callable[[int], float]) -> float:
    """``row(b)`` of the calibrated batch sizes ``sizes`` (ascending), linear between the two around
    ``num_seqs``; ``edge(b)`` of the nearest one at a calibrated size or outside the grid."""
    lo = max([b for b in sizes if b <= num_seqs], default=sizes[0])
    hi = min([b for b in sizes if b >= num_seqs], default=sizes[-1])
    if lo == hi:
        return edge(lo)
    w = (num_seqs - lo) / (hi - lo)
    return (1 - w) * row(lo) + w * row(hi)


def _calibration_points(calibration: dict[str, Any] | str | Path) -> list[dict]:
    """The points of a calibration (a dict or its file), with a one-line error for anything else."""
    if not isinstance(calibration, dict):
        path = Path(calibration)
        if not path.is_file():
            raise ValueError(f"no step-cost calibration at {path}; run draftrl calibrate --engine vllm --out {path}.")
        from draftrl.io import read_json

        calibration = read_json(path, "calibration")
    if calibration.get("format") != FORMAT or not calibration.get("points"):
        raise ValueError(f"not a vLLM step-cost calibration (format {calibration.get('format')!r}, expected "
                         f"{FORMAT!r} with points); run draftrl calibrate --engine vllm --out FILE.")
    return calibration["points"]
