"""A serving-env policy (``ServeVLLM-v0`` / ``ServeReplay-v0``) inside vLLM 0.32, with no driver.

In ``draftrl eval --engine vllm`` an in-process driver steps vLLM, builds the env's observation
after every step and hands the policy's ``(depth, budget)`` to draftrl's proposer
(:class:`draftrl.decoding.vllm.proposer.DraftrlProposer`) before the next one. Under ``vllm
serve`` or ``LLM(...)`` nobody steps vLLM but vLLM, so :class:`ServePolicyProposer` does the
driver's part itself, in the one call vLLM makes per step (``propose``), before it drafts:

1. turn what it sees of the step that just ran into the env's :class:`StepCounts`
   (:class:`ServingObserver`): tokens each request gained, the drafts it had verified and
   accepted, the batch's composition, the seconds since the previous call;
2. build the env's observation with the SAME :class:`~draftrl.signals.serving.ServingFeatures`
   the env uses (settings from the manifest, ``draftrl.export.features.make_serving_features``);
3. ask the exported policy (onnxruntime) for ``(depth, budget)`` and set it as the step's action,
   exactly as ``VLLMEngine.step`` does: each request drafts at most ``depth`` tokens, the batch at
   most ``budget``, admitted by survival score (:mod:`draftrl.decoding.admission`).

The action chosen at call ``t`` drafts for step ``t + 1``: the env's one-step lag, unchanged.

What differs from the driver, and why (vLLM does not show it to a proposer):

- ``step_seconds`` is the wall time between two ``propose`` calls (one whole engine step); the
  driver times ``LLMEngine.step()``. Idle time while the engine had no request counts into the
  first step after it (the env skips idle time); the feature is clipped at 10 s as in training.
- ``waiting`` reads 0: the scheduler's queue is in vLLM's engine core, out of the worker's reach.
  Below ``max_num_seqs`` running requests vLLM's queue is empty anyway; a saturated engine is
  seen only through ``running``.
- ``running`` and ``tokens_in_flight`` are read at the next call (requests that reappear, plus
  the new ones' prompts), so requests that finished are known to have finished; a request
  admitted by vLLM but not yet scheduled is not counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.proposer import CONFIG_ENV, DraftrlProposer, StepView
from draftrl.signals.serving import ServingFeatures, StepCounts

CLASS_PATH = "draftrl.export.vllm_serve_proposer.ServePolicyProposer"


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


class ServingObserver:
    """The serving env's observation from ``propose`` calls (vLLM-independent; see the module docstring).

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
            acceptance, match_len = np.zeros(0), np.zeros(0, dtype=np.int64)
        else:
            running = sum(not fresh for fresh in view.fresh) + view.num_prefilling
            self.features.record(StepCounts(now - self._time, pending.num_decoding, pending.num_emitted,
                                            pending.num_verified, pending.num_accepted, pending.num_proposed,
                                            running, 0), pending.action)
            acceptance, match_len = pending.acceptance, pending.match_len
        self._time = now
        return self.features.observation(in_flight, acceptance, match_len)

    def acted(self, view: StepView, action: tuple[int, int]) -> None:
        """The step now drafted for ran under ``action`` = (depth, budget); its counts so far."""
        self._pending = _Pending(action, len(view.rows), int(np.sum(view.num_emitted)), int(np.sum(view.num_verified)),
                                 int(np.sum(view.num_accepted)))

    def drafted(self, num_proposed: int, acceptance: np.ndarray, match_len: np.ndarray) -> None:
        """What the proposer drafted under the action (``ProposeRecord``'s admitted, acceptance, match lengths)."""
        assert self._pending is not None
        self._pending.num_proposed = int(num_proposed)
        self._pending.acceptance, self._pending.match_len = np.asarray(acceptance), np.asarray(match_len)


class ServePolicyProposer(DraftrlProposer):
    """vLLM ``custom_class`` proposer running an exported serving-env policy::

        DRAFTRL_PROPOSER_CONFIG=DIR/proposer.json  speculative_config={"method": "custom_class",
            "model": "draftrl.export.vllm_serve_proposer.ServePolicyProposer", "num_speculative_tokens": K}

    ``proposer.json`` (``draftrl export RUN --format vllm --out DIR``): ``policy`` (the ``.onnx``
    file, relative to the JSON), ``depth`` (K, the policy's largest depth), ``rule`` and
    ``drafter`` (the training env's). :attr:`observations` keeps every observation when a list.
    """

    def __init__(self, vllm_config: Any, *, controller: Any = None, clock: Callable[[], float] = time.perf_counter):
        self.controller = controller
        self.observer: ServingObserver | None = None
        self._clock = clock
        self.observations: list[np.ndarray] | None = None
        super().__init__(vllm_config)
        if self.controller is None:
            raise ValueError(f"set {CONFIG_ENV}=DIR/proposer.json (written by draftrl export --format vllm --out DIR) "
                             "in the environment vLLM runs in; it names the exported serving policy.")
        if self.observer is None:
            self._use(self.controller)

    def configure(self, config: dict[str, Any]) -> None:
        """``DraftrlProposer.configure`` plus ``policy``: the exported serving policy."""
        from draftrl.export.controller import PolicyController

        config = dict(config)
        policy = config.pop("policy", None)
        super().configure(config)
        if policy:
            self._use(PolicyController(self.bundle_path(policy)))

    def _use(self, controller: Any) -> None:
        from draftrl.export.features import make_serving_features

        if controller.kind != "size":
            raise ValueError("a serving policy chooses (depth, budget) per step: export a size policy trained on "
                             "draftrl/ServeReplay-v0 or ServeVLLM-v0.")
        self.controller = controller
        features = make_serving_features(controller.manifest.get("features") or {}, controller.feature_names)
        self.observer = ServingObserver(features, self._clock)

    def _before_draft(self, view: StepView) -> None:
        assert self.observer is not None and self.controller is not None
        obs = self.observer.observe(view)
        if self.observations is not None:
            self.observations.append(obs)
        depth, budget = (int(v) for v in self.controller.act(obs))
        self.action = StepAction(min(depth, self.max_depth), budget)  # as VLLMEngine.step applies it
        self.observer.acted(view, (depth, budget))

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """vLLM's ``propose`` contract (``draftrl.decoding.vllm.proposer``); the action is the policy's."""
        drafts = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        record = self.last
        assert self.observer is not None and record is not None
        self.observer.drafted(int(record.admitted.sum()), record.acceptance, record.match_len)
        return drafts
