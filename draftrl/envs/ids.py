"""The draftrl gymnasium ids, defined once: what ``register`` gets and what a training section passes.

``import draftrl.envs`` registers them. Entry points are strings, so this module imports nothing
at import time and ``gymnasium.make`` imports an env's module only when that env is made. Time
limits live here (``max_episode_steps``), not in ``step``. An id's version goes up whenever its
reward or spaces change (its env's docstring keeps the Version History). One env class per
control level; a variant is a registration with ``kwargs`` (Gymnasium's ``LunarLanderContinuous``
pattern): the replayed ids are the live envs' classes with ``kwargs={"engine": "replay"}``.

Each entry also says how ``draftrl train`` makes the id from a training env section
(``make_kwargs``), so no module reads an env's arguments from its id's name:

- ``section``: where the id's own arguments are. ``"env"``: the section's ``EnvConfig`` keys,
  passed as ``config``; ``"serve"``: ``env.serve``'s ``ServeConfig`` keys, passed as ``config``;
  ``"analytic"``: ``env.analytic``'s keys that are set, passed one by one; None: the id is not
  made from a training section (``TraceChoice-v0`` is built by ``draftrl.train.choice``).
- ``takes``: further ``gymnasium.make`` arguments, each read from the section by its key; a dotted
  key reads a subsection (``serve.recordings`` -> ``recordings``). Those that default to None
  (``traces``, ``serve.recordings``, ``serve.calibration``) must be set.
- ``holds_model``: True for the live engines (a model on a device, one per process): ``draftrl train``
  runs them in its own process only (``ppo.vec_env: dummy``), never one per subprocess.

An id registered elsewhere (a test's own env) is made from a training section once
:func:`register_id` has recorded its ``section`` and ``takes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: Where an id's own arguments are in a training env section (``ENVS``' ``section``; None: not made from one).
SECTIONS: tuple[str | None, ...] = ("env", "serve", "analytic", None)
#: The keys of an ``ENVS`` entry that ``gymnasium.register`` gets; ``section`` and ``takes`` are draftrl's.
GYM_KEYS: tuple[str, ...] = ("id", "entry_point", "kwargs", "max_episode_steps", "nondeterministic")

#: Every draftrl id: its ``gymnasium.register`` arguments, and how a training section makes it.
ENVS: tuple[dict[str, Any], ...] = (
    # The article's analytic model (numpy only). Every round emits >= 1 token, so 1024 rounds never
    # truncate an episode of max_new_tokens <= 1024 (default 256); the limit is a safety net.
    dict(id="draftrl/Analytic-v0", entry_point="draftrl.envs.analytic:AnalyticEnv", max_episode_steps=1024,
         section="analytic"),
    # The real engine (torch + transformers, imported only when made). Rewards are wall clock, so
    # the ids are marked nondeterministic (gymnasium's checker then skips step determinism).
    dict(id="draftrl/SpecDecode-v2", entry_point="draftrl.envs.spec_decode:SpecDecodeEnv", max_episode_steps=1024,
         nondeterministic=True, section="env", holds_model=True),
    # One step per draft level: a round is at most max(depths) + 1 steps.
    dict(id="draftrl/SpecDecodeDepth-v2", entry_point="draftrl.envs.spec_decode_depth:SpecDecodeDepthEnv",
         max_episode_steps=16384, nondeterministic=True, section="env", takes=("verify_size",),
         holds_model=True),
    # SpecDecode-v2 over the replay of recorded greedy traces, seconds from a cost table: deterministic
    # given the seed.
    dict(id="draftrl/TraceReplay-v1", entry_point="draftrl.envs.spec_decode:SpecDecodeEnv", kwargs={"engine": "replay"},
         max_episode_steps=1024, section="env", takes=("traces",)),
    # Per-level CONTINUE/STOP on recorded traces (SpecDecodeDepth-v2 at replay speed).
    dict(id="draftrl/TraceReplayDepth-v1", entry_point="draftrl.envs.spec_decode_depth:SpecDecodeDepthEnv",
         kwargs={"engine": "replay"}, max_episode_steps=16384, section="env", takes=("traces", "verify_size")),
    # Per-round (drafter, depth) over several drafters' traces: deterministic given the seed. Built by
    # draftrl.train.choice from its traces, not from a training env section.
    dict(id="draftrl/TraceChoice-v0", entry_point="draftrl.envs.trace_choice:TraceChoiceEnv", max_episode_steps=1024,
         section=None),
    # A serving engine under load (vLLM in-process by default): one step = one engine step over the
    # batch; wall-clock rewards.
    dict(id="draftrl/ServeVLLM-v1", entry_point="draftrl.envs.serve_vllm:ServeVLLMEnv", max_episode_steps=8192,
         nondeterministic=True, section="serve", holds_model=True),
    # ServeVLLM-v1 over its replay: recorded continuations (greedy and sampled), recomputed drafts, a calibrated
    # step cost.
    dict(id="draftrl/ServeReplay-v1", entry_point="draftrl.envs.serve_vllm:ServeVLLMEnv", kwargs={"engine": "replay"},
         max_episode_steps=8192, section="serve",
         takes=("serve.recordings", "serve.calibration", "serve.cost_jitter", "serve.cost_noise", "serve.loads")),
)

#: Ids whose spaces changed, by the id that replaced them, and why. They are not registered, so
#: ``gymnasium.make`` refuses them itself naming the new version (``DeprecatedEnv``); :func:`find` (a training
#: config's ``env.id``) and policy manifests that name them (``draftrl.policies.ppo``) refuse them in one line.
RETIRED: dict[str, tuple[str, str]] = {
    "draftrl/SpecDecode-v1": ("draftrl/SpecDecode-v2", "the observation gained the request's sampling and the "
                              "target's signals (issue 45)"),
    "draftrl/SpecDecodeDepth-v1": ("draftrl/SpecDecodeDepth-v2", "the observation gained the request's sampling and "
                                   "the target's signals (issue 45)"),
    "draftrl/TraceReplay-v0": ("draftrl/TraceReplay-v1", "the observation gained the request's sampling and the "
                               "target's signals (issue 45)"),
    "draftrl/TraceReplayDepth-v0": ("draftrl/TraceReplayDepth-v1", "the observation gained the request's sampling "
                                    "and the target's signals (issue 45)"),
    "draftrl/ServeVLLM-v0": ("draftrl/ServeVLLM-v1", "the observation gained the batch's sampling (issue 46)"),
    "draftrl/ServeReplay-v0": ("draftrl/ServeReplay-v1", "the observation gained the batch's sampling (issue 46)"),
}


def retired_message(env_id: str, where: str = "env.id") -> str | None:
    """The one-line refusal of a retired id (naming the new one), or None for an id that is not retired."""
    if env_id not in RETIRED:
        return None
    new, why = RETIRED[env_id]
    return (f"{where}={env_id!r} is retired: {why}; use {new!r} (a policy trained on {env_id} must be trained "
            f"again there with draftrl train).")


#: What a ``takes`` key that must be set holds, for the error that says it is not.
REQUIRED: dict[str, str] = {
    "traces": "a directory written by draftrl collect (see configs/cpu_default.yaml)",
    "serve.recordings": "a directory written by draftrl collect --engine vllm (see configs/serve_replay_cpu.yaml)",
    "serve.calibration": "the JSON written by draftrl calibrate --engine vllm (see configs/serve_replay_cpu.yaml)",
}

#: Ids registered outside ``ENVS`` (:func:`register_id`), by id.
_REGISTERED: dict[str, dict[str, Any]] = {}


def register_all(registry: dict[str, Any], register: Callable[..., Any]) -> None:
    """``register(**kwargs)`` (the ``GYM_KEYS``) for every id of :data:`ENVS` not in ``registry`` yet
    (a reloaded ``draftrl.envs`` registers nothing twice: gymnasium would warn "Overriding environment")."""
    for entry in ENVS:
        if entry["id"] not in registry:
            register(**{key: entry[key] for key in GYM_KEYS if key in entry})


def register_id(*, id: str, section: str | None, takes: tuple[str, ...] = (), holds_model: bool = False,
                **gym_kwargs: Any) -> None:
    """Register an id that is not in :data:`ENVS` (a test's own env) with gymnasium and record how a
    training section makes it (``section``, ``takes``, ``holds_model``: as in ``ENVS``), so ``env.id``
    may name it.

    :raises ValueError: for a ``section`` that is not one of :data:`SECTIONS`, a ``takes`` that is
        not a tuple of keys, a ``gymnasium.register`` argument outside :data:`GYM_KEYS`, or a draftrl id.
    """
    from gymnasium.envs.registration import register, registry

    if section not in SECTIONS:
        raise ValueError(f"register_id(section={section!r}) must be one of {SECTIONS}: where the id's arguments are.")
    if not (isinstance(takes, tuple) and all(isinstance(key, str) and key for key in takes)):
        raise ValueError(f"register_id(takes={takes!r}) must be a tuple of section keys (e.g. ('verify_size',)).")
    unknown = sorted(set(gym_kwargs) - set(GYM_KEYS))
    if unknown:
        raise ValueError(f"register_id got {unknown}, which gymnasium.register does not take here; use {GYM_KEYS}.")
    if any(entry["id"] == id for entry in ENVS):
        raise ValueError(f"register_id(id={id!r}): draftrl registers that id itself (draftrl.envs.ids.ENVS).")
    _REGISTERED[id] = dict(id=id, section=section, takes=takes, holds_model=bool(holds_model), **gym_kwargs)
    if id not in registry:
        register(id=id, **gym_kwargs)


def registered_at_run_time(env_id: str) -> dict[str, Any] | None:
    """The :func:`register_id` arguments of ``env_id`` if this process registered it (None for draftrl's
    own ids): a subprocess that imports ``draftrl.envs`` knows only those, so it registers this one again."""
    return _REGISTERED.get(env_id)


def holds_model(env_id: str, where: str = "env.id") -> bool:
    """Whether ``env_id``'s env loads a model (a live engine): then it is made in one process only."""
    return bool(find(env_id, where).get("holds_model", False))


def find(env_id: str, where: str = "env.id") -> dict[str, Any]:
    """The registry entry of ``env_id`` (an ``ENVS`` entry, or one :func:`register_id` recorded).

    :raises ValueError: for an id neither holds, naming ``where`` (the config key that gave it); a
        :data:`RETIRED` id names its replacement.
    """
    for entry in ENVS:
        if entry["id"] == env_id:
            return entry
    if env_id in _REGISTERED:
        return _REGISTERED[env_id]
    retired = retired_message(env_id, where)
    if retired is not None:
        raise ValueError(retired)
    known = ", ".join(entry["id"] for entry in ENVS if entry["section"] is not None)
    raise ValueError(f"{where}={env_id!r} is not a draftrl env id; use one of {known}, or register it with "
                     "draftrl.envs.ids.register_id(id=..., entry_point=..., section=..., takes=...).")


def section_of(env_id: str, where: str = "env.id") -> str:
    """Where a training env section holds ``env_id``'s own arguments: ``env``, ``serve`` or ``analytic``.

    :raises ValueError: for an unknown id, or one that no training section makes (``section`` None).
    """
    kind = find(env_id, where)["section"]
    if kind is None:
        raise ValueError(f"{where}={env_id!r} is not made from a training env section (docs/envs.md shows how it "
                         "is built); use an id whose arguments a section holds.")
    return kind


def make_kwargs(section: Mapping[str, Any], where: str = "env") -> dict[str, Any]:
    """The ``gymnasium.make(section["id"], ...)`` arguments of a training env section, read from the
    id's registry entry (``section``, ``takes``), never from its name.

    :param section: the section as plain data: a run's saved ``config.json`` section, or
        ``to_dict`` of ``draftrl.train.env_config.TrainEnvConfig``.
    :param where: the section's name (``env``, ``depth_env``, ``finetune_env``), for errors.
    :raises ValueError: for an id that no training section makes, or a required argument not set.
    """
    from draftrl.config import from_section
    from draftrl.config.env import EnvConfig
    from draftrl.config.serve import ServeConfig

    env_id = section.get("id")
    kind = section_of(env_id, f"{where}.id")
    if kind == "env":
        kwargs: dict[str, Any] = {"config": from_section(EnvConfig, section, prefix=f"{where}.")}
    elif kind == "serve":
        kwargs = {"config": from_section(ServeConfig, section.get("serve") or {}, prefix=f"{where}.serve.")}
    else:
        kwargs = {key: value for key, value in (section.get(kind) or {}).items() if value is not None}
    unset = []
    for key in find(env_id).get("takes", ()):
        value: Any = section
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is None:
            unset.append(key)
        kwargs[key.rpartition(".")[2]] = value
    if unset:
        needs = "; ".join(f"{key}: {REQUIRED.get(key, 'required')}" for key in unset)
        raise ValueError(f"{' and '.join(f'{where}.{key}' for key in unset)} {'is' if len(unset) == 1 else 'are'} "
                         f"not set; {env_id} needs {needs}.")
    return kwargs
