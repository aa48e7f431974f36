"""What draftrl's vLLM proposers ask every engine step: the controller contract and the built-in rules.

A proposer (:class:`~draftrl.decoding.vllm.proposer.DraftrlProposer`, and
:class:`~draftrl.decoding.vllm.head_proposer.HeadProposer` for EAGLE-3 heads) *drafts*: it tracks
the running requests, drafts each one's chain, admits the batch's best positions and counts. What
to draft is a **controller**'s decision, asked once per step (vLLM's ``propose`` call)::

    decision = controller.decide(view)    # after the step that just ran, before drafting
    ...                                   # the proposer drafts and admits under the decision
    controller.drafted(view, record)      # what was admitted (verified in the next step)

- :class:`StepView`: what the proposer learnt of the step that just ran, per decoding request;
- :class:`StepDecision`: the step's action (depth cap and verification budget) and, per request,
  its own depth, the head's per-level stop, head or lookup, padding;
- :class:`ProposeRecord`: what the proposer then drafted and admitted.

**Built-in rules** (:class:`RuleControl`) take the step's action from outside: the in-process
driver (``draftrl.decoding.vllm.engine.VLLMEngine.step``) sets :attr:`RuleControl.action` before
every step, or ``proposer.json``'s ``depth`` and ``budget`` set it once. Each request's own depth
follows the rule, named by a string (``ServeConfig.rule``, ``proposer.json``'s ``rule``,
:func:`rule_controller`):

- ``match``: as deep as the drafter's match goes (:class:`MatchRule`);
- ``heuristic``: Hugging Face's +2 / -1 per request (:class:`HeuristicRule`);
- ``fill``: exactly the cap, padded with the last token where the match runs out (:class:`FillRule`:
  calibration measures verification cost with it);
- ``confidence:T`` / ``cumulative:T``: the head's chain stops where its drafts lose confidence
  (:class:`StopRule`, head proposers only);
- ``RULE|batch:B`` (``match`` or a stop rule): the head drafts only in steps of at most B
  decoding requests, n-gram lookup above (head proposers only).

**Controllers from elsewhere** are named ``"module:Class"`` by ``proposer.json``'s ``controller``
key and built with ``Class.from_config(config, proposer)`` (:func:`controller_class`): imported by
name, as vLLM imports the proposer class itself. ``draftrl export --format vllm`` writes
``draftrl.export.vllm_control``'s per-request and serving policies this way. The serving replay
(``draftrl.replay.serve_engine``) replays the same rule objects.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from draftrl.decoding.admission import StepAction
from draftrl.decoding.schedule import heuristic_depth


@dataclass
class StepView:
    """What a ``propose`` call learnt about the step that just ran, before drafting for the next
    (rows are the running requests that decoded; ``A`` of them)."""

    rows: list[int]
    """[A] each request's row in vLLM's batch"""
    keys: list[str]
    """[A] each request's key (vLLM's request id with a runner, else one the proposer made)"""
    fresh: list[bool]
    """[A] whether the request was not seen at the previous call (new, or not recognised)"""
    lengths: list[int]
    """[A] prompt + output tokens of each row now"""
    num_emitted: np.ndarray
    """[A] tokens each request gained in the step (accepted + 1)"""
    num_verified: np.ndarray
    """[A] drafts the step verified for each request (proposed at the previous call)"""
    num_accepted: np.ndarray
    """[A] of which accepted"""
    num_prefilling: int
    """rows that did not decode (still prefilling)"""
    num_prefill_tokens: int
    """tokens in those rows"""
    max_depth: int
    """the proposer's largest depth (vLLM's ``num_speculative_tokens``)"""
    memory: list[dict[str, Any]]
    """[A] each request's scratch space for the controller: empty at the request's first step, kept
    while the proposer tracks the request, emptied when the proposer gets another controller"""
    token_ids: list[list[int]] | None = None
    """[A] each row's tokens (prompt + output); None in the serving replay, which keeps no token ids"""
    sampling: np.ndarray | None = None
    """[A, 3] each request's (temperature, top_k, top_p), 0 = greedy / off (vLLM: its persistent batch's
    ``SamplingParams``; the replay: the request's sampling class); None: not known (read as greedy)"""


@dataclass(frozen=True)
class StepDecision:
    """What one engine step drafts: the batch's action and, per decoding request, its own choices."""

    action: StepAction
    """depth cap and verification budget of the drafts proposed now (verified in the next step)"""
    depths: list[int] | None = None
    """[A] each request's own depth before the cap and budget; None: as deep as its match goes"""
    stop: tuple[str, float] | None = None
    """per-level stop of a head's chain (:func:`stop_rule`); head proposers only"""
    head: bool = True
    """False: every request drafts by n-gram lookup this step, the head only takes its rows"""
    fill: bool = False
    """pad every chain to its cap with the last token (calibration)"""


