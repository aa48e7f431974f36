"""Prompt-lookup proposers replayed on recorded greedy continuations, no wall clock: engine steps,
proposed and accepted drafts per step, and each proposer's own CPU time per ``propose`` call.

At temperature 0 a request's tokens do not depend on the drafts, so a proposer's whole
schedule at concurrency 1 follows from the recorded continuation (``draftrl collect --engine
vllm``, which keeps ``lookahead`` tokens past the budget): each step the proposer sees the
request's tokens as vLLM passes them, its draft is accepted up to the first token that differs
from the recording, and the step emits accepted + 1 tokens. The first step is the prefill.

Arms (``--arms``): ``fixed:K`` (draftrl's vLLM proposer as it is now, depth K every step), ``vllm-ngram:K``
(vLLM's own numba matcher, ``prompt_lookup_min/max`` as ``VLLMEngineConfig`` sets them),
``ref_latest:K`` / ``ref_earliest:K`` (:mod:`draftrl.decoding.vllm.ref_lookup`) and ``hindsight:K``: draftrl's
depth-K draft cut to the prefix that will be accepted, i.e. the best depth any per-request depth
policy could choose each step for these drafts (its ceiling); ``none:0`` drafts nothing. One line
per arm, ratios first:

    steps_vs_none=0.437x  tokens_per_step=2.29  accepted_per_step=1.31  proposed_per_step=2.78  us_per_call=121
        steps=594  arm=ref_latest:4  requests=16  tokens=1360

With ``--calibration`` (``draftrl calibrate --engine vllm``) each step is also charged the
calibrated batch-1 step seconds (prefill by prompt tokens, decode by tokens verified) and the
line starts with ``seconds_vs_none`` and ``seconds_vs_best_fixed`` (the best ``fixed:K`` arm).

    python benchmarks/lookup_replay.py --recordings runs/serve/rec_heldout \\
        --arms fixed:2,fixed:4,vllm-ngram:4,ref_latest:4
    python benchmarks/lookup_replay.py --calibration runs/serve/vllm_costs.json \\
        --arms fixed:4,fixed:8,hindsight:8,vllm-ngram:8
    python benchmarks/lookup_replay.py --quick        # ref_latest:4 and ref_earliest:4 (no vLLM needed)

``fixed`` and ``vllm-ngram`` arms need vLLM (``draftrl[vllm]``); the ``ref_*``, ``hindsight`` and ``none`` arms do not.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from _bench import Bench, common_flags, parse_args

from draftrl.decoding.vllm.ref_lookup import RefLookupEarliest, RefLookupLatest
from draftrl.io import read_json

MAX_MODEL_LEN = 1024


def _vllm_config(k: int) -> Any:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN))


def make_proposer(arm: str) -> Callable[[list[list[int]], np.ndarray, np.ndarray], list[list[int]]]:
    """A ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` for one arm."""
    kind, _, k = arm.partition(":")
    k = int(k)
    if kind == "fixed":
        from draftrl.decoding.admission import StepAction
        from draftrl.decoding.vllm.proposer import DraftrlProposer

        proposer = DraftrlProposer(_vllm_config(8))
        proposer.controller.action = StepAction(k)
        return proposer.propose
    if kind == "vllm-ngram":
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as match

        from draftrl.decoding.vllm.engine import VLLMEngineConfig

        cfg = VLLMEngineConfig(method="ngram", num_speculative_tokens=k)

        def propose(sampled, num_tokens, token_ids):
            return [match(token_ids[i, : int(num_tokens[i])], cfg.prompt_lookup_min, cfg.prompt_lookup_max,
                          MAX_MODEL_LEN, k).tolist() if s else [] for i, s in enumerate(sampled)]
        return propose
    if kind == "none":  # no drafts: plain decoding, the reference of seconds_vs_none
        return lambda sampled, num_tokens, token_ids: [[] for _ in sampled]
    if kind == "hindsight":  # the recording is known to replay(), which cuts this draft to its accepted prefix
        return make_proposer(f"fixed:{k}")
    if kind in ("ref_latest", "ref_earliest"):
        return (RefLookupLatest if kind == "ref_latest" else RefLookupEarliest)(_vllm_config(k)).propose
    raise ValueError(f"arm {arm!r} is unknown; use none:0, fixed:K, vllm-ngram:K, hindsight:K, ref_latest:K or "
                     "ref_earliest:K.")


def replay(arm: str, requests: list[dict], cost: Any = None) -> dict[str, Any]:
    """Every request alone (concurrency 1) through one arm; per-request steps and drafts, and with
    ``cost`` (a ``StepCostModel``) the seconds those steps take at batch 1."""
    propose = make_proposer(arm)
    hindsight = arm.startswith("hindsight:")
    propose([[1]], np.array([2]), np.array([[1, 1]], dtype=np.int64))  # warm-up (numba compiles here)
    out, cpu, calls = [], 0.0, 0
    for req in requests:
        prompt, recorded, budget = req["prompt_ids"], req["token_ids"], int(req["max_new_tokens"])
        budget = min(budget, len(recorded))
        buf = np.zeros((1, MAX_MODEL_LEN), dtype=np.int64)
        buf[0, : len(prompt)] = prompt
        length, t, steps, proposed, accepted = len(prompt), 1, 1, 0, 0  # step 1: prefill, first token
        seconds = cost.mean(1, 0, len(prompt)) if cost is not None else 0.0
        buf[0, length] = recorded[0]
        length += 1
        sampled = [recorded[0]]
        while t < budget:
            t0 = time.thread_time()
            draft = propose([sampled], np.array([length]), buf)[0]
            cpu += time.thread_time() - t0
            calls += 1
            a = 0
            while a < len(draft) and t + a < len(recorded) and draft[a] == recorded[t + a]:
                a += 1
            if hindsight:
                draft = draft[:a]
            if cost is not None:
                seconds += cost.mean(1, len(draft) + 1)
            gained = min(a + 1, budget - t)
            sampled = recorded[t: t + gained]
            buf[0, length: length + gained] = sampled
            length, t, steps = length + gained, t + gained, steps + 1
            proposed, accepted = proposed + len(draft), accepted + min(a, gained)
        out.append({"id": req["prompt"]["id"], "task": req["prompt"]["task"], "tokens": budget, "steps": steps,
                    "proposed": proposed, "accepted": accepted, "seconds": seconds})
    return {"arm": arm, "requests": out, "cpu_seconds": cpu, "calls": calls}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[common_flags()])
    p.add_argument("--recordings", default="runs/serve/rec_heldout", help="a draftrl collect --engine vllm directory")
    p.add_argument("--arms", default="fixed:2,fixed:4,fixed:8,vllm-ngram:2,vllm-ngram:4,vllm-ngram:8,ref_latest:2,"
                                     "ref_latest:4,ref_latest:8,ref_earliest:4")
    p.add_argument("--by-task", action="store_true", help="also print steps per task")
    p.add_argument("--calibration", default=None, help="draftrl calibrate --engine vllm FILE: also charge step seconds")
    args = parse_args(p, quick=dict(arms="ref_latest:4,ref_earliest:4"))
    bench = Bench(args, __file__)

    requests = read_json(Path(args.recordings, "recordings.json"), "recordings")["requests"]
    tokens = sum(min(int(r["max_new_tokens"]), len(r["token_ids"])) for r in requests)
    cost = None
    if args.calibration:
        from draftrl.replay.serve_calibrate import StepCostModel

        cost = StepCostModel.from_calibration(args.calibration)
    results = [replay(arm, requests, cost) for arm in args.arms.split(",") if arm]
    if cost is not None:
        plain = sum(r["seconds"] for r in replay("none:0", requests, cost)["requests"])
        best_fixed = min((sum(r["seconds"] for r in res["requests"]) for res in results
                          if res["arm"].startswith("fixed:")), default=None)
    clock = f"{args.calibration}@batch_1" if cost is not None else "none"
    where = dict(requests=len(requests), tokens=tokens, recordings=args.recordings, seconds_from=clock)
    for res in results:
        rs = res["requests"]
        steps = sum(r["steps"] for r in rs)
        ratios = {}
        if cost is not None:
            secs = sum(r["seconds"] for r in rs)
            ratios = {"seconds_vs_none": plain / secs,
                      "seconds_vs_best_fixed": best_fixed / secs if best_fixed else None}
        by_task: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in rs:
            by_task[r["task"]][0] += r["tokens"]
            by_task[r["task"]][1] += r["steps"]
        per_task = ({f"tokens_per_step_{task}": t / s for task, (t, s) in sorted(by_task.items())}
                    if args.by_task else {})
        bench.row({**ratios, "steps_vs_none": steps / tokens},
                  {"tokens_per_step": tokens / steps, "accepted_per_step": sum(r["accepted"] for r in rs) / steps,
                   "proposed_per_step": sum(r["proposed"] for r in rs) / steps,
                   "us_per_call": 1e6 * res["cpu_seconds"] / max(1, res["calls"]), "steps": steps, **per_task},
                  arm=res["arm"], **where)
    bench.save(arms=results)


if __name__ == "__main__":
    main()
