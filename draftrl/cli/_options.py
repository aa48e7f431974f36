"""The options every command spells the same way, declared once.

An option that sets a config value is shorthand for ``--set KEY=VALUE`` with the key below, so
a flag, a ``--set`` and a YAML file mean the same thing on every command that accepts them
(flags are applied after ``--set``, so a flag wins):

=================  =============  ==========================================================
option             config key     meaning
=================  =============  ==========================================================
``--config FILE``                 YAML overriding the command's defaults (``configs/``)
``--set K=V``      ``K``          one config key, e.g. ``env.max_new_tokens=32`` (repeatable)
``--target``       ``env.target``  target model: a known name, a local directory or a hub id
``--drafter``      ``env.drafter`` ``ngram[:MIN:MAX[:FIRST]]``, ``layerskip:N``, ``self``, ``none`` or a model
``--device``       ``env.device``  ``cpu`` or ``cuda[:N]``
``--dtype``        ``env.dtype``   ``float32``, ``bfloat16`` or ``float16``
``--kernels``      ``env.kernels`` ``auto`` (a timed probe on this machine), ``stock`` or ``fast_linear``
``--compile``      ``env.compile`` ``torch.compile`` the target's verify forward: ``off`` or a torch.compile mode
``--threads N``    ``threads``     torch intra-op threads (0 = torch's default)
``--seed N``       ``seed``        the command's seed (sampling, measurement order, PPO, ...)
``--ignore-eos``   ``env.ignore_eos``  decode to max_new_tokens past EOS (benchmarks, negative controls)
``--out PATH``                    where the command writes
``--overwrite``                   replace what an earlier run wrote in ``--out`` (else refused)
``--json``                        print one JSON object on stdout instead of tables
=================  =============  ==========================================================

Defaults are the config's (``None`` here means "not given"), so a command's default lives in
its config dataclass only.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TypeVar

T = TypeVar("T")

#: Model options: flag -> config key (the ``env`` section every decoding command reads).
MODEL_KEYS: dict[str, str] = {
    "--target": "env.target",
    "--drafter": "env.drafter",
    "--device": "env.device",
    "--dtype": "env.dtype",
    "--kernels": "env.kernels",
    "--compile": "env.compile",
}
_MODEL_HELP = {
    "--target": "target model: smollm2-135m, a local path or hub id",
    "--drafter": "ngram[:MIN:MAX[:earliest|latest]] | layerskip:N | self | eagle3[:PATH] (no PATH: the head draftrl ships for the target) | none | draft model path (same vocabulary)",
    "--device": "cpu or cuda[:N]",
    "--dtype": "float32, bfloat16 or float16",
    "--kernels": "few-token CPU kernels: auto (timed probe, cached per machine), stock or fast_linear",
    "--compile": "torch.compile the target's verify forward: off (default), default, reduce-overhead or max-autotune",
}


def keyed(parser: argparse.ArgumentParser, *flags: str, key: str, **kwargs: Any) -> argparse.Action:
    """An option that is shorthand for ``--set key=VALUE`` (applied only when given)."""
    kwargs.setdefault("default", None)
    action = parser.add_argument(*flags, **kwargs)
    keys = dict(parser.get_default("config_keys") or {})
    keys[action.dest] = key
    parser.set_defaults(config_keys=keys)
    return action


def add_config(parser: argparse.ArgumentParser, example: str = "env.max_new_tokens=32") -> None:
    """``--config FILE`` and ``--set KEY=VALUE``."""
    parser.add_argument("--config", default=None, help="YAML overriding the defaults (configs/*.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override one config key, e.g. --set {example} (repeatable)")


def add_models(parser: argparse.ArgumentParser) -> None:
    """``--target``, ``--drafter``, ``--device``, ``--dtype``: the ``env`` section's models."""
    for flag, key in MODEL_KEYS.items():
        keyed(parser, flag, key=key, help=f"{_MODEL_HELP[flag]} (sets {key})")


def add_threads(parser: argparse.ArgumentParser) -> None:
    keyed(parser, "--threads", key="threads", type=int,
          help="torch intra-op threads, 0 = torch's default (sets threads; default: the config's)")


def add_seed(parser: argparse.ArgumentParser, what: str) -> None:
    keyed(parser, "--seed", key="seed", type=int, help=f"seed of {what} (sets seed; default: the config's)")


def add_out(parser: argparse.ArgumentParser, help: str, *, required: bool = True, default: str | None = None,
            overwrite: str | None = "replace what an earlier run of this command wrote in --out") -> None:
    """``--out`` and, unless ``overwrite`` is None, ``--overwrite``: a command never silently
    replaces earlier outputs (``draftrl.io.prepare_out``)."""
    parser.add_argument("--out", required=required, default=default, help=help)
    if overwrite is not None:
        parser.add_argument("--overwrite", action="store_true", help=overwrite)


def add_ignore_eos(parser: argparse.ArgumentParser) -> None:
    keyed(parser, "--ignore-eos", key="env.ignore_eos", action="store_const", const=True,
          help="decode every request to its max_new_tokens past EOS, as vLLM's ignore_eos (sets env.ignore_eos)")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")


def samplers() -> tuple[str, ...]:
    """The verification rules ``--sampler`` accepts (``draftrl.config.SAMPLERS``)."""
    from draftrl.config import SAMPLERS

    return SAMPLERS


def overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` items, then one ``KEY=VALUE`` per keyed option the user gave."""
    items = list(getattr(args, "overrides", None) or [])
    for dest, key in (getattr(args, "config_keys", None) or {}).items():
        value = getattr(args, dest, None)
        if value is not None:
            items.append(f"{key}={json.dumps(list(value) if isinstance(value, tuple) else value)}")
    return items


def load(cls: type[T], args: argparse.Namespace, **kwargs: Any) -> T:
    """The command's config: ``cls`` defaults, ``--config``, ``--set`` and keyed options, in that order."""
    from draftrl.config import load_config

    return load_config(cls, getattr(args, "config", None), overrides(args), **kwargs)


def set_threads(threads: int) -> None:
    """Apply a config's ``threads`` to torch (0 leaves torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
