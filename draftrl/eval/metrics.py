"""Summaries of both engines' runs: :class:`~draftrl.eval.records.RequestRun` lists (``--engine hf``),
serving episodes (:func:`summarize_serving`, ``--engine vllm``), and :func:`kendall_tau` between rankings.

Terms (vLLM's, as in ``draftrl.decoding.engine``): a round emits its *accepted* draft tokens plus
one *recovered* or *bonus* token, so **mean tokens per round (the mean acceptance length) counts
the bonus token**: plain decoding has exactly 1.0.

- ``tokens_per_second``: total emitted tokens / total charged wall-clock seconds (prefill,
  decisions, features, monitor included) over the runs; never a mean of per-request rates.
- ``speedup_vs_none``: ``tokens_per_second`` / plain decoding's on the same requests (set by the
  caller, which has the reference).
- ``time_to_first_token_*``: prefill plus the first round, seconds.
- ``itl_p50/p95/p99``: percentiles of inter-token latency, seconds (a round's time spread over
  its tokens, as ``GenerationResult.inter_token_latencies``).
- ``tokens_per_round_histogram``: ``{emitted tokens: rounds}``, the whole distribution (two
  workloads with the same mean can differ; docs/design.md).
- ``acceptance_by_position``: entry i-1 is P(draft position i accepted | positions 1..i-1
  accepted and position i verified), with its number of trials.
- ``peak_memory_bytes``: the largest per-request peak above the request's start
  (``draftrl.eval.memory``).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

import numpy as np

from draftrl.decoding.counts import AcceptanceCounts
from draftrl.eval.records import RequestRun

#: Draft positions with a conditional acceptance estimate in the summaries.
MAX_POSITIONS = 16


def median_runs(runs: Iterable[RequestRun]) -> list[RequestRun]:
    """For every (policy, prompt) keep the run with the median charged time over its repeats
    (the lower median for an even count), so one slow repeat does not move the result."""
    groups: dict[tuple[str, str], list[RequestRun]] = defaultdict(list)
    for run in runs:
        groups[run.policy, run.prompt_id].append(run)
    kept = []
    for items in groups.values():
        items = sorted(items, key=lambda r: r.seconds)
        kept.append(items[(len(items) - 1) // 2])
    return kept


def acceptance_by_position(runs: Iterable[RequestRun], max_positions: int = MAX_POSITIONS) -> dict[str, list]:
    """Per-position conditional acceptance ``{"rate": [...], "trials": [...]}`` (None where no trial),
    up to the deepest position tried (:class:`~draftrl.decoding.counts.AcceptanceCounts`)."""
    counts = AcceptanceCounts(max_positions)
    for run in runs:
        for verified, accepted, emitted in zip(run.round_verified_depth, run.round_accepted, run.round_tokens):
            counts.observe(int(verified), int(accepted), int(emitted))
    last = max((i + 1 for i, n in enumerate(counts.num_reached) if n), default=0)
    return {"rate": counts.acceptance_per_position[:last], "trials": counts.num_reached[:last]}


def summarize(runs: list[RequestRun]) -> dict:
    """The metrics of the module docstring over ``runs`` (already reduced with :func:`median_runs`)."""
    if not runs:
        return {"num_requests": 0, "num_tokens": 0, "seconds": 0.0, "tokens_per_second": 0.0}
    tokens = sum(r.num_tokens for r in runs)
    seconds = sum(r.seconds for r in runs)
    rounds = sum(r.num_rounds for r in runs)
    ttft = np.array([r.time_to_first_token for r in runs])
    itl = np.concatenate([r.inter_token_latencies() for r in runs])
    per_round = Counter(int(t) for r in runs for t in r.round_tokens)
    depths = Counter(int(d) for r in runs for d in r.round_depth)
    verify = Counter(int(v) for r in runs for v in r.round_verify_size)
    monitor = sum(r.monitor_seconds for r in runs)
    out = {
        "num_requests": len(runs),
        "num_tokens": int(tokens),
        "num_rounds": int(rounds),
        "seconds": float(seconds),
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "mean_tokens_per_round": tokens / rounds if rounds else 0.0,
        "mean_verified_per_round": float(sum(r.round_num_verified.sum() for r in runs) / rounds) if rounds else 0.0,
        "time_to_first_token_mean": float(ttft.mean()),
        "time_to_first_token_p50": float(np.percentile(ttft, 50)),
        "itl_p50": float(np.percentile(itl, 50)) if itl.size else None,
        "itl_p95": float(np.percentile(itl, 95)) if itl.size else None,
        "itl_p99": float(np.percentile(itl, 99)) if itl.size else None,
        "peak_memory_bytes": int(max(r.peak_memory_bytes for r in runs)),
        "peak_memory_total_bytes": int(max(r.peak_memory_total_bytes for r in runs)),
        "tokens_per_round_histogram": {str(k): per_round[k] for k in sorted(per_round)},
        "depth_histogram": {str(k): depths[k] for k in sorted(depths)},
        "verify_size_histogram": {str(k): verify[k] for k in sorted(verify)},
        "acceptance_by_position": acceptance_by_position(runs),
        "monitor_seconds": float(monitor),
        "excluded_seconds": float(sum(r.excluded_seconds for r in runs)),
    }
    return out


def grouped(runs: list[RequestRun], key: Callable[[RequestRun], str]) -> dict[str, list[RequestRun]]:
    out: dict[str, list[RequestRun]] = defaultdict(list)
    for run in runs:
        out[key(run)].append(run)
    return dict(sorted(out.items()))


def summarize_with_groups(runs: list[RequestRun]) -> dict:
    """:func:`summarize` plus ``per_language`` and ``per_task`` breakdowns."""
    out = summarize(runs)
    out["per_language"] = {k: summarize(v) for k, v in grouped(runs, lambda r: r.language).items()}
    out["per_task"] = {k: summarize(v) for k, v in grouped(runs, lambda r: r.task).items()}
    return out


def add_speedups(summary: dict, reference: dict) -> None:
    """Set ``speedup_vs_none`` in ``summary`` and its per-language / per-task entries, in place."""
    def ratio(a: dict, b: dict) -> float | None:
        return a["tokens_per_second"] / b["tokens_per_second"] if b.get("tokens_per_second") else None

    summary["speedup_vs_none"] = ratio(summary, reference)
    for group in ("per_language", "per_task"):
        for name, sub in summary.get(group, {}).items():
            ref = reference.get(group, {}).get(name)
            sub["speedup_vs_none"] = ratio(sub, ref) if ref else None


def paired_speedup(runs: list[RequestRun], reference: list[RequestRun]) -> dict:
    """Per-request time ratios (reference seconds / policy seconds) on the shared prompts:
    median and the 10th/90th percentiles, a noise-robust companion of ``speedup_vs_none``."""
    ref = {r.prompt_id: r for r in reference}
    ratios = [ref[r.prompt_id].seconds / r.seconds * (r.num_tokens / max(1, ref[r.prompt_id].num_tokens))
              for r in runs if r.prompt_id in ref and r.seconds > 0]
    if not ratios:
        return {"median": None, "p10": None, "p90": None, "num_requests": 0}
    arr = np.asarray(ratios)
    return {"median": float(np.median(arr)), "p10": float(np.percentile(arr, 10)),
            "p90": float(np.percentile(arr, 90)), "num_requests": len(ratios)}


def kendall_tau(a: list[float], b: list[float]) -> float | None:
    """Tau-a: (concordant - discordant) / pairs; a pair tied in either list counts as neither."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    if not pairs:
        return None
    sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
    return sum(sign(a[i] - a[j]) * sign(b[i] - b[j]) for i, j in pairs) / len(pairs)


