"""``draftrl collect --ray [ADDRESS]``: the prompts of one trace collection shared out over Ray workers.

Each worker (a Ray actor) loads the engine once, exactly as the one-process ``draftrl collect`` does
(``draftrl.decoding.build.build_engine`` on its own device: Ray gives an actor asking for
``num_gpus`` its GPUs through ``CUDA_VISIBLE_DEVICES``), and records one prompt per task with
:func:`draftrl.replay.traces.collect` over that prompt alone. A prompt's recordings depend on the
prompt only (its budget, its continuations at every sampling class, each seeded from the prompt's id,
the drafter's trees from every prefix), so the files a worker sends back are the ones the one-process
collection keeps for it, ``OUT/.partial/NNNNN-cC-kK.npz`` (NNNNN the prompt's index in the selection,
:func:`~draftrl.replay.traces.recording_file`); this process writes each one atomically as it arrives.
When every prompt is there, the one-process ``collect`` assembles the traces from those files (it
decodes nothing then): the same ``trace.npz`` / ``trace.json``.

A lost worker loses only the prompt it was recording: the command stops naming the prompts kept,
and the same command (with or without ``--ray``) records only the missing ones.

The cluster (a local one bound to 127.0.0.1, or ADDRESS) and the actors: :mod:`draftrl.cluster`.
Install: ``pip install "draftrl[ray]"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from draftrl.cluster import LOCAL, WorkerLost, actors, device_kinds, map_unordered, note_mixed_kinds
from draftrl.config.env import EnvConfig
from draftrl.io import atomic_write_bytes
from draftrl.replay.traces import (
    ARRAYS,
    Traces,
    collect,
    collection_state,
    continuations_per_class,
    open_partial,
    recording_file,
)


def prompt_files(config: EnvConfig, index: int, num_continuations: int | None = None) -> list[str]:
    """The ``.partial`` files of prompt ``index``: one per class and continuation."""
    return [recording_file(index, c, k) for c, count in enumerate(continuations_per_class(config, num_continuations))
            for k in range(count)]


def missing_prompts(config: EnvConfig, partial: Path, count: int, num_continuations: int | None = None) -> list[int]:
    """Indices of the selection's prompts with a recording not yet kept in ``partial``."""
    return [i for i in range(count)
            if not all((partial / name).is_file() for name in prompt_files(config, i, num_continuations))]


class CollectWorker:
    """One Ray actor: the engine of ``config``, loaded once; :meth:`record` one prompt at a time."""

    def __init__(self, config: dict[str, Any], threads: int = 0, num_continuations: int | None = None):
        from draftrl.config import from_dict
        from draftrl.decoding.build import build_engine
        from draftrl.decoding.workload import Workload

        if threads:
            import torch

            torch.set_num_threads(threads)
        self.config = from_dict(EnvConfig, config, prefix="env.")
        self.num_continuations = num_continuations
        self.engine, self.tokenizer = build_engine(self.config)
        self.prompts = Workload(self.config).prompts

    def device_kind(self) -> str:
        from draftrl.signals.costs import hardware_info, hardware_name

        return hardware_name(hardware_info(self.config.device))

    def record(self, index: int) -> tuple[int, dict[str, bytes], int]:
        """(``index``, the kept files of prompt ``index`` by name, this worker's pid)."""
        import io
        import tempfile

        files = {}
        with tempfile.TemporaryDirectory(prefix="draftrl-ray-") as folder:
            collect(self.config, self.engine, self.tokenizer, prompts=[self.prompts[index]], partial_dir=folder,
                    num_continuations=self.num_continuations)
            for alone, name in zip(prompt_files(self.config, 0, self.num_continuations),
                                   prompt_files(self.config, index, self.num_continuations)):
                with np.load(Path(folder) / alone) as data:  # recorded as prompt 0 of a one-prompt selection
                    record = {key: data[key] for key in data.files}
                record["prompt_index"] = np.array(index)
                buffer = io.BytesIO()
                np.savez(buffer, **record)
                files[name] = buffer.getvalue()
        return index, files, os.getpid()


def collect_on_ray(config: EnvConfig, partial: str | Path, *, address: str = LOCAL, workers: int = 2,
                   gpus_per_worker: float = 0.0, threads: int = 0,
                   progress: Callable[[int, int, int, int], None] | None = None,
                   num_continuations: int | None = None) -> Traces:
    """Record ``config``'s missing prompts on ``workers`` Ray actors into ``partial``, then assemble the
    traces exactly as the one-process collection does (module docstring).

    :param gpus_per_worker: each actor's ``num_gpus`` (a tensor-parallel or ``device_map`` target: its
        GPUs); 0 on a CPU cluster.
    :param progress: ``(index, done, total, worker pid)`` after each prompt arrives.
    :raises RuntimeError: a worker was lost; one line naming what is kept and the command that resumes.
    """
    from draftrl.decoding.workload import Workload

    partial = Path(partial)
    prompts = Workload(config).prompts
    open_partial(partial, collection_state(config, [p.id for p in prompts], num_continuations))
    todo = missing_prompts(config, partial, len(prompts), num_continuations)
    if todo:
        _run(config, partial, todo, address, min(workers, len(todo)), gpus_per_worker, threads, progress,
             num_continuations)
    # every recording is kept: the one-process collection assembles them and decodes nothing
    # (collect reads and puts back the engine's token budget, config.max_new_tokens)
    stub = SimpleNamespace(config=SimpleNamespace(temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=None),
                           params=None, drafter=None)
    return collect(config, stub, None, partial_dir=partial, num_continuations=num_continuations)


def _run(config: EnvConfig, partial: Path, todo: list[int], address: str, workers: int, gpus_per_worker: float,
         threads: int, progress, num_continuations: int | None) -> None:
    from dataclasses import asdict

    try:
        with actors(CollectWorker, (asdict(config), threads, num_continuations), address=address, workers=workers,
                    gpus_per_worker=gpus_per_worker) as (ray, pool):
            note_mixed_kinds(device_kinds(ray, pool), "collect",  # the traces hold no timing
                             "the traces are greedy tokens and trees, the same on each")
            records = map_unordered(ray, pool, lambda a, i: a.record.remote(i), todo)
            for count, (index, files, pid) in enumerate(records, 1):
                for name, data in files.items():
                    atomic_write_bytes(partial / name, data)
                if progress is not None:
                    progress(index, count, len(todo), pid)
    except WorkerLost as err:
        kept = len(list(partial.glob("[0-9]*.npz")))  # recordings
        raise RuntimeError(f"a Ray worker was lost ({err.reason}); {kept} finished recording(s) are "
                           f"kept in {partial}: run the same command again to record the rest.") from None


def same_traces(a: Traces, b: Traces) -> bool:
    """Whether two trace sets hold the same prompts, tokens, trees and features, bit for bit (their
    timing and hardware aside)."""
    names = ARRAYS
    return ([p.id for p in a.prompts] == [p.id for p in b.prompts] and a.budgets == b.budgets
            and a.stop_reasons == b.stop_reasons and (a.max_depth, a.width) == (b.max_depth, b.width)
            and all(np.array_equal(getattr(a, n), getattr(b, n)) and getattr(a, n).dtype == getattr(b, n).dtype
                    for n in names))
