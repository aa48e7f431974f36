"""Strict YAML -> dataclass configs: unknown or mistyped keys fail with one line naming them.

Defaults live in code as dataclasses; YAML files in ``configs/`` override only what differs,
and ``--set section.key=value`` overrides on the command line.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

#: Verification rules: ``correct``, and two known-wrong rules for negative controls only:
#: ``resample-from-p`` (after a rejection, sample from p instead of the residual; the control of the
#: exactness monitor and of ``draftrl selftest``) and ``off-by-one`` (at a round's first rejection,
#: emit and keep the rejected draft token: one more accepted than the rule allows; the control of the
#: engine's per-token argmax check at temperature 0 and of the monitor at temperature > 0).
SAMPLERS: tuple[str, ...] = ("correct", "resample-from-p", "off-by-one")
#: The rules ``draftrl selftest`` runs on its one-node vectors (``off-by-one`` is a rule of the whole
#: acceptance walk: the engine-level tests control it).
SELFTEST_SAMPLERS: tuple[str, ...] = ("correct", "resample-from-p")
#: The baselines, by the one name configs (``baselines``, ``eval.policies``), tables and reports use:
#: Hugging Face's +2/-1 schedule, the confidence threshold, the UCB bandit, the lookahead bound.
BASELINES: tuple[str, ...] = ("heuristic", "threshold", "bandit", "lookahead")
#: Few-token CPU kernel choices of ``env.kernels`` (``draftrl.models.kernels`` implements them).
KERNELS: tuple[str, ...] = ("auto", "stock", "fast_linear")
#: ``torch.compile`` of the target's verify forward: off, or one of torch.compile's modes
#: (``EngineConfig.compile``, ``env.compile``, ``--compile``).
COMPILE_MODES: tuple[str, ...] = ("off", "default", "reduce-overhead", "max-autotune")
#: Weights & Biases modes of every command's ``wandb`` section (``WANDB_MODE`` wins).
WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Convert a YAML value to ``annotation``, recursing into nested dataclasses."""
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        if not isinstance(value, dict):
            raise ValueError(f"config key '{where}' must be a mapping, got {value!r}")
        return from_dict(annotation, value, prefix=f"{where}.")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except (ValueError, TypeError):
                continue
        raise ValueError(f"config key '{where}' has value {value!r}, expected {annotation}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key '{where}' must be a list, got {value!r}")
        (item,) = typing.get_args(annotation)[:1] or (Any,)
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"config key '{where}' has value {value!r}, expected float") from None
    if annotation in (int, str, bool) and not isinstance(value, annotation) or (
        annotation is int and isinstance(value, bool)
    ):
        raise ValueError(f"config key '{where}' has value {value!r}, expected {annotation.__name__}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", base: T | None = None) -> T:
    """Build ``cls`` from a mapping, refusing keys that ``cls`` does not declare.

    Keys the mapping leaves out keep their values in ``base`` (default: ``cls()``'s), so a nested
    section keeps the defaults its parent's ``default_factory`` gave it."""
    types_ = _field_types(cls)
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in types_:
            moved = getattr(cls, "moved_key", None)
            if moved is not None and moved(data, key, prefix):
                raise ValueError(f"{moved(data, key, prefix)} (configs/ shows the env section's shape)")
            close = difflib.get_close_matches(key, types_, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(types_)}"
            raise ValueError(f"unknown config key '{prefix}{key}'{hint}")
        annotation = types_[key]
        if dataclasses.is_dataclass(annotation) and isinstance(annotation, type) and isinstance(value, dict):
            nested_base = getattr(base, key) if base is not None else _field_default(defaults[key])
            kwargs[key] = from_dict(annotation, value, prefix=f"{prefix}{key}.", base=nested_base)
        else:
            kwargs[key] = _coerce(value, annotation, f"{prefix}{key}")
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)


