"""Strict YAML -> dataclass configs: unknown or mistyped keys fail with one line naming them.

Defaults live in code as dataclasses; YAML files in ``configs/`` override only what differs,
and ``--set section.key=value`` overrides on the command line.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


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


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Load ``cls`` defaults, then the YAML file at ``path``, then ``key=value`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist; pass a file from configs/")
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a mapping at top level")
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"--set {item!r} must look like section.key=value")
        key, raw = item.split("=", 1)
        _set(data, key.strip(), yaml.safe_load(raw))
    return from_dict(cls, data)
