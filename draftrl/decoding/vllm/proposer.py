"""draftrl's drafter inside vLLM, through its ``custom_class`` speculative method (vLLM 0.32).

vLLM imports the class named in ``speculative_config.model``, builds it with the
``VllmConfig``, calls ``load_model(model)`` (the CPU runner always does), and at the end of
every engine step, after sampling::

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]

- ``sampled_token_ids``: ``[num_reqs]`` lists, the tokens each request gained this step (its
  accepted drafts + 1); empty while the request is still prefilling;
- ``num_tokens_no_spec``: ``[>= num_reqs]`` each row's token count (prompt + output);
- ``token_ids_cpu``: ``[>= num_reqs, max_model_len]`` each row's tokens;
- returns each row's draft tokens for the NEXT step (``[]`` = no speculation for that row).

So an action read here is verified one engine step later (the one-step lag the serving env
documents). Each step the proposer

1. asks its controller (:mod:`draftrl.decoding.vllm.control`) for the step's decision, from what
   the step that just ran showed (:class:`~draftrl.decoding.vllm.control.StepView`): the batch's
   depth cap and budget, and each request's own depth;
2. drafts for every running request with the drafter named by the config's ``drafter`` key
   (:func:`serving_drafter`, the registry of :mod:`draftrl.drafters.registry`; by default
   :data:`SERVING_DRAFTER`, draftrl's n-gram drafter, the one the policies train with) up to
   ``min(action depth, the request's own depth)`` tokens (its ``propose`` verb, width 1);
3. scores each draft position by its survival estimate and admits the batch's best ``budget``
   positions (:mod:`draftrl.decoding.admission`), tells the controller what it admitted, and
   learns each request's acceptance from the number of tokens vLLM returns for it next.

Who decides: by default a built-in rule (``match``) whose action a driver in the same process sets
before every ``step()`` (``draftrl.decoding.vllm.engine.VLLMEngine``); under ``vllm serve`` /
``LLM(...)`` with no driver, the file named by ``DRAFTRL_PROPOSER_CONFIG`` (written by ``draftrl
export --format vllm``; relative paths in it are relative to its folder) names the rule, the action
and any other controller (:meth:`DraftrlProposer.configure`).

On vLLM 0.32 both builds call this class the same way: the V1 ``GPUModelRunner`` (CUDA; the
one vLLM falls back to for ``custom_class``, since Model Runner V2 does not run it) calls
``load_model(model)`` when the class defines it, the CPU runner (a subclass) always; both call
``propose`` with the arguments above (docs/serving.md).

Requests are keyed by vLLM's request ids when a driver attached the model runner
(:attr:`runner`); otherwise by their row, token count and last tokens (rows move when requests
finish; a request not found again starts fresh).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.config.serve import SERVING_DRAFTER
from draftrl.decoding.admission import RequestAcceptance, StepAction, admit_drafts, draft_cap
from draftrl.decoding.vllm.control import (
    Controller,
    ProposeRecord,
    StepDecision,
    StepView,
    controller_class,
    rule_controller,
)
from draftrl.decoding.vllm.guards import guard_cpu_expand
from draftrl.drafters.base import Drafter
from draftrl.drafters.registry import build_drafter
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams

CONFIG_ENV = "DRAFTRL_PROPOSER_CONFIG"
CLASS_PATH = "draftrl.decoding.vllm.proposer.DraftrlProposer"
#: the keys of a proposer config (``proposer.json``) a built-in rule reads besides ``drafter``; a
#: controller named by ``controller`` reads those its class lists in ``config_keys`` instead
RULE_KEYS = ("depth", "budget", "rule", "initial_depth")
#: Discount of a request's acceptance history per step it drafted.
ACCEPT_DECAY = 0.8
#: Tokens of a row's tail remembered to recognise the request at the next step (no runner).
_TAIL = 8


#: vLLM drafts greedily: proposals are the drafter's top chain.
_GREEDY = SamplingParams()


def serving_drafter(spec: str = SERVING_DRAFTER) -> Drafter:
    """The drafter named ``spec`` for the vLLM proposer (and the serving replay, which recomputes
    its proposals). Inside vLLM a drafter sees token ids only, so the registry refuses kinds that need the
    target (``DrafterEntry.needs_target``)."""
    drafter = build_drafter(spec)
    if drafter is None:
        raise ValueError(f"drafter {spec!r} drafts nothing; run vLLM without speculation (method none) instead.")
    return drafter


#: frames above ``propose`` searched for the model runner that called it (a subclass's ``propose`` may sit between)
_CALLER_FRAMES = 3

@dataclass
class _Request:
    """One running request's drafting state between steps."""

    acceptance: RequestAcceptance = field(default_factory=RequestAcceptance)
    memory: dict[str, Any] = field(default_factory=dict)
    """the controller's scratch space for this request (``StepView.memory``)"""
    length: int = 0
    tail: tuple[int, ...] = ()
    last_step: int = 0