# ----------------------------------------------------------------------------- serving episodes
def summarize_serving(requests: list, steps: list[dict]) -> dict:
    """Throughput and latency of one (load, policy) serving episode (``draftrl.eval.serve.compare``'s docstring):
    ``requests`` the env's ``RequestTimeline`` list, ``steps`` :func:`~draftrl.eval.serve.rollout.run_episode`'s
    records."""
    tokens = sum(len(r.token_ids) for r in requests)
    seconds = sum(s["seconds"] for s in steps)
    ttft = np.array([r.ttft for r in requests if r.ttft is not None])
    itl, gaps = [], []
    for r in requests:
        times = np.asarray(r.token_times)
        if times.size < 2:
            continue
        change = np.flatnonzero(np.diff(times) > 0) + 1  # first token of each later step
        bounds = np.append(change, times.size)
        for start, end in zip(bounds[:-1], bounds[1:]):
            gap = times[start] - times[start - 1]
            gaps.append(gap)
            itl.extend([gap / (end - start)] * int(end - start))
    itl = np.asarray(itl)
    verified = sum(s["num_verified"] for s in steps)
    accepted = sum(s["num_accepted"] for s in steps)
    decoding = sum(s["decoding"] for s in steps)
    cpu = [s.get("cpu_seconds") for s in steps]
    cpu_seconds = float(sum(cpu)) if cpu and None not in cpu else None

    def pct(a: np.ndarray, q: float) -> float | None:
        return float(np.percentile(a, q)) if a.size else None

    return {
        "num_requests": len(requests),
        "num_tokens": int(tokens),
        "seconds": float(seconds),
        "num_steps": len(steps),
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "cpu_seconds": cpu_seconds,
        "tokens_per_cpu_second": tokens / cpu_seconds if cpu_seconds else None,
        "mean_tokens_per_step": tokens / decoding if decoding else 0.0,
        "mean_batch": decoding / len(steps) if steps else 0.0,
        "num_verified": int(verified),
        "num_accepted": int(accepted),
        "acceptance": accepted / verified if verified else None,
        "time_to_first_token_mean": float(ttft.mean()) if ttft.size else None,
        "time_to_first_token_p50": pct(ttft, 50),
        "time_to_first_token_p95": pct(ttft, 95),
        "itl_p50": pct(itl, 50),
        "itl_p95": pct(itl, 95),
        "itl_p99": pct(itl, 99),
        "decode_step_seconds": float(np.mean(gaps)) if gaps else None,
    }


def _timeline_rate(requests: list) -> dict:
    tokens = sum(len(r.token_ids) for r in requests)
    latency = sum(r.token_times[-1] - r.admitted for r in requests if r.token_times)
    return {"num_requests": len(requests), "num_tokens": int(tokens),
            "tokens_per_second": tokens / latency if latency > 0 else 0.0}


def serving_groups(requests: list, key: str) -> dict:
    """``{value of key: {num_requests, num_tokens, tokens_per_second}}``: tokens / request latency per group."""
    out: dict[str, list] = {}
    for r in requests:
        out.setdefault(getattr(r, key), []).append(r)
    return {k: _timeline_rate(v) for k, v in sorted(out.items())}


def histogram(values) -> dict[str, int]:
    """``{str(value): count}``, ordered by value."""
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))
