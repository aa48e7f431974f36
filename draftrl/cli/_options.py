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
``--drafter``      ``env.drafter`` ``ngram[:MIN:MAX[:FIRST]]``, ``eagle3[:DIR]``, ``sam:N[:DIR]``, ``layerskip:N``,
                                  ``self``, ``none`` or a model (``--engine vllm``: the first three)
``--device``       ``env.device``  ``cpu`` or ``cuda[:N]``
``--dtype``        ``env.dtype``   ``float32``, ``bfloat16`` or ``float16``
``--kernels``      ``env.kernels`` ``auto`` (a timed probe on this machine), ``stock`` or ``fast_linear``
``--compile``      ``env.compile`` ``torch.compile`` the target's verify forward: ``off`` or a torch.compile mode
``--threads N``    ``threads``     torch intra-op threads (0 = torch's default)
``--seed N``       ``seed``        the command's seed (sampling, measurement order, PPO, ...)
``--ignore-eos``   ``env.ignore_eos``  decode to max_new_tokens past EOS (benchmarks, negative controls)
``--wandb-project``  ``wandb.project``  the wandb project of every run the command (pipeline) makes
``--wandb-group``    ``wandb.group``    their group (default: the output folder's name and a short id)
``--wandb-entity``   ``wandb.entity``   the wandb team or user (default: yours)
``--gpu-memory-utilization``  ``env.gpu_memory_utilization``  vLLM: the GPU memory share of each engine
``--enforce-eager``  ``env.enforce_eager``  vLLM: eager forwards on a GPU too (default: CUDA graphs there)
``--tensor-parallel-size N``  ``env.tensor_parallel_size``  vLLM: GPUs each engine splits the target over
``--out PATH``                    where the command writes
``--overwrite``                   replace what an earlier run wrote in ``--out`` (else refused)
``--json``                        print one JSON object on stdout instead of tables
=================  =============  ==========================================================

Defaults are the config's (``None`` here means "not given"), so a command's default lives in
its config dataclass only. ``draftrl demo --engine vllm`` reads the first two vLLM engine flags into
``ServeDemoConfig``'s top-level keys of the same name (it has no ``env`` section; its steps steer
draftrl's proposer, which runs on one tensor-parallel worker only).
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
    "--drafter": "ngram[:MIN:MAX[:earliest|latest]] | eagle3[:PATH] (PATH: a head folder in the speculators or EAGLE "
                 "layout, or a hub id; no PATH: the head draftrl ships for the target) | sam:N[:PATH] | layerskip:N | "
                 "self | none | draft model path (same tokenizer); --engine vllm: ngram, eagle3 or sam, default "
                 "ngram:1:3:latest",
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


#: vLLM engine options: flag -> config key (``ServeConfig`` fields, ``draftrl.config.serve``).
VLLM_ENGINE_KEYS: dict[str, str] = {
    "--gpu-memory-utilization": "env.gpu_memory_utilization",
    "--enforce-eager": "env.enforce_eager",
    "--tensor-parallel-size": "env.tensor_parallel_size",
}


def add_vllm_engine(parser: argparse.ArgumentParser, section: str | None = "env") -> None:
    """``--gpu-memory-utilization`` and ``--enforce-eager``, read with ``--engine vllm`` only.

    :param section: the config section holding their keys: ``env`` (a ``ServeConfig``: eval, collect,
        calibrate), None for a config that holds them at its top level (``ServeDemoConfig``: demo).
    """
    def key(flag: str) -> str:
        return VLLM_ENGINE_KEYS[flag] if section == "env" else VLLM_ENGINE_KEYS[flag].partition(".")[2]

    keyed(parser, "--gpu-memory-utilization", key=key("--gpu-memory-utilization"), type=float,
          help="vllm: the share of the GPU's memory each engine takes (default: vLLM's 0.9; a comparison holds one "
               "engine at a time, env.max_engines); not read on CPU")
    keyed(parser, "--enforce-eager", key=key("--enforce-eager"), action="store_const", const=True,
          help="vllm: eager forwards on a GPU too (default: CUDA graphs on a GPU, what production runs; eager on CPU)")
    if section == "env":  # the serve demo steers draftrl's proposer in every step: one worker (check_parallelism)
        keyed(parser, "--tensor-parallel-size", key=key("--tensor-parallel-size"), type=int,
              help="vllm: GPUs each engine splits the target over (vLLM's tensor parallelism; default 1). "
                   "draftrl's stepped proposer needs 1; vLLM's own methods and exported bundles take any")


def add_retired(parser: argparse.ArgumentParser, flag: str, replacement: str) -> None:
    """A flag of an earlier release, hidden from ``--help``: :func:`refuse_retired` names ``replacement``."""
    dest = f"retired_{flag.lstrip('-').replace('-', '_')}"
    parser.add_argument(flag, dest=dest, default=None, help=argparse.SUPPRESS)
    retired = dict(parser.get_default("retired_flags") or {})
    retired[flag] = replacement
    parser.set_defaults(retired_flags=retired)


def refuse_retired(args: argparse.Namespace) -> None:
    """One line naming the replacement of a retired flag the command line gave (:func:`add_retired`)."""
    for flag, replacement in (getattr(args, "retired_flags", None) or {}).items():
        value = getattr(args, f"retired_{flag.lstrip('-').replace('-', '_')}", None)
        if value is not None:
            raise ValueError(f"{flag} is gone: {replacement.format(value=value)}.")


def refuse_vllm_engine(args: argparse.Namespace, command: str) -> None:
    """One line when a vLLM engine option reaches an ``--engine hf`` run, which has no vLLM engine."""
    for flag in VLLM_ENGINE_KEYS:
        if getattr(args, flag.lstrip("-").replace("-", "_"), None) is not None:
            raise ValueError(f"{flag} is read by {command} --engine vllm only; drop it, or add --engine vllm.")


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


#: Weights & Biases options: flag -> config key (the ``wandb`` section of every command that logs).
WANDB_KEYS: dict[str, str] = {"--wandb-project": "wandb.project", "--wandb-group": "wandb.group",
                              "--wandb-entity": "wandb.entity"}


def add_wandb(parser: argparse.ArgumentParser) -> None:
    """``--wandb-project``, ``--wandb-group``, ``--wandb-entity``: where the command's runs go
    (offline by default: ``wandb sync DIR/wandb`` uploads them)."""
    for flag, key in WANDB_KEYS.items():
        keyed(parser, flag, key=key, help=f"{key.split('.')[1]} of every wandb run this command makes (sets {key})")


def add_ignore_eos(parser: argparse.ArgumentParser) -> None:
    keyed(parser, "--ignore-eos", key="env.ignore_eos", action="store_const", const=True,
          help="decode every request to its max_new_tokens past EOS, as vLLM's ignore_eos (sets env.ignore_eos)")


def add_ray(parser: argparse.ArgumentParser, what: str) -> None:
    """``--ray [ADDRESS]``, ``--ray-workers N``, ``--ray-gpus G`` (``draftrl.cluster``)."""
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help=f"{what} (pip install \"draftrl[ray]\"): the cluster at ADDRESS, or a local one on "
                             "127.0.0.1; the same files as one process")
    parser.add_argument("--ray-workers", type=int, default=2,
                        help="--ray: workers, each loading the engine once (default 2)")
    parser.add_argument("--ray-gpus", type=float, default=0.0,
                        help="--ray: GPUs per worker (num_gpus; a target split over GPUs: all of them; default 0, CPU)")


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


def drafter_given(args: argparse.Namespace) -> bool:
    """Whether the command line names the drafter (``--drafter`` or ``--set env.drafter=...``)."""
    return getattr(args, "drafter", None) is not None or any(
        item.partition("=")[0].strip() == "env.drafter" for item in getattr(args, "overrides", None) or [])


def settle_drafter(env: T, args: argparse.Namespace) -> T:
    """``env`` with a drafter whose EAGLE-3 head exists, decided before any model loads.

    A drafter that needs the head draftrl ships for the target (``eagle3``, ``sam:N``) where none
    ships (``draftrl.drafters.packaged.missing_head``): named on the command line, it is refused
    with the one line that says how to train the head; from a config file or a default (the
    demo's ``sam:2``), the command drafts by n-gram lookup instead and prints that line once.
    """
    import dataclasses
    import sys

    from draftrl.drafters.packaged import FALLBACK_DRAFTER, missing_head

    line = missing_head(env.drafter, env.target)
    if line is None:
        return env
    if drafter_given(args):
        raise ValueError(f"{line}; or draft by lookup with --drafter {FALLBACK_DRAFTER}.")
    command = getattr(args, "command", None) or ""
    print(f"draftrl {command}: {line}; drafting with {FALLBACK_DRAFTER} (n-gram lookup) instead.", file=sys.stderr)
    return dataclasses.replace(env, drafter=FALLBACK_DRAFTER)


def is_demo_file(path: str | None) -> bool:
    """A demo config: a YAML file with the demo's ``train:`` section (``configs/demo_cpu.yaml`` and its copies)."""
    from pathlib import Path

    from draftrl.config import read_yaml

    if path is None or not Path(path).is_file():
        return False
    data = read_yaml(path)
    return isinstance(data, dict) and isinstance(data.get("train"), dict)


def load_step(cls: type[T], args: argparse.Namespace) -> T:
    """The config of a command the demo runs as a step (``calibrate``, ``collect``, ``grid``, ``eval``).

    A demo config (:func:`is_demo_file`) is read as ``draftrl demo`` reads it and the command takes
    what its step reads (``draftrl.eval.round.demo.step_config``: the same sections, defaults and split),
    so one demo step reruns with the demo's file; of any other file the sections of other commands
    are skipped. Unknown keys inside the sections read, and every ``--set``, stay strict.
    """
    from draftrl.config import load_config

    path = getattr(args, "config", None)
    if is_demo_file(path):
        from draftrl.eval.round.demo import DemoConfig, step_config

        demo = load_config(DemoConfig, path, partial=True)
        return load_config(cls, None, overrides(args), base=step_config(demo, cls))
    return load_config(cls, path, overrides(args), partial=True)


def set_threads(threads: int) -> None:
    """Apply a config's ``threads`` to torch (0 leaves torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