@dataclass
class ProposeRecord:
    """What one ``propose`` call saw and did; rows are the running requests that decoded."""

    step: int
    action: StepAction
    keys: list[str]
    num_emitted: np.ndarray
    """[A] tokens each request gained in the step that just ran (accepted + 1)"""
    num_accepted: np.ndarray
    """[A] accepted drafts among them"""
    match_len: np.ndarray
    """[A] matched n-gram length for the next draft (0 = none)"""
    acceptance: np.ndarray
    """[A] per-position acceptance estimate used for the scores"""
    wanted: np.ndarray
    """[A] drafts each request could and would propose under the depth cap"""
    admitted: np.ndarray
    """[A] drafts proposed after the budget (verified in the next step)"""
    draft_ids: list[list[int]]
    """[A] the proposed draft tokens themselves (``admitted`` of them each)"""
    temperature: np.ndarray | None = None
    """[A] each request's temperature (0 = greedy; ``StepView.sampling``'s first column), None: not known"""


@runtime_checkable
class Controller(Protocol):
    """Decides each step's drafting for a vLLM proposer; the proposer drafts, admits and counts."""

    def decide(self, view: StepView) -> StepDecision:
        """The decision for the drafts proposed now, from what the step that just ran showed."""

    def drafted(self, view: StepView, record: ProposeRecord) -> None:
        """What the proposer drafted and admitted under the decision (a policy's next features)."""


# ----------------------------------------------------------------------------- the rule grammar
#: per-request rules of :func:`rule_controller` (besides the stop rules and the load part)
RULES = ("match", "heuristic", "fill")
#: per-level stops of a head's chain (``confidence:T`` / ``cumulative:T``)
STOP_RULES = ("confidence", "cumulative")
#: the load part of a head proposer's rule: ``RULE|batch:B``
LOAD_SEP = "|batch:"


def stop_rule(rule: str) -> tuple[str, float] | None:
    """``("confidence", 0.4)`` for ``"confidence:0.4"``, None for a rule that does not stop on confidence.

    - ``confidence:T``: Hugging Face's assistant confidence threshold: stop after the first draft
      whose own probability under the drafter is below T (that draft is still verified);
    - ``cumulative:T``: EAGLE-2's chain score: stop before the first draft whose chain probability
      (the product of the drafts' probabilities so far) is below T.
    """
    kind, _, value = rule.partition(":")
    if kind not in STOP_RULES:
        return None
    try:
        threshold = float(value)
    except ValueError:
        threshold = -1.0
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"rule {rule!r} needs a threshold in (0, 1), e.g. {kind}:0.4")
    return kind, threshold


def split_load(rule: str) -> tuple[str, int | None]:
    """``("confidence:0.6", 1)`` for ``"confidence:0.6|batch:1"`` (the head drafts while the step
    decodes at most 1 request); ``(rule, None)`` for a rule without a load part."""
    base, sep, value = rule.partition(LOAD_SEP)
    if not sep:
        return rule, None
    if not value.isdigit() or int(value) < 1 or (base not in ("match",) and stop_rule(base) is None):
        raise ValueError(f"rule {rule!r} must look like RULE|batch:B with B >= 1 and RULE match, confidence:T or "
                         "cumulative:T, e.g. confidence:0.6|batch:1")
    return base, int(value)


# ----------------------------------------------------------------------------- the built-in rules
class RuleControl:
    """A built-in rule: the step's action set from outside, each request's own depth from the rule.

    :param action: the step's depth cap and budget until someone sets another (the in-process
        driver sets :attr:`action` before every step); None: the proposer's largest depth, no budget.
    :param head_max_batch: the largest step (decoding requests) a head drafts in; None: every step.
    """

    #: the rule's name in :func:`rule_controller`'s grammar (without its threshold or load part)
    kind = "match"
    #: per-level stop of a head's chain
    stop: tuple[str, float] | None = None
    #: pad every chain to its cap
    fill = False

    def __init__(self, action: StepAction | None = None, *, head_max_batch: int | None = None):
        self.action = action
        self.head_max_batch = head_max_batch

    @property
    def rule(self) -> str:
        """The rule's string (``confidence:0.6|batch:1``): what :func:`rule_controller` parses back."""
        base = self.kind if self.stop is None else f"{self.stop[0]}:{self.stop[1]!r}"
        return base if self.head_max_batch is None else f"{base}{LOAD_SEP}{self.head_max_batch}"

    @property
    def needs_head(self) -> bool:
        """Whether the rule stops or limits a head's chain (only a head proposer can follow it)."""
        return self.stop is not None or self.head_max_batch is not None

    def own_depths(self, view: StepView) -> list[int] | None:
        """Each request's own depth before the step's cap and budget; None: as deep as its match."""
        return None

    def decide(self, view: StepView) -> StepDecision:
        action = self.action if self.action is not None else StepAction(view.max_depth)
        head = self.head_max_batch is None or len(view.rows) <= self.head_max_batch
        return StepDecision(action, self.own_depths(view), self.stop, head, self.fill)

    def drafted(self, view: StepView, record: ProposeRecord) -> None:
        """Rules learn nothing from what was admitted (the proposer's acceptance history does)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.rule!r}, action={self.action})"


class MatchRule(RuleControl):
    """``match``: each request drafts as deep as its match goes, under the step's cap and budget."""