def from_section(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """``from_dict`` of the keys of ``data`` that are ``cls``'s fields: a section that holds them and
    more (a training env section holds ``EnvConfig``'s keys beside ``id``, ``traces``, ...)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return from_dict(cls, {key: value for key, value in data.items() if key in names}, prefix=prefix)


def resolve(cls: type[T], config: T | dict[str, Any] | None, overrides: dict[str, Any]) -> T:
    """A ``cls`` from a config, a mapping of its fields or None, plus keyword overrides: how the
    envs take their ``gym.make`` arguments. Unknown keys fail naming the closest valid one
    (``gym.make("draftrl/SpecDecode-v2", depth=4)`` names ``depths``)."""
    if config is None:
        config = cls()
    elif isinstance(config, dict):
        config = from_dict(cls, config)
    elif not isinstance(config, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"config must be {article} {cls.__name__}, a dict of its fields or None, "
                        f"got {type(config).__name__}.")
    if not overrides:
        return config
    merged = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls)}
    for key in overrides:
        if key not in merged:
            from_dict(cls, {key: overrides[key]})  # raises naming the closest valid key
    return cls(**{**merged, **overrides})


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def to_dict(obj: Any) -> dict[str, Any]:
    """The resolved config as plain data, for summaries, checkpoints and ONNX manifests."""
    return dataclasses.asdict(obj)


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {dotted}: '{part}' is not a section")
    node[leaf] = value


#: Every top-level key some command's config reads (``tests/cli/test_cli_options.py`` keeps it equal to
#: the union of their fields). A ``partial`` load skips the ones its command does not read, since
#: one file may drive ``collect``, ``grid``, ``eval``, ``demo`` and ``train``, and refuses any other.
SECTIONS = frozenset({
    "env", "threads", "seed", "depth", "verify_size", "sampler", "calibrate", "grid", "eval", "wandb", "train",
    "recipe", "ppo", "total_timesteps", "finetune_real_timesteps", "finetune_env", "depth_env", "cotrain_rounds",
    "frozen_size_policy", "eval_episodes", "eval_seed", "baselines", "checkpoint_every", "keep", "select_episodes",
    "select_seed", "progress_bar", "continuations",
})


def refuse_unknown_sections(data: dict[str, Any], path: Path, known: set[str] | frozenset[str]) -> None:
    """A top-level key no command reads (a typo such as ``enviroment:``) fails with the closest name;
    otherwise the defaults would silently run in its place."""
    import difflib

    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.4)
            hint = f"did you mean '{close[0]}'?" if close else f"sections: {', '.join(sorted(known))}"
            raise ValueError(f"config file {path} has an unknown section '{key}'; {hint}")


def read_yaml(path: str | Path) -> Any:
    """The YAML document in ``path``; a syntax error is one ``ValueError`` line ``FILE:LINE:COLUMN: ...``."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = " ".join(str(err.problem or err.context or "syntax error").split())
        raise ValueError(f"{where}: YAML syntax error: {what}; fix the file (configs/ holds examples).") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: YAML error: {' '.join(str(err).split())}; fix the file.") from None


def read_env_file(path: str | Path) -> dict[str, Any]:
    """A config file that holds an ``env:`` section (the workload keys every decoding command
    reads), checked: it exists, is a mapping, names no unknown top-level section. Returns the
    whole mapping; each command takes ``env`` and the top-level keys it owns."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"config file {path} does not exist; pass a file from configs/")
    loaded = read_yaml(path)
    if not isinstance(loaded, dict) or not isinstance(loaded.get("env") or {}, dict):
        raise ValueError(f"config file {path} must be a mapping with an env: section")
    refuse_unknown_sections(loaded, Path(path), SECTIONS)
    return loaded


#: shipped config files that were renamed, by their old name (one word per concept: "replay")
RENAMED_CONFIGS = {"serve_sim_cpu.yaml": "configs/serve_replay_cpu.yaml"}


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None, *,
                base: T | None = None, partial: bool = False) -> T:
    """Load ``cls`` defaults (or ``base``), then the YAML file at ``path``, then ``key=value`` overrides.

    :param partial: the file may hold sections of other commands (one YAML drives ``collect``,
        ``grid``, ``eval``...): its top-level keys that ``cls`` does not declare are skipped.
        Overrides stay strict: an unknown ``--set`` key fails with the closest valid one.
    """
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            if path.name in RENAMED_CONFIGS:
                raise FileNotFoundError(f"config file {path} was renamed: pass {RENAMED_CONFIGS[path.name]}")
            raise FileNotFoundError(f"config file {path} does not exist; pass a file from configs/")
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a mapping at top level")
        if partial:
            known = {f.name for f in dataclasses.fields(cls)}
            refuse_unknown_sections(data, path, known | SECTIONS)
            data = {key: value for key, value in data.items() if key in known}
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"--set {item!r} must look like section.key=value")
        key, raw = item.split("=", 1)
        _set(data, key.strip(), yaml.safe_load(raw))
    return from_dict(cls, data, base=base)
