"""How each policy of ``draftrl eval --engine vllm`` is built: its engine, its env's rule, its ``Policy``.

The names are ``draftrl.eval.policy_names``' (one grammar for both engines). Every policy acts
through the ``draftrl.policies.Policy`` interface on ``draftrl/ServeVLLM-v1`` (or the replay,
``ServeReplay-v1``), whose second action grid is the batch's verification budget:

- ``none``, ``vllm-ngram:K``, ``vllm-eagle3:K``, ``vllm-class:MODULE.Class:K``: ``Fixed`` at depth
  0; the engine (vLLM without speculation, its own prompt lookup, its own EAGLE-3 with the head of
  :func:`stock_head`, another ``custom_class`` proposer) ignores the action; ``vllm-ngram:S-E:K,...``
  and ``vllm-eagle3:S-E:K,...`` give the stock method vLLM's Dynamic SD table instead of one K;
- every other name runs draftrl's proposer with the policy's drafter (:func:`policy_drafter`:
  ``@DRAFTER``, else ``env.drafter``, n-gram lookup by default; ``eagle3[:DIR]`` and
  ``sam:N[:DIR]`` run the head inside the proposer, :mod:`draftrl.decoding.vllm.head_proposer`):

  - ``fixed:D[:V]``: ``Fixed`` at depth D and budget V (no V: the largest budget, no limit);
  - ``stop:K:tT`` / ``stop:K:cT``: ``Fixed`` at depth K, no budget, with the head's per-level stop
    as the proposer's rule; ``:bB`` on ``fixed`` or ``stop``: the head only in steps of at most B
    decoding requests (the rule's load part);
  - ``heuristic``: ``Fixed`` at the deepest depth, no budget, with the per-request rule
    ``heuristic`` (Hugging Face's +2 / -1 inside the proposer, ``draftrl.decoding.schedule``);
  - ``dsd[:S-E:K,...]``: ``DynamicSD``, K from the running batch size;
  - ``ppo:DIR``: ``PPOPolicy`` trained on a serving env (grids and features checked).
"""

from __future__ import annotations

from typing import Any

from draftrl.eval.policy_names import REFERENCE, VLLM_MAX_DEPTH, PolicyName

#: Kinds whose engine is not draftrl's proposer (the action is ignored).
OWN_ENGINE = (REFERENCE, "vllm-ngram", "vllm-eagle3", "vllm-class")


def policy_drafter(spec: PolicyName, config) -> str:
    """The drafter spec ``spec`` drafts with: its own (``@DRAFTER``), else the run's (``env.drafter``)."""
    return spec.drafter or config.drafter


def _head_of(spec: PolicyName, config) -> tuple[int | None, str] | None:
    """``(SAM's N or None, the head folder or hub id)`` of the head ``spec``'s drafter runs (its own
    folder, else the one draftrl ships for the target), or None when the drafter runs no head."""
    from draftrl.decoding.vllm.head_proposer import head_spec
    from draftrl.drafters.packaged import resolve_head

    parsed = head_spec(policy_drafter(spec, config))
    if parsed is None:
        return None
    min_match, path = parsed
    return min_match, resolve_head(path, config.target)


def stock_head(spec: PolicyName, config) -> str:
    """The head ``vllm-eagle3`` loads: the one its drafter names (``@eagle3:DIR``, ``@sam:N:DIR``,
    else ``env.drafter`` when that runs a head), else the one draftrl ships for the target."""
    from draftrl.drafters.packaged import resolve_head

    head = _head_of(spec, config)
    return head[1] if head is not None else resolve_head(None, config.target)


def proposer_drafter(spec: PolicyName, config) -> str:
    """The drafter spec draftrl's proposer gets for ``spec``: its drafter, with the head folder
    resolved when it runs one (``eagle3:DIR``, ``sam:N:DIR``: one head, one engine)."""
    head = _head_of(spec, config)
    if head is None:
        return policy_drafter(spec, config)
    min_match, folder = head
    return f"eagle3:{folder}" if min_match is None else f"sam:{min_match}:{folder}"


def proposer_rule(spec: PolicyName) -> str:
    """Each request's own depth before the step's cap and budget (``ServeConfig.rule``): ``heuristic``,
    or ``match`` / the head's per-level stop with the head's load part where the name has them
    (``confidence:0.6|batch:1``, :mod:`draftrl.decoding.vllm.control`)."""
    if spec.kind == "heuristic":
        return "heuristic"
    rule = spec.stop or "match"
    if spec.head_max_batch is None:
        return rule
    from draftrl.decoding.vllm.control import LOAD_SEP

    return f"{rule}{LOAD_SEP}{spec.head_max_batch}"


