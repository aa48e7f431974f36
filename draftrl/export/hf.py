"""An exported policy inside Hugging Face ``transformers`` assisted generation (prompt lookup).

``policy_generate(model, input_ids, controller, max_new_tokens=...)`` runs transformers' own
assisted-decoding loop (``GenerationMixin._assisted_decoding``: one target forward verifies the
candidates, the longest matching prefix plus one target token is kept, the cache is cropped)
with :class:`PolicyCandidateGenerator` as the candidate source: a ``PromptLookupCandidateGenerator``
whose number of candidates is set every round by the controller. Greedy output is the target's
own greedy output: the policy changes only how many candidates are checked.

How it is plugged in (transformers 5.24): ``generate`` has no argument for a custom candidate
generator; its extension point is ``custom_generate=<callable>``, which replaces the decoding
loop. Our callable runs the stock assisted loop and, for the duration of that call only,
answers the model's ``_get_candidate_generator`` with our generator. Both names are private
transformers API, checked against 5.24 by ``tests/export/test_hf.py``.

Which features the adapter can fill (policies trained with the n-gram drafter; the controller's
manifest names the training drafter):

| features | inside HF's loop |
|---|---|
| ``ngram_match_len``, ``ngram_num_matches`` | exact: draftrl's ``NgramDrafter.features`` on the same ids |
| ``draft_top1_prob``, ``draft_entropy`` | 0, as in training (the n-gram drafter has none) |
| ``last_tokens_*``, ``ema_tokens``, ``accept_rate_*`` | exact: the training ``FeatureBuilder`` fed each round's |
| | emitted tokens (from ``input_ids`` growth), accepted count (``num_matches``) and candidate count |
| ``context_len``, ``generated_len``, ``remaining_len`` | exact: from ``input_ids`` and ``max_new_tokens`` |
| ``temperature``, ``top_k``, ``top_p`` | the request's: greedy (the adapter decodes greedily) |
| ``target_top1_prob``, ``target_entropy``, ``accepted_mean_p`` | from the verification logits HF hands to |
| | ``update_candidate_strategy``: the raw softmax at the row of the round's last token; p = 1 per accepted token |
| ``verify_cost_*``, ``draft_cost_*`` | start at the training cost table (in the manifest) and follow wall-clock |
| | seconds measured around HF's calls: drafting = our ``get_candidates`` (minus the policy), verification = |
| | from its return to ``update_candidate_strategy`` (the target forward plus HF's acceptance and cache crop, |
| | a little more than draftrl's verify phase); ``measure_costs=False`` keeps the table's values |

Candidates come from draftrl's ``NgramDrafter`` by default (the drafter the policy was trained
with: same proposals as ``draftrl generate``), cut at the first EOS as transformers requires;
``proposer="hf"`` uses transformers' own prompt lookup instead (only the count comes from the
policy; its proposals differ from the ones the policy was trained on). Batch size 1, as in
transformers' assisted generation; tree policies (width > 1) cannot run here.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
from transformers.generation.utils import GenerationMixin

from draftrl.decoding.clock import device_clock
from draftrl.export.features import make_feature_builder, ngram_drafter
from draftrl.models.distribution import SamplingParams
from draftrl.signals.features import RoundSummary

PROPOSERS = ("draftrl", "hf")


class PolicyCandidateGenerator(PromptLookupCandidateGenerator):
    """Prompt-lookup candidates, as many each round as the exported policy chooses.

    :param controller: a size policy (``PolicyController`` / ``TorchScriptController``) trained
        with the n-gram drafter on a ``FeatureBuilder`` env.
    :param prompt_length: tokens of the prompt (the generated length is counted after it).
    :param max_length: prompt + max_new_tokens (``generation_config.max_length``).
    :param eos_token_id: ``generation_config._eos_token_tensor``; candidates stop before the first EOS.
    :param proposer: ``"draftrl"`` (the training drafter, default) or ``"hf"`` (transformers' lookup).
    :param measure_costs: feed measured seconds to the cost features (else keep the table's).
    """

    def __init__(
        self,
        controller: Any,
        *,
        prompt_length: int,
        max_length: int,
        eos_token_id: torch.Tensor | None = None,
        logits_processor: Any = None,
        vocab_size: int | None = None,
        proposer: str = "draftrl",
        measure_costs: bool = True,
    ):
        if controller.kind != "size":
            raise ValueError(f"{controller.path} is a {controller.kind!r} policy; candidates need a size policy.")
        if controller.width != 1:
            raise ValueError(f"the policy drafts trees of width {controller.width}; transformers verifies chains only.")
        if proposer not in PROPOSERS:
            raise ValueError(f"proposer={proposer!r} must be one of {PROPOSERS}.")
        manifest_features = controller.manifest.get("features") or {}
        self.ngram = ngram_drafter(str(manifest_features.get("drafter") or "ngram"))
        super().__init__(
            eos_token_id=eos_token_id,
            num_output_tokens=max(1, max(controller.depths)),
            max_matching_ngram_size=self.ngram.max_ngram,
            max_length=max_length,
            logits_processor=logits_processor,
            vocab_size=vocab_size,
        )
        self.controller = controller
        self.features = make_feature_builder(manifest_features, controller.feature_names)
        self.prompt_length = int(prompt_length)
        self.max_new_tokens = int(max_length) - self.prompt_length
        self.features.start_episode(self.max_new_tokens)
        self.proposer = proposer
        self.measure_costs = measure_costs
        self.rounds: list[dict[str, int]] = []
        """per round: depth, verify_size, num_candidates, num_accepted, num_emitted"""
        self._pending: dict[str, Any] | None = None

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs: Any) -> tuple[torch.LongTensor, None]:
        """``input_ids`` ``[1, T]`` -> ``([1, T + n], None)`` with ``n`` chosen by the policy."""
        t0 = device_clock(input_ids.device)
        ids = input_ids[0].tolist()
        draft = self.ngram.features(ids)
        t1 = device_clock(input_ids.device)
        generated = len(ids) - self.prompt_length
        depth, verify_size = self.controller.act(self.features.observation(draft, len(ids), generated))
        t2 = device_clock(input_ids.device)
        levels = max(0, min(depth, self.max_new_tokens - generated - 1))  # as the engine drafts
        n = levels if not verify_size else min(levels, verify_size)
        candidates = input_ids
        if n > 0:
            candidates = self._propose(input_ids, ids, n)
        t3 = device_clock(input_ids.device)
        self._pending = {
            "depth": int(depth), "verify_size": int(verify_size), "levels": levels, "length": len(ids),
            "num_candidates": candidates.shape[1] - len(ids), "draft_seconds": (t1 - t0) + (t3 - t2),
            "verify_start": t3,
        }
        return candidates, None

    def _propose(self, input_ids: torch.LongTensor, ids: list[int], n: int) -> torch.LongTensor:
        if self.proposer == "hf":
            self.num_output_tokens = n
            return super().get_candidates(input_ids)[0]
        tokens = self.ngram.propose(ids, n, 1, SamplingParams(), None).tokens  # a chain: one node per level
        if self.eos_token_id is not None:  # transformers would accept past an EOS: stop before it
            eos = set(torch.atleast_1d(self.eos_token_id).tolist())
            tokens = tokens[: next((i for i, t in enumerate(tokens) if t in eos), len(tokens))]
        if not tokens:
            return input_ids
        return torch.cat([input_ids, torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)], dim=1)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """After verification: feed the round to the history (and cost) features."""
        now = device_clock(input_ids.device)
        p, self._pending = self._pending, None
        if p is None:
            return
        num_emitted = input_ids.shape[1] - p["length"]
        num_accepted = int(num_matches)
        n = p["num_candidates"]
        self.rounds.append({"depth": p["depth"], "verify_size": p["verify_size"], "num_candidates": n,
                            "num_accepted": num_accepted, "num_emitted": num_emitted})
        summary = RoundSummary(
            num_emitted=num_emitted, num_accepted=num_accepted, num_verified=n, verified_depth=n,
            levels=p["levels"], draft_seconds=p["draft_seconds"], verify_seconds=now - p["verify_start"],
            sample_seconds=0.0, target_features=_target_features(scores, num_accepted),
        )
        if self.measure_costs:
            self.features.observe_round(summary)
        else:  # history only: the cost averages keep the table's values
            costs, self.features.costs = self.features.costs, _NoCosts()
            try:
                self.features.observe_round(summary)
            finally:
                self.features.costs = costs


def _target_features(scores: torch.Tensor | None, num_accepted: int) -> dict[str, float]:
    """What the engine's walk reports (``RoundResult.target_features``) from HF's verification logits
    ``scores`` [1, candidates + 1, V]: the raw softmax at the row that chose the round's last token, and
    p = 1 for every accepted candidate (greedy decoding); {} (unknown) without logits."""
    if scores is None or scores.dim() != 3 or scores.shape[1] <= num_accepted:
        return {}
    logp = torch.log_softmax(scores[0, num_accepted].float(), dim=-1)
    entropy = float(-(logp.exp() * logp).nan_to_num(0.0).sum())
    return {"target_top1_prob": float(logp.max().exp()), "target_entropy": entropy,
            "accepted_mean_p": 1.0 if num_accepted else 0.0}


class _NoCosts:
    def observe(self, summary: RoundSummary) -> None:
        pass


def _policy_assisted_decoding(
    model: Any,
    input_ids: torch.LongTensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    inputs_tensor: torch.Tensor | None = None,
    draftrl_candidate_generator: Any = None,
    draftrl_streamer: Any = None,
    draftrl_synced_gpus: bool | None = None,
    **model_kwargs: Any,
) -> Any:
    """``custom_generate`` callable: transformers' assisted loop with our candidate generator.

    transformers hands a callable ``custom_generate`` only the keyword arguments its signature adds
    to ``_sample``'s (``generation_mode_kwargs`` is replaced by them), so ``streamer`` and
    ``synced_gpus`` arrive as ``draftrl_streamer`` / ``draftrl_synced_gpus`` (``policy_generate``
    renames them) instead of being dropped."""
    if draftrl_candidate_generator is None:
        raise ValueError("call policy_generate(model, input_ids, controller, ...) rather than this function.")
    model._get_candidate_generator = draftrl_candidate_generator  # instance attribute: this call only
    try:
        return GenerationMixin._assisted_decoding(
            model, input_ids, logits_processor, stopping_criteria, generation_config,
            synced_gpus=bool(draftrl_synced_gpus) if draftrl_synced_gpus is not None else synced_gpus,
            streamer=draftrl_streamer if draftrl_streamer is not None else streamer,
            inputs_tensor=inputs_tensor, **model_kwargs,
        )
    finally:
        del model._get_candidate_generator


def policy_generate(
    model: Any,
    input_ids: torch.LongTensor,
    controller: Any,
    *,
    max_new_tokens: int,
    proposer: str = "draftrl",
    measure_costs: bool = True,
    **generate_kwargs: Any,
) -> tuple[Any, PolicyCandidateGenerator]:
    """``model.generate`` (greedy or sampled, batch 1) with ``controller`` choosing each round's candidates.

    :param input_ids: ``[1, T]`` prompt ids.
    :param generate_kwargs: more ``generate`` arguments (``attention_mask``, ``do_sample``,
        ``streamer``, ``synced_gpus``, ...).
    :return: (what ``generate`` returns, the candidate generator: its ``rounds`` log every decision).
    """
    if input_ids.shape[0] != 1:
        raise ValueError(f"assisted generation runs batch size 1; input_ids has batch {input_ids.shape[0]}.")
    made: list[PolicyCandidateGenerator] = []

    def candidate_generator(*, generation_config: Any, input_ids: torch.LongTensor, logits_processor: Any,
                            **_: Any) -> PolicyCandidateGenerator:
        generator = PolicyCandidateGenerator(
            controller,
            prompt_length=input_ids.shape[1],
            max_length=generation_config.max_length,
            eos_token_id=generation_config._eos_token_tensor,
            logits_processor=logits_processor,
            vocab_size=model.config.get_text_config().vocab_size,
            proposer=proposer,
            measure_costs=measure_costs,
        )
        made.append(generator)
        return generator

    generate_kwargs.setdefault("do_sample", False)
    # generate() puts the prompt into the streamer itself; the decoding loop needs it under our key too
    generate_kwargs["draftrl_streamer"] = generate_kwargs.get("streamer")
    generate_kwargs["draftrl_synced_gpus"] = generate_kwargs.get("synced_gpus")
    output = model.generate(
        input_ids,
        max_new_tokens=max_new_tokens,
        prompt_lookup_num_tokens=max(1, max(controller.depths)),  # selects the assisted loop; the policy sets n
        custom_generate=_policy_assisted_decoding,
        draftrl_candidate_generator=candidate_generator,
        **generate_kwargs,
    )
    return output, made[-1]