class HeuristicRule(RuleControl):
    """``heuristic``: each request's own depth follows Hugging Face's +2 / -1 schedule on its own
    verified drafts (:func:`draftrl.decoding.schedule.heuristic_depth`, the ``HFHeuristic`` policy's).

    :param initial_depth: a new request's depth; None: the proposer's largest depth.
    """

    kind = "heuristic"

    def __init__(self, action: StepAction | None = None, *, initial_depth: float | None = None):
        super().__init__(action)
        self.initial_depth = initial_depth

    def own_depths(self, view: StepView) -> list[int]:
        initial = float(self.initial_depth if self.initial_depth is not None else view.max_depth)
        out = []
        for memory, accepted, verified in zip(view.memory, view.num_accepted.tolist(), view.num_verified.tolist()):
            depth = memory["heuristic_depth"] = heuristic_depth(memory.get("heuristic_depth", initial), accepted,
                                                                verified)
            out.append(int(depth))
        return out


class FillRule(RuleControl):
    """``fill``: every request drafts exactly the cap, padded with the last token where its match
    runs out (``draftrl calibrate --engine vllm`` times verification of exactly ``d`` drafts)."""

    kind = "fill"
    fill = True


class StopRule(RuleControl):
    """``confidence:T`` / ``cumulative:T``: a head's chain grows to the step's cap and stops at the
    first level :func:`stop_rule`'s rule rejects (``draftrl.decoding.vllm.head_proposer.chain_end``).

    :param stop: ``(kind, threshold)``, e.g. ``("confidence", 0.6)``.
    """

    def __init__(self, stop: tuple[str, float], action: StepAction | None = None, *,
                 head_max_batch: int | None = None):
        super().__init__(action, head_max_batch=head_max_batch)
        self.stop = stop
        self.kind = stop[0]


def rule_controller(rule: str, action: StepAction | None = None, initial_depth: float | None = None) -> RuleControl:
    """The built-in rule named ``rule`` (module docstring), acting under ``action`` until the driver
    sets another; ``initial_depth`` is a new request's depth under ``heuristic``."""
    base, head_max_batch = split_load(rule)
    stop = stop_rule(base)
    if stop is not None:
        return StopRule(stop, action, head_max_batch=head_max_batch)
    if base == "heuristic":
        return HeuristicRule(action, initial_depth=initial_depth)
    if base == "fill":
        return FillRule(action)
    if base == "match":
        return MatchRule(action, head_max_batch=head_max_batch)
    raise ValueError(f"rule={rule!r} is unknown; choose one of {', '.join(RULES)}, confidence:T or cumulative:T "
                     "(with a head), optionally RULE|batch:B.")


def controller_class(spec: str) -> type:
    """The controller class ``spec`` = ``"module:Class"`` names (``proposer.json``'s ``controller``);
    the proposer builds it with ``Class.from_config(config, proposer)`` and checks ``config``'s keys
    against ``Class.config_keys`` first.

    :raises ValueError: one line naming the spec and the fix when it cannot be imported.
    """
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name.isidentifier():
        raise ValueError(f"controller {spec!r} must look like module:Class (e.g. the one draftrl export --format vllm "
                         "writes); leave controller out for the built-in rule named by rule.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise ValueError(f"controller {spec!r}: {err}; install the package that provides it where vLLM runs, or "
                         "re-run draftrl export --format vllm.") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not callable(getattr(cls, "from_config", None)):
        raise ValueError(f"controller {spec!r}: {module_name} has no class {class_name} with from_config(config, "
                         "proposer); name a controller class (draftrl.decoding.vllm.control.Controller).")
    return cls
