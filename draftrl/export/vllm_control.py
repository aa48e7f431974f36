"""Trained policies as controllers of draftrl's vLLM proposer (``draftrl export RUN --format vllm``).

draftrl's proposer (:class:`draftrl.decoding.vllm.proposer.DraftrlProposer`) drafts inside vLLM and
asks a controller every engine step what to draft (:mod:`draftrl.decoding.vllm.control`). A bundle's
``proposer.json`` names one of these by ``controller`` (``"draftrl.export.vllm_control:CLASS"``) and
its exported policy by ``policy`` (the ``.onnx`` file, relative to the JSON); the proposer builds it
with ``CLASS.from_config(config, proposer)``:

- :class:`RequestPolicyControl`: a per-request size policy (``TraceReplay-v1`` / ``SpecDecode-v2``,
  n-gram drafter) chooses each request's own depth every step, all running requests in one
  onnxruntime call, under ``proposer.json``'s fixed ``depth`` and ``budget``;
- :class:`BatchPolicyControl`: a serving-env policy (``ServeReplay-v1`` / ``ServeVLLM-v1``) chooses
  every step's (depth cap, budget) for the whole batch from the env's own observation, rebuilt
  from what the proposer sees (:class:`ServingObserver`); each request's own depth follows the
  env's rule (``proposer.json``'s ``rule``).

What vLLM does not show a proposer is filled honestly. Per request: cost features come from the
training cost table (seconds a round *would* take by the table, as ``TraceReplay-v1`` charges
them), not measured time; the request's token budget is not passed either, so ``generated_len`` is
measured against the training budget and ``remaining_len`` is held at 1. Serving: see
:class:`ServingObserver`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftrl.config.workload import SamplingClass
from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.control import ProposeRecord, RuleControl, StepDecision, StepView, rule_controller
from draftrl.export.features import make_feature_builder, make_serving_features, ngram_drafter
from draftrl.signals.costs import CostTable
from draftrl.signals.features import RoundSummary
from draftrl.signals.serving import ServingFeatures, StepCounts

#: the ``controller`` values ``draftrl export --format vllm`` writes into ``proposer.json``
REQUEST_POLICY = "draftrl.export.vllm_control:RequestPolicyControl"
BATCH_POLICY = "draftrl.export.vllm_control:BatchPolicyControl"
#: names a JSON-lines file :class:`BatchPolicyControl` appends every step's decision to (``proposer.json``'s
#: ``log`` key does the same, relative to the bundle); for ``vllm serve``, pass it in the server's environment
LOG_ENV = "DRAFTRL_CONTROL_LOG"


def _policy(config: dict[str, Any], proposer: Any, what: str) -> Any:
    """The exported policy ``proposer.json`` names (``policy``, relative to the JSON's folder)."""
    from draftrl.export.controller import PolicyController

    if not config.get("policy"):
        raise ValueError(f"proposer.json names controller {what} but no policy; re-run draftrl export RUN --format "
                         "vllm --out DIR, which writes both.")
    return PolicyController(proposer.bundle_path(config["policy"]))


class RequestPolicyControl(RuleControl):
    """Each request's own depth from an exported per-request size policy; the step's cap and budget
    are set from outside (``proposer.json``'s ``depth`` and ``budget``, or the in-process driver).

    Each request's observation is the training env's (:func:`draftrl.export.features.make_feature_builder`,
    kept in the request's ``StepView.memory``), started with the request's sampling as vLLM's batch holds
    it (``StepView.sampling``, handed to ``start_episode(sampling=...)``), updated
    with what its last step verified and accepted;
    the policy's (depth, verify size) is cut to the cap, the room before ``max_model_len`` and the
    tokens the training n-gram drafter has for it (the request's own depth).

    :param policy: a size policy of width 1 (``draftrl.export.controller.PolicyController``).
    :param action: the step's depth cap and budget (None: the proposer's largest depth, no budget).
    :param max_model_len: drafts never run past it (None: no limit).
    :param depth_by_batch: ``[[start_bs, end_bs, k], ...]``: cap on the depth at batch size B.
    """

    kind = "policy"
    #: the ``proposer.json`` keys :meth:`from_config` reads
    config_keys = ("policy", "depth", "budget", "depth_by_batch")

    def __init__(self, policy: Any, action: StepAction | None = None, *, max_model_len: int | None = None,
                 depth_by_batch: list[list[int]] | None = None):
        super().__init__(action)
        if policy.kind != "size" or policy.width != 1:
            raise ValueError("vLLM drafts chains: the policy must be a size policy of width 1.")
        self.policy = policy
        self.entry = policy.manifest.get("features") or {}
        make_feature_builder(self.entry, policy.feature_names)  # refuse unusable policies now
        self.ngram = ngram_drafter(str(self.entry.get("drafter") or "ngram"))
        self.table = CostTable.from_dict(self.entry["cost_table"]) if self.entry.get("cost_table") else None
        self.budget = int(self.entry.get("max_new_tokens") or 256)
        self.max_model_len = max_model_len
        self.depth_by_batch = depth_by_batch or []
        names = list(policy.feature_names)
        self._remaining = names.index("remaining_len") if "remaining_len" in names else None

    @classmethod
    def from_config(cls, config: dict[str, Any], proposer: Any) -> RequestPolicyControl:
        """From ``proposer.json``: ``policy``, ``depth`` and ``budget`` (the step's action),
        ``depth_by_batch`` (optional)."""
        depth = min(int(config.get("depth", proposer.max_depth)), proposer.max_depth)
        return cls(_policy(config, proposer, REQUEST_POLICY), StepAction(depth, config.get("budget")),
                   max_model_len=proposer.max_model_len, depth_by_batch=config.get("depth_by_batch"))

    def _cap(self, batch_size: int, max_depth: int) -> int:
        for start, end, k in self.depth_by_batch:
            if start <= batch_size <= end:
                return min(int(k), max_depth)
        return max_depth

    def _observe(self, memory: dict[str, Any], view: StepView, a: int) -> None:
        """The request's last step as a round of its training env (cost features from the table)."""
        emitted, verified, accepted = int(view.num_emitted[a]), int(view.num_verified[a]), int(view.num_accepted[a])
        context, levels, table = view.lengths[a] - emitted, memory["levels"], self.table
        memory["features"].observe_round(RoundSummary(
            num_emitted=emitted, num_accepted=accepted, num_verified=verified, verified_depth=verified, levels=levels,
            draft_seconds=table.draft(levels, 1) if table else 0.0,
            verify_seconds=table.verify(verified + 1, context) if table else 0.0,
            sample_seconds=table.sample(emitted) if table else 0.0,
        ))

    @staticmethod
    def _sampling(view: StepView, a: int) -> SamplingClass | None:
        """Request ``a``'s sampling as vLLM's batch holds it (``StepView.sampling``), None where unknown."""
        if view.sampling is None:
            return None
        temperature, top_k, top_p = view.sampling[a]
        return SamplingClass(float(temperature), int(top_k), min(1.0, max(float(top_p), 1e-6)))

    def own_depths(self, view: StepView) -> list[int]:
        if view.token_ids is None:
            raise ValueError("RequestPolicyControl reads each request's tokens, which this engine does not pass "
                             "(the serving replay); run it in vLLM.")
        observations = []
        for a, (memory, ids) in enumerate(zip(view.memory, view.token_ids)):
            if "features" in memory:
                self._observe(memory, view, a)
            else:  # the request's first step
                features = make_feature_builder(self.entry, self.policy.feature_names)
                sampling = self._sampling(view, a)
                features.start_episode(self.budget, sampling=sampling)  # the request group reads it
                memory.update(features=features, levels=0, num_prompt_tokens=view.lengths[a] - int(view.num_emitted[a]),
                              sampling=sampling)
            generated = len(ids) - memory["num_prompt_tokens"]
            obs = memory["features"].observation(self.ngram.features(ids), len(ids), generated)
            if self._remaining is not None:
                obs[self._remaining] = 1.0  # the request's budget is unknown: assume its end is not near
            observations.append(obs)
        if not observations:
            return []
        cap = self._cap(len(view.rows) + view.num_prefilling, view.max_depth)
        depths = []
        settings = self.policy.act_batch(np.stack(observations))  # [A, 2]: (depth, verify_size)
        for memory, ids, (depth, verify_size) in zip(view.memory, view.token_ids, settings):
            room = (self.max_model_len - len(ids) - 1) if self.max_model_len else cap
            levels = int(max(0, min(depth, cap, room)))
            n = levels if not verify_size else min(levels, int(verify_size))
            memory["levels"] = levels
            depths.append(len(self.ngram.propose(ids, n, 1, None, None).tokens) if n > 0 else 0)
        return depths


@dataclass
class _Pending:
    """One call's part of a step's counts, completed at the next call (seconds, batch after it)."""

    action: tuple[int, int]
    num_decoding: int
    num_emitted: int
    num_verified: int
    num_accepted: int
    num_proposed: int = 0
    acceptance: np.ndarray = field(default_factory=lambda: np.zeros(0))
    match_len: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    temperatures: np.ndarray | None = None


class ServingObserver:
    """The serving env's observation from ``propose`` calls (vLLM-independent).

    In ``draftrl eval --engine vllm`` an in-process driver steps vLLM and builds the env's
    observation after every step; under ``vllm serve`` or ``LLM(...)`` nobody steps vLLM but vLLM,
    so this does the driver's part in the one call vLLM makes per step: it turns what the proposer
    saw of the step that just ran into the env's :class:`StepCounts` (tokens each request gained,
    the drafts it had verified and accepted, the batch's composition, the seconds since the
    previous call) and builds the observation with the SAME
    :class:`~draftrl.signals.serving.ServingFeatures` the env uses. What differs from the driver,
    and why (vLLM does not show it to a proposer):

    - ``step_seconds`` is the wall time between two ``propose`` calls (one whole engine step); the
      driver times ``LLMEngine.step()``. Idle time while the engine had no request counts into the
      first step after it (the env skips idle time); the feature is clipped at 10 s as in training.
    - ``waiting`` reads 0: the scheduler's queue is in vLLM's engine core, out of the worker's
      reach. Below ``max_num_seqs`` running requests vLLM's queue is empty anyway; a saturated
      engine is seen only through ``running``.
    - ``running`` and ``tokens_in_flight`` are read at the next call (requests that reappear, plus
      the new ones' prompts), so requests that finished are known to have finished; a request
      admitted by vLLM but not yet scheduled is not counted.

    :param features: the env's feature builder (its settings from the export manifest).
    :param clock: seconds, read once per call (``time.perf_counter``; tests pass a scripted clock).
    """

    def __init__(self, features: ServingFeatures, clock: Callable[[], float] = time.perf_counter):
        self.features = features
        self.clock = clock
        self._pending: _Pending | None = None
        self._time = 0.0

    def observe(self, view: StepView) -> np.ndarray:
        """The observation the env would give after the step that just ran (before the first
        step: the env's reset observation, with this batch's prompts in flight)."""
        now = self.clock()
        in_flight = int(sum(n - int(e) for n, e in zip(view.lengths, view.num_emitted))) + view.num_prefill_tokens
        pending = self._pending
        if pending is None:
            self.features.restart()
            acceptance, match_len, temperatures = np.zeros(0), np.zeros(0, dtype=np.int64), None
        else:
            running = sum(not fresh for fresh in view.fresh) + view.num_prefilling
            self.features.record(StepCounts(now - self._time, pending.num_decoding, pending.num_emitted,
                                            pending.num_verified, pending.num_accepted, pending.num_proposed,
                                            running, 0), pending.action)
            acceptance, match_len, temperatures = pending.acceptance, pending.match_len, pending.temperatures
        self._time = now
        return self.features.observation(in_flight, acceptance, match_len, temperatures)

    def acted(self, view: StepView, action: tuple[int, int]) -> None:
        """The step now drafted for ran under ``action`` = (depth, budget); its counts so far."""
        self._pending = _Pending(action, len(view.rows), int(np.sum(view.num_emitted)), int(np.sum(view.num_verified)),
                                 int(np.sum(view.num_accepted)))

    def drafted(self, num_proposed: int, acceptance: np.ndarray, match_len: np.ndarray,
                temperatures: np.ndarray | None = None) -> None:
        """What the proposer drafted under the action (``ProposeRecord``'s admitted, acceptance, match lengths,
        and the temperatures it read from vLLM's batch: None reads as greedy)."""
        assert self._pending is not None
        self._pending.num_proposed = int(num_proposed)
        self._pending.acceptance, self._pending.match_len = np.asarray(acceptance), np.asarray(match_len)
        self._pending.temperatures = None if temperatures is None else np.asarray(temperatures)


class BatchPolicyControl:
    """Every step's (depth cap, budget) from an exported serving-env policy, exactly as
    ``VLLMEngine.step`` applies the env's action (the depth capped at the proposer's largest); the
    action chosen at call ``t`` drafts for step ``t + 1``: the env's one-step lag, unchanged.

    :param policy: a size policy trained on ``draftrl/ServeReplay-v1`` or ``ServeVLLM-v1``.
    :param control: the rule each request's own depth follows under the policy's action (the
        training env's ``rule``, ``match`` or ``heuristic``); None: ``match``.
    :param clock: the seconds :class:`ServingObserver` reads.
    :param log: a JSON-lines file to append one line per engine step to (None: no log): ``step``
        (the proposer's), ``time`` (seconds, the clock's), ``keys`` and ``temperatures`` of the requests
        it drafts for (vLLM's request ids and each one's temperature from vLLM's batch, ``None``: not
        known), ``observation`` (the policy's input, the env's order: ``feature_names`` of the
        export manifest) and the decision: ``depth`` and ``budget`` (the policy's), ``depth_cap``
        (capped at the proposer's largest depth), ``proposed`` (drafts admitted under it).
    """

    #: the ``proposer.json`` keys :meth:`from_config` reads (``depth``: K, vLLM's ``num_speculative_tokens``)
    config_keys = ("policy", "depth", "rule", "log")

    def __init__(self, policy: Any, control: RuleControl | None = None, *,
                 clock: Callable[[], float] = time.perf_counter, log: str | os.PathLike | None = None):
        if policy.kind != "size":
            raise ValueError("a serving policy chooses (depth, budget) per step: export a size policy trained on "
                             "draftrl/ServeReplay-v1 or ServeVLLM-v1.")
        self.policy = policy
        self.control = control if control is not None else rule_controller("match")
        self.observer = ServingObserver(make_serving_features(policy.manifest.get("features") or {},
                                                              policy.feature_names), clock)
        self.observations: list[np.ndarray] | None = None
        """when a list, every observation the policy was asked about is appended"""
        self.log = None if log is None else open(log, "a", buffering=1)  # one line per step, flushed by line
        self._entry: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any], proposer: Any) -> BatchPolicyControl:
        """From ``proposer.json``: ``policy``, ``rule`` (the training env's) and ``log`` (relative to the
        bundle), else the log file :data:`LOG_ENV` names."""
        log = proposer.bundle_path(config["log"]) if config.get("log") else os.environ.get(LOG_ENV) or None
        return cls(_policy(config, proposer, BATCH_POLICY), rule_controller(str(config.get("rule", "match"))), log=log)

    def decide(self, view: StepView) -> StepDecision:
        obs = self.observer.observe(view)
        if self.observations is not None:
            self.observations.append(obs)
        depth, budget = (int(v) for v in self.policy.act(obs))
        self.control.action = StepAction(min(depth, view.max_depth), budget)
        self.observer.acted(view, (depth, budget))
        if self.log is not None:
            self._entry = {"time": round(self.observer._time, 6), "keys": list(view.keys),
                           "temperatures": None if view.sampling is None else
                           [round(float(t), 6) for t in view.sampling[:, 0]],
                           "observation": [round(float(v), 6) for v in obs], "depth": depth, "budget": budget,
                           "depth_cap": self.control.action.depth}
        return self.control.decide(view)

    def drafted(self, view: StepView, record: ProposeRecord) -> None:
        self.control.drafted(view, record)
        self.observer.drafted(int(record.admitted.sum()), record.acceptance, record.match_len, record.temperature)
        if self.log is not None and self._entry is not None:
            self.log.write(json.dumps({"step": int(record.step), **self._entry,
                                       "proposed": int(record.admitted.sum())}) + "\n")
            self._entry = None