def check_policies(specs: list[PolicyName], config) -> None:
    """Refuse, before any engine loads (one line naming the fix), a ``fixed:D[:V]`` off the serving
    config's grids, a drafter that cannot run inside vLLM's proposer, a head (``vllm-eagle3``, an
    ``eagle3`` or ``sam`` drafter) that is missing or that vLLM cannot load, and a head rule
    (``stop``, ``:bB``) whose drafter runs no head."""
    from draftrl.decoding.vllm.head_proposer import head_spec
    from draftrl.decoding.vllm.proposer import serving_drafter
    from draftrl.drafters.eagle3 import head_config
    from draftrl.drafters.packaged import resolve_head
    from draftrl.models import model_folder

    depths, budgets = config.depths, config.budgets
    for spec in specs:
        if spec.kind in (REFERENCE, "vllm-ngram", "vllm-class"):
            continue
        drafter = policy_drafter(spec, config)
        head = head_spec(drafter)  # a malformed sam:N[:DIR] fails here, in its own line
        if head is not None or spec.kind == "vllm-eagle3":
            try:
                folder = resolve_head(head[1] if head is not None else None, config.target)
            except ValueError as err:
                raise ValueError(f"policy {spec.label!r} needs an EAGLE-3 head folder; name one with @eagle3:DIR or "
                                 f"--drafter eagle3:DIR (sets env.drafter): {err}") from None
            head_config(model_folder(folder, "EAGLE-3 head"))  # one line naming what the folder lacks
        else:
            try:
                serving_drafter(drafter)
            except ValueError as err:
                raise ValueError(f"policy {spec.label!r} drafts with {drafter!r}, which vLLM's proposer cannot run: "
                                 f"{err}") from None
        if head is None and (spec.stop or spec.head_max_batch is not None):
            what = "stops on its head's confidence" if spec.stop else "limits its head to small steps (:bB)"
            raise ValueError(f"policy {spec.label!r} {what}, but its drafter {drafter!r} runs no head; draft with one: "
                             f"{spec.text.partition('@')[0]}@eagle3[:DIR] or @sam:N[:DIR], or --drafter eagle3[:DIR].")
        if spec.kind != "fixed":
            continue
        if spec.depth not in depths or (spec.verify_size is not None and spec.verify_size not in budgets):
            raise ValueError(f"policy {spec.label!r} is off the serving grid depths={list(depths)}, "
                             f"budgets={list(budgets)}; pick values from them or set env.depths / env.budgets.")


def build_serving_policy(spec: PolicyName, env: Any):
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
    elif spec.kind in ("fixed", "stop"):
        policy = Fixed.for_env(env, depth=spec.depth, verify_size=max(budgets) if spec.verify_size is None
                               else spec.verify_size)
    else:  # pragma: no cover - parse_policies(engine="vllm") refuses the rest
        raise AssertionError(spec.kind)
    policy.name = spec.label
    return policy


def engine_config_for(spec: PolicyName, config) -> Any:
    """The ``VLLMEngineConfig`` of the engine ``spec`` runs on, under the serving ``config``."""
    from draftrl.decoding.vllm.engine import VLLMEngineConfig

    if spec.kind == REFERENCE:
        return VLLMEngineConfig.serving(config, method="none")
    table = {"dsd": spec.dsd} if spec.dsd else {}  # vllm-ngram / vllm-eagle3 with vLLM's Dynamic SD table
    if spec.kind == "vllm-ngram":
        return VLLMEngineConfig.serving(config, method="ngram", num_speculative_tokens=spec.depth, **table)
    if spec.kind == "vllm-eagle3":
        return VLLMEngineConfig.serving(config, method="eagle3", head=stock_head(spec, config),
                                        num_speculative_tokens=spec.depth, **table)
    if spec.kind == "vllm-class":
        return VLLMEngineConfig.serving(config, method="custom_class", proposer=spec.path,
                                        num_speculative_tokens=spec.depth)
    return VLLMEngineConfig.serving(config, method="draftrl", drafter=proposer_drafter(spec, config),
                                    num_speculative_tokens=VLLM_MAX_DEPTH)
