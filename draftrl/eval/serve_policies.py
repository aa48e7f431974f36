"""How each policy of ``draftrl eval --engine vllm`` is built: its engine, its env's rule, its ``Policy``.

The names are ``draftrl.eval.policy_names``' (one grammar for both engines). Every policy acts
through the ``draftrl.policies.Policy`` interface on ``draftrl/ServeVLLM-v0`` (or the replay,
``ServeReplay-v0``), whose second action grid is the batch's verification budget:

- ``none``, ``ngram:K``, ``eagle3:K``, ``class:MODULE.Class:K``: ``Fixed`` at depth 0; the engine
  (vLLM without speculation, its own prompt lookup, its own EAGLE-3 with the head ``env.head``,
  another ``custom_class`` proposer) ignores the action; ``ngram:S-E:K,...`` and
  ``eagle3:S-E:K,...`` give the stock method vLLM's Dynamic SD table instead of one K;
- ``fixed:D[:B]``: ``Fixed`` at depth D and budget B (no limit without B);
- ``heuristic``: ``Fixed`` at the deepest depth, no budget, with the env's per-request rule
  ``heuristic`` (Hugging Face's +2 / -1 inside the proposer, ``draftrl.decoding.schedule``);
- ``dsd[:S-E:K,...]``: ``DynamicSD``, K from the running batch size;
- ``head:K``, ``sam:N:K``: ``Fixed`` at depth K, no budget, on draftrl's proposer running the head
  ``env.head`` itself (:mod:`draftrl.decoding.vllm.head_proposer`; ``sam``: n-gram lookup per
  request when its match has >= N tokens; ``:bB``: the head only in steps of at most B requests);
- ``ppo:DIR``: ``PPOPolicy`` trained on a serving env (grids and features checked).
"""

from __future__ import annotations

from typing import Any

from draftrl.eval.policy_names import REFERENCE, VLLM_MAX_DEPTH, PolicySpec

#: Kinds whose engine is not draftrl's proposer (the action is ignored).
OWN_ENGINE = (REFERENCE, "ngram", "eagle3", "class")
#: Kinds on draftrl's proposer running the EAGLE-3 head itself (route (b)).
PROPOSER_HEAD_KINDS = ("head", "sam")
#: Kinds that draft with the head ``env.head``.
HEAD_KINDS = ("eagle3", *PROPOSER_HEAD_KINDS)


def proposer_rule(spec: PolicySpec) -> str:
    """Each request's own depth before the step's cap and budget (``ServeConfig.rule``); for the
    head kinds with the head's stop and load parts (``confidence:0.6|batch:1``,
    :mod:`draftrl.decoding.vllm.head_proposer`)."""
    if spec.kind in PROPOSER_HEAD_KINDS:
        from draftrl.decoding.vllm.head_proposer import LOAD_SEP

        rule = spec.stop or "match"
        return rule if spec.head_max_batch is None else f"{rule}{LOAD_SEP}{spec.head_max_batch}"
    return "heuristic" if spec.kind == "heuristic" else "match"


def check_policies(specs: list[PolicySpec], config) -> None:
    """Refuse, before any engine loads (one line naming the fix), a ``fixed:D[:B]`` off the serving
    config's grids and an ``eagle3:K`` without a head folder (``env.head``, else the head draftrl
    ships for the target) or with one vLLM cannot load."""
    from draftrl.drafters.eagle3 import head_config
    from draftrl.drafters.packaged import resolve_head
    from draftrl.models import model_folder

    depths, budgets = config.depths, config.budgets
    for spec in specs:
        if spec.kind in HEAD_KINDS:
            try:
                head = resolve_head(config.head, config.target)
            except ValueError as err:
                raise ValueError(f"policy {spec.label!r} needs an EAGLE-3 head folder; pass --head DIR (sets env.head): "
                                 f"{err}") from None
            head_config(model_folder(head, "EAGLE-3 head"))  # one line naming what the folder lacks
        if spec.kind != "fixed":
            continue
        if spec.depth not in depths or (spec.verify_size is not None and spec.verify_size not in budgets):
            raise ValueError(f"policy {spec.label!r} is off the serving grid depths={list(depths)}, "
                             f"budgets={list(budgets)}; pick values from them or set env.depths / env.budgets.")


def build_serving_policy(spec: PolicySpec, env: Any):
    """The ``Policy`` that plays ``spec`` on the serving ``env``."""
    from draftrl.policies import DynamicSD, Fixed, PPOPolicy, env_grids

    depths, budgets, _ = env_grids(env)
    if spec.kind == "ppo":  # observation statistics, grids and features checked
        return PPOPolicy.load(spec.path, env, name=spec.label)
    if spec.kind == "dsd":
        policy = DynamicSD.for_env(env, table=spec.dsd)
    elif spec.kind in OWN_ENGINE:
        policy = Fixed.for_env(env, depth=0, verify_size=max(budgets))
    elif spec.kind == "heuristic":
        policy = Fixed.for_env(env, depth=max(depths), verify_size=max(budgets))
    elif spec.kind == "fixed" or spec.kind in PROPOSER_HEAD_KINDS:
        policy = Fixed.for_env(env, depth=spec.depth, verify_size=max(budgets) if spec.verify_size is None
                               else spec.verify_size)
    else:  # pragma: no cover - parse_policies(engine="vllm") refuses the rest
        raise AssertionError(spec.kind)
    policy.name = spec.label
    return policy


def engine_config_for(spec: PolicySpec, config) -> Any:
    """The ``VLLMEngineConfig`` of the engine ``spec`` runs on, under the serving ``config``."""
    from draftrl.decoding.vllm.engine import VLLMEngineConfig

    if spec.kind == REFERENCE:
        return VLLMEngineConfig.serving(config, method="none")
    table = {"dsd": spec.dsd} if spec.dsd else {}  # ngram / eagle3 with vLLM's Dynamic SD table
    if spec.kind == "ngram":
        return VLLMEngineConfig.serving(config, method="ngram", num_speculative_tokens=spec.depth, **table)
    if spec.kind == "eagle3":
        from draftrl.drafters.packaged import resolve_head

        return VLLMEngineConfig.serving(config, method="eagle3", head=resolve_head(config.head, config.target),
                                        num_speculative_tokens=spec.depth, **table)
    if spec.kind == "class":
        return VLLMEngineConfig.serving(config, method="custom_class", proposer=spec.path,
                                        num_speculative_tokens=spec.depth)
    if spec.kind in PROPOSER_HEAD_KINDS:
        from draftrl.drafters.packaged import resolve_head

        head = resolve_head(config.head, config.target)
        drafter = f"eagle3:{head}" if spec.kind == "head" else f"sam:{spec.min_match}:{head}"
        return VLLMEngineConfig.serving(config, method="draftrl", drafter=drafter,
                                        num_speculative_tokens=VLLM_MAX_DEPTH)
    return VLLMEngineConfig.serving(config, method="draftrl", num_speculative_tokens=VLLM_MAX_DEPTH)
