"""The round track's rollouts: decode one request under a fixed setting or a policy and keep what
the metrics need.

Two paths, one record (:class:`~draftrl.eval.records.RequestRun`):

- :func:`run_fixed`: ``draftrl.decoding.generate`` with a fixed ``(depth, verify_size, width)``
  schedule (the grid search; no observation is needed, so none is built).
- :func:`run_policy`: one episode of ``draftrl/SpecDecode-v2`` (or ``SpecDecodeDepth-v2``) on a
  prebuilt engine, played by the one rollout loop (:func:`draftrl.policies.evaluate.evaluate_policy`,
  as training evaluates): the policy sees exactly the observation it saw in training, built by
  the envs' own feature builder.

The serve track's episode (many requests under load) is :func:`draftrl.eval.serve.rollout.run_episode`.

Timing (wall clock, ``engine.clock()``: the device is synchronised before each reading):
``total_seconds`` runs from before the prefill to after the last round and includes the policy's
decisions, the observation features and the exactness monitor, so a slow policy or monitor pays
for itself. ``excluded_seconds`` is time a policy declares as not chargeable (the lookahead's
lookahead); :attr:`~draftrl.eval.records.RequestRun.seconds` subtracts it. A round's wall time
runs from the end of the previous round (or the prefill) to the end of this one, so it includes
the decision and the loop's own counting after the previous round (under a microsecond).
"""

from __future__ import annotations

import time

import numpy as np

from draftrl.eval.memory import MemoryProbe
from draftrl.eval.records import RequestRun


def _arrays(rows: list[tuple]) -> dict[str, np.ndarray]:
    names = ("round_seconds", "round_tokens", "round_accepted", "round_depth", "round_verify_size",
             "round_verified_depth", "round_num_verified")
    if not rows:
        return {n: np.zeros(0) for n in names}
    cols = list(zip(*rows))
    return {n: np.asarray(c, dtype=np.float64 if n == "round_seconds" else np.int64) for n, c in zip(names, cols)}


def run_fixed(engine, request, depth: int, verify_size: int, width: int, *, seed: int, label: str,
              repeat: int = 0, keep_stats: bool = False, device: str = "cpu") -> RequestRun:
    """Decode ``request`` (a ``draftrl.decoding.workload.Request``) with one fixed setting.

    :param verify_size: 0 = verify every drafted node.
    :param seed: sampling seed of the request (the same for every cell, so outputs match).
    :param keep_stats: keep the rounds' ``TokenStats`` (for a monitor run after timing).
    """
    from draftrl.decoding.generate import fixed_schedule, generate

    probe = MemoryProbe(device)
    engine.config.max_new_tokens = request.max_new_tokens
    depth = depth if engine.drafter is not None else 0
    result = generate(engine, request.prompt_ids, fixed_schedule(depth, verify_size or None, width), seed=seed,
                      on_round=lambda _: probe.sample())
    rows = [(r.seconds, r.num_emitted, r.num_accepted, r.depth, verify_size, r.verified_depth, r.num_verified)
            for r in result.rounds]
    # generate's total includes the prefill and the loop; rounds' own seconds exclude the loop's
    # few microseconds, which go to the first round so that the parts add up to the total
    arrays = _arrays(rows)
    if result.rounds:
        arrays["round_seconds"][0] += result.total_seconds - result.prefill_seconds - arrays["round_seconds"].sum()
    prompt = request.prompt
    return RequestRun(
        policy=label, prompt_id=prompt.id, language=prompt.language, task=prompt.task, repeat=repeat,
        token_ids=list(result.token_ids), num_prompt_tokens=len(request.prompt_ids),
        prefill_seconds=result.prefill_seconds, total_seconds=result.total_seconds, **arrays,
        peak_memory_bytes=probe.peak_delta, peak_memory_total_bytes=probe.peak, stop_reason=result.stop_reason,
        token_stats=[r.token_stats for r in result.rounds] if keep_stats else [],
    )


def run_policy(env, policy, prompt_id: str, *, label: str, repeat: int = 0, seed: int | None = None,
               monitor=None, device: str = "cpu", on_round=None) -> RequestRun:
    """One episode of ``policy`` on ``env`` (a draftrl real-engine env) for prompt ``prompt_id``:
    :func:`draftrl.policies.evaluate.evaluate_policy` with one episode, timing each round.

    :param seed: passed to ``env.reset`` (only the first episode of an env is seeded, so cost
        features persist across requests as in training).
    :param monitor: an ``ExactnessMonitor`` fed every round (timed; raises ``ExactnessViolation``).
    :param on_round: called with each round's ``info`` (e.g. to record the policy's choices).
    """
    from draftrl.policies.evaluate import evaluate_policy

    base = env.unwrapped
    probe = MemoryProbe(device)
    engine = base.engine
    excluded = getattr(policy, "excluded_seconds", 0.0)
    rows: list[tuple] = []
    state = {"last": 0.0, "prefill": 0.0, "monitor_seconds": 0.0, "info": {}}

    def started(info: dict) -> None:
        """The request's prefill (none with the engine's first round verifying inside it); the
        first round's decision and features count as its own time."""
        state["prefill"] = float(info.get("prefill_seconds", 0.0))
        state["last"] = t0 + state["prefill"]

    def timed_round(info: dict) -> None:
        """After the policy observed the round: the monitor, memory, then the round's wall time
        (from the end of the previous round, or of the prefill, so the decision is its own)."""
        if monitor is not None:
            m0 = time.perf_counter()
            monitor.update(info["token_stats"])  # raises ExactnessViolation
            state["monitor_seconds"] += time.perf_counter() - m0
        probe.sample()
        now = engine.clock()
        rows.append((now - state["last"], info["num_emitted"], info["num_accepted"], info["depth"],
                     info.get("verify_size", 0), info["verified_depth"], info["num_verified"]))
        state["last"], state["info"] = now, info
        if on_round is not None:
            on_round(info)

    t0 = engine.clock()
    evaluate_policy(policy, env, episodes=1, seed=seed, options={"prompt_id": prompt_id}, on_reset=started,
                    on_round=timed_round)
    info = state["info"]
    total = engine.clock() - t0
    prompt = base.request.prompt
    return RequestRun(
        policy=label, prompt_id=prompt.id, language=prompt.language, task=prompt.task, repeat=repeat,
        token_ids=list(engine.output_ids), num_prompt_tokens=len(base.request.prompt_ids),
        prefill_seconds=state["prefill"], total_seconds=total, **_arrays(rows),
        excluded_seconds=getattr(policy, "excluded_seconds", 0.0) - excluded,
        monitor_seconds=state["monitor_seconds"], peak_memory_bytes=probe.peak_delta,
        peak_memory_total_bytes=probe.peak,
        stop_reason=info.get("stop_reason"),
    )