class DraftrlProposer:
    """vLLM ``custom_class`` proposer: ``speculative_config={"method": "custom_class", "model":
    "draftrl.decoding.vllm.proposer.DraftrlProposer", "num_speculative_tokens": K}``; each step's
    decision is :attr:`controller`'s (:mod:`draftrl.decoding.vllm.control`)."""

    #: whether this class follows a rule that stops or limits an EAGLE-3 head's chain
    drafts_heads = False

    def __init__(self, vllm_config: Any):
        guard_cpu_expand()  # also under `vllm serve`, where no draftrl engine built vLLM
        spec = vllm_config.speculative_config
        self.max_depth = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.drafter = serving_drafter()
        self.drafter_spec = SERVING_DRAFTER
        self.controller: Controller = rule_controller("match")
        """decides every step (:meth:`set_controller`); by default the rule ``match``, whose action
        the in-process driver sets before each step"""
        self.runner: Any = None
        self.requests: dict[str, _Request] = {}
        self.step = 0
        self.history: list[ProposeRecord] | None = None
        """when a list, every call's :class:`ProposeRecord` is appended (the driver drains it)"""
        self.last: ProposeRecord | None = None
        path = os.environ.get(CONFIG_ENV)
        self.config_dir: Path | None = Path(path).resolve().parent if path else None
        """the folder of ``DRAFTRL_PROPOSER_CONFIG``: the relative paths it names are relative to it
        (:meth:`bundle_path`), so an exported bundle works wherever it is copied"""
        if path:
            self.configure(json.loads(Path(path).read_text()))

    # ------------------------------------------------------------------ configuration
    def configure(self, config: dict[str, Any]) -> None:
        """Apply a proposer config (``draftrl export --format vllm``'s ``proposer.json``):
        ``drafter`` (a spec, default :data:`SERVING_DRAFTER`), then either a built-in rule
        (:data:`RULE_KEYS`: ``rule``, default ``match``, acting under ``depth`` and ``budget``,
        ``initial_depth`` its ``heuristic`` start) or ``controller``: ``"module:Class"``, built with
        ``Class.from_config(config, self)`` (:func:`~draftrl.decoding.vllm.control.controller_class`),
        which reads the keys its class lists in ``config_keys``. Any other key is refused."""
        self.set_drafter(str(config.get("drafter", SERVING_DRAFTER)))
        spec = config.get("controller")
        cls = None if spec is None else controller_class(str(spec))
        known = {"drafter", *RULE_KEYS} if cls is None else {"drafter", "controller", *getattr(cls, "config_keys", ())}
        unknown = sorted(set(config) - known)
        if unknown:
            reader = f"controller {spec!r}" if spec else "the built-in rules"
            raise ValueError(f"the proposer config names {', '.join(unknown)}, which {reader} do not read (keys: "
                             f"{', '.join(sorted(known))}); re-run draftrl export --format vllm to write it again.")
        if cls is not None:
            self.set_controller(cls.from_config(config, self))
            return
        depth = min(int(config.get("depth", self.max_depth)), self.max_depth)
        self.set_controller(rule_controller(str(config.get("rule", "match")), StepAction(depth, config.get("budget")),
                                            config.get("initial_depth")))

    def bundle_path(self, path: str | Path) -> Path:
        """``path`` from the proposer config: as it is when absolute, else relative to the config's folder."""
        path = Path(path)
        return path if path.is_absolute() or self.config_dir is None else self.config_dir / path

    def set_drafter(self, spec: str) -> None:
        """Draft with the drafter named ``spec`` from the next step on (:func:`serving_drafter`)."""
        if spec != self.drafter_spec:
            self.drafter, self.drafter_spec = serving_drafter(spec), spec

    def set_controller(self, controller: Controller) -> None:
        """Decide every step with ``controller`` from the next step on; what the previous one kept
        per request (``StepView.memory``) is forgotten."""
        if not isinstance(controller, Controller):
            raise TypeError(f"a {type(controller).__name__} cannot decide a proposer's steps: a controller has "
                            "decide(view) and drafted(view, record) (draftrl.decoding.vllm.control.Controller).")
        if getattr(controller, "needs_head", False) and not self.drafts_heads:
            raise ValueError(f"rule {controller.rule!r} stops or limits an EAGLE-3 head's chain, and this proposer "
                             f"drafts {self.drafter_spec!r} with no head; draft with a head (drafter eagle3[:DIR] or "
                             "sam:N[:DIR]) or use rule match or heuristic.")
        self.controller = controller
        for req in self.requests.values():
            req.memory.clear()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """The drafters that run here load no weights through vLLM; its CPU runner calls this unconditionally."""

    def _sampling(self, rows: list[int]) -> np.ndarray | None:
        """``[A, 3]`` (temperature, top_k, top_p) of ``rows`` from the model runner's persistent batch
        (vLLM's ``InputBatch``: temperature 0 for greedy, top_k = vocabulary size when off, read here
        as 0): the driver's runner, else the runner that called :meth:`propose` (vLLM's runner calls
        it, also under ``vllm serve``; a subclass's ``propose`` may sit between); None where neither
        keeps them. Called from :meth:`propose` only."""
        batch = getattr(self.runner, "input_batch", None)
        frame = sys._getframe(2)  # propose's caller
        for _ in range(_CALLER_FRAMES):
            if getattr(batch, "temperature_cpu", None) is not None or frame is None:
                break
            batch = getattr(frame.f_locals.get("self"), "input_batch", None)
            frame = frame.f_back
        temps = getattr(batch, "temperature_cpu", None)
        if temps is None:
            return None
        top_k = np.asarray(batch.top_k_cpu[rows], dtype=np.float64)
        top_k[top_k >= getattr(batch, "vocab_size", np.inf)] = 0
        return np.stack([np.asarray(temps[rows], dtype=np.float64), top_k,
                         np.asarray(batch.top_p_cpu[rows], dtype=np.float64)], axis=1).reshape(len(rows), 3)

    # ------------------------------------------------------------------ request tracking
    def _keys(self, rows: list[int], sampled: list[list[int]], lengths: list[int],
              token_ids_cpu: np.ndarray) -> list[str]:
        if self.runner is not None:
            req_ids = self.runner.input_batch.req_ids
            return [req_ids[row] for row in rows]
        keys = []
        for row, gained, n in zip(rows, sampled, lengths):
            key = None
            for k, req in self.requests.items():
                if (req.last_step == self.step - 1 and req.length + len(gained) == n
                        and tuple(int(t) for t in token_ids_cpu[row, req.length - len(req.tail): req.length])
                        == req.tail
                        and k not in keys):
                    key = k
                    break
            keys.append(key or f"row{row}@{self.step}")
        return keys

    # ------------------------------------------------------------------ drafting
    def _drafter_for(self, key: str) -> Drafter:
        """The drafter of request ``key`` (one for all requests here; a subclass that keeps per-request
        drafter state, :class:`draftrl.decoding.vllm.head_proposer.HeadProposer`, returns its own)."""
        return self.drafter

    def _draft_all(self, keys: list[str], histories: list[list[int]], caps: list[int],
                   decision: StepDecision) -> list[DraftTree]:
        """Each request's greedy chain of at most ``caps[i]`` drafts after ``histories[i]``; one call
        per step, so a subclass may draft the step's requests together
        (:class:`draftrl.decoding.vllm.head_proposer.HeadProposer` batches its head and follows the
        decision's ``stop`` and ``head``)."""
        return [self._drafter_for(key).propose(ids, cap, 1, _GREEDY, None)
                for key, ids, cap in zip(keys, histories, caps)]

    # ------------------------------------------------------------------ the step
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """vLLM's ``propose`` contract (module docstring)."""
        self.step += 1
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        rows = [i for i, s in enumerate(sampled_token_ids) if s]
        lengths = [int(num_tokens_no_spec[i]) for i in rows]
        keys = self._keys(rows, [list(sampled_token_ids[i]) for i in rows], lengths, token_ids_cpu)
        num = len(rows)
        emitted = np.array([len(sampled_token_ids[i]) for i in rows], dtype=np.int64)
        accepted = np.zeros(num, dtype=np.int64)
        match_len = np.zeros(num, dtype=np.int64)
        wanted = np.zeros(num, dtype=np.int64)
        verified = np.zeros(num, dtype=np.int64)
        fresh = [True] * num
        histories, reqs = [], []
        for a, (row, key, n) in enumerate(zip(rows, keys, lengths)):
            req = self.requests.get(key)
            if req is None:
                req = self.requests[key] = _Request()
            else:
                fresh[a] = req.last_step != self.step - 1
                verified[a] = req.acceptance.last_proposed
                accepted[a] = req.acceptance.observe(int(emitted[a]), ACCEPT_DECAY)
            req.length, req.last_step = n, self.step
            ids = token_ids_cpu[row, :n].tolist()
            req.tail = tuple(ids[-_TAIL:])
            reqs.append(req)
            histories.append(ids)
        idle = [i for i, sampled in enumerate(sampled_token_ids) if not sampled]
        view = StepView(rows, keys, fresh, lengths, emitted, verified, accepted, len(idle),
                        sum(int(num_tokens_no_spec[i]) for i in idle), self.max_depth, [r.memory for r in reqs],
                        histories, self._sampling(rows))
        decision = self.controller.decide(view)
        action = decision.action
        own_depths = decision.depths if decision.depths is not None else [self.max_depth] * num
        assert len(own_depths) == num, "a controller's depths are one per decoding request"
        caps = [draft_cap(action.depth, own, self.max_depth, self.max_model_len, n)
                for own, n in zip(own_depths, lengths)]
        chains = []
        for a, (ids, cap, tree) in enumerate(zip(histories, caps, self._draft_all(keys, histories, caps, decision))):
            match_len[a] = int(tree.features.get("ngram_match_len", 0))
            chain = [int(t) for t in tree.tokens]
            if decision.fill:  # pad to the cap with the last token
                chain += [chain[-1] if chain else ids[-1]] * (cap - len(chain))
            wanted[a] = len(chain)
            chains.append(chain)
        acceptance, admitted = admit_drafts([r.acceptance for r in reqs], match_len, wanted, action.budget)
        for a, (row, chain) in enumerate(zip(rows, chains)):
            drafts[row] = chain[: int(admitted[a])]
        # forget requests that did not decode this step and are not mid-prefill (finished)
        if self.step % 64 == 0:
            self.requests = {k: r for k, r in self.requests.items() if r.last_step >= self.step - 64}
        self.last = ProposeRecord(self.step, action, keys, emitted, accepted, match_len, acceptance, wanted,
                                  admitted, [drafts[row] for row in rows],
                                  None if view.sampling is None else view.sampling[:, 0].copy())
        self.controller.drafted(view, self.last)
        if self.history is not None:
            self.history.append(self.last)
        return drafts
