"""``draftrl grid --ray`` and ``draftrl eval --ray``: one grid's or evaluation's requests shared out
over Ray workers, merged into the files one process writes.

Each worker (a Ray actor, :class:`RoundWorker`) loads the target once and plays its shard exactly as
one process plays every request: :func:`~draftrl.eval.round.grid.measure_cells` over the shard's
request indices, :func:`~draftrl.eval.round.compare.play_class` over its prompt ids. Every cell or
policy runs interleaved per request on the worker's own device, so each ratio stays paired on one
device; the seeds and the order of the settings follow each request's index in the whole split.
Worker ``w`` of ``W`` takes requests ``w, w + W, ...`` (every language and task on every worker).

This process merges the shards: the runs in the one-process order, each (setting, repeat, request)
exactly once (:func:`merge_runs` refuses a missing or repeated one), and the exactness verdicts each
worker reached on its own requests (:func:`~draftrl.eval.agreement.merge_verdicts`,
:func:`~draftrl.eval.exactness.merge_monitor_verdicts`); the summaries, report, plots and wandb run
are then made as one process makes them. Workers on different device kinds are refused
(:func:`draftrl.cluster.refuse_mixed_kinds`): their timings are never pooled.

Greedy and keyed outputs (tokens, rounds, verdicts) are the one-process run's; so are the grid's
sampled cells (seeded per request). At temperature > 0 without keyed sampling an eval policy's env
draws each request's sampling seed from its own stream, request after request, so a sharded eval
samples other (equally exact) streams than one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from draftrl.cluster import LOCAL, actors, device_kinds, map_unordered, refuse_mixed_kinds
from draftrl.eval.agreement import merge_verdicts
from draftrl.eval.exactness import merge_monitor_verdicts
from draftrl.eval.round.cells import Cell
from draftrl.eval.round.compare import Played, play_class
from draftrl.eval.round.config import EvalConfig, env_for_split
from draftrl.eval.round.grid import measure_cells


class RoundWorker:
    """One Ray actor: the target of ``config``, loaded once; :meth:`measure` and :meth:`play` a shard."""

    def __init__(self, config: EvalConfig):
        import torch

        from draftrl.decoding.build import load_target

        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.target = load_target(config.env)

    def device_kind(self) -> str:
        from draftrl.signals.costs import hardware_name

        return hardware_name(self.hardware())

    def hardware(self) -> dict:
        from draftrl.signals.costs import hardware_info

        return hardware_info(self.config.env.device)

    def kernels(self) -> dict | None:
        return self.target.kernels.to_dict() if self.target.kernels is not None else None

    def measure(self, config: EvalConfig, cells: list[Cell], indices: list[int]) -> tuple[list, list, Any, int]:
        """(runs, anchor runs, exactness or the exactness error that stopped the shard, pid)."""
        from draftrl.decoding.monitor import ExactnessViolation
        from draftrl.eval.exactness import GreedyMismatch

        anchor_runs: list = []
        try:
            runs, exactness = measure_cells(config, cells, target=self.target, anchor_runs=anchor_runs,
                                            indices=indices)
        except (ExactnessViolation, GreedyMismatch) as err:
            return [], anchor_runs, err, os.getpid()
        return runs, anchor_runs, exactness, os.getpid()

    def play(self, config: EvalConfig, specs: list, grid: dict | None, seed_offset: int,
             prompt_ids: list[str]) -> tuple[Played, int]:
        return play_class(config, specs, grid, target=self.target, seed_offset=seed_offset,
                          prompt_ids=prompt_ids), os.getpid()


def merge_runs(shards: list[list], order: list[str]) -> list:
    """The shards' runs (``RequestRun`` or ``AnchorRun``) in the one-process order (repeat, then request
    in ``order``, a request's settings as its worker played them), each (setting, repeat, request)
    exactly once and every request of ``order`` present; else a one-line ``RuntimeError``."""
    position = {p: i for i, p in enumerate(order)}
    runs = sorted((r for shard in shards for r in shard), key=lambda r: (r.repeat, position[r.prompt_id]))
    seen: dict[tuple, int] = {}
    for r in runs:
        key = (r.policy, r.repeat, r.prompt_id)
        seen[key] = seen.get(key, 0) + 1
    repeated = sorted(k for k, n in seen.items() if n > 1)
    missing = sorted(set(order) - {k[2] for k in seen})
    if runs and (repeated or missing):
        raise RuntimeError(f"the Ray shards do not hold every request exactly once (repeated {repeated[:3]}, missing "
                           f"{missing[:3]}); a shard was lost or sent twice: run the command again.")
    return runs


class RayShards:
    """The workers of one ``--ray`` grid or evaluation (a context manager: the cluster lives inside it).

    :param address: ``local`` (a loopback-only cluster on this machine) or a running cluster's address.
    :param gpus_per_worker: each worker's ``num_gpus`` (a target split over GPUs: all of them).
    """

    def __init__(self, config: EvalConfig, command: str, *, address: str = LOCAL, workers: int = 2,
                 gpus_per_worker: float = 0.0):
        self.config, self.command = config, command
        self._actors = actors(RoundWorker, (config,), address=address, workers=workers,
                              gpus_per_worker=gpus_per_worker)
        self.hardware: dict = {}
        self.kernels: dict | None = None

    def __enter__(self) -> RayShards:
        self.ray, self.pool = self._actors.__enter__()
        try:
            kind = refuse_mixed_kinds(device_kinds(self.ray, self.pool), self.command)
            self.hardware = {**self.ray.get(self.pool[0].hardware.remote()), "ray_workers": len(self.pool),
                             "device_kind": kind}
            self.kernels = self.ray.get(self.pool[0].kernels.remote())
        except BaseException:
            self._actors.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._actors.__exit__(*exc)

    def _shards(self, count: int) -> list[list[int]]:
        workers = min(len(self.pool), count)
        return [list(range(w, count, workers)) for w in range(workers)]

    def _map(self, call: Callable, shards: list, progress: Callable | None) -> list:
        """``call(actor, shard)`` over ``shards``; progress counts finished shards."""
        results = []
        for result in map_unordered(self.ray, self.pool[:len(shards)], call, shards):
            results.append(result)
            if progress is not None:
                progress(len(results), len(shards), f"shard of worker {result[-1]}")
        return results

    def measure(self, config: EvalConfig, cells: list[Cell], *, progress: Callable | None = None,
                anchor_runs: list | None = None) -> tuple[list, dict]:
        """:func:`~draftrl.eval.round.grid.measure_cells` over the tune split, sharded and merged."""
        from draftrl.decoding.workload import Workload

        prompts = [p.id for p in Workload(env_for_split(config.env, "tune", config.grid.limit_per_group)).prompts]
        parts = self._map(lambda a, shard: a.measure.remote(config, cells, shard), self._shards(len(prompts)),
                          progress)
        errors = [p[2] for p in parts if isinstance(p[2], Exception)]
        if errors:
            raise errors[0]
        if anchor_runs is not None:
            anchor_runs.extend(merge_runs([p[1] for p in parts], prompts))
        verdicts = [p[2] for p in parts]
        identity = merge_verdicts([v["greedy_identity"] for v in verdicts])
        exactness = {"passed": identity.get("passed", True), "temperature": verdicts[0]["temperature"],
                     "greedy_identity": identity,
                     "monitor": {name: merge_monitor_verdicts([v["monitor"][name] for v in verdicts])
                                 for name in verdicts[0]["monitor"]}}
        return merge_runs([p[0] for p in parts], prompts), exactness

    def play(self, config: EvalConfig, specs: list, grid: dict | None, *, seed_offset: int = 0,
             progress: Callable | None = None) -> Played:
        """:func:`~draftrl.eval.round.compare.play_class` over the held-out split, sharded and merged."""
        from draftrl.decoding.workload import Workload

        prompts = [p.id for p in Workload(env_for_split(config.env, "heldout", config.eval.limit_per_group)).prompts]
        shards = [[prompts[i] for i in s] for s in self._shards(len(prompts))]
        parts: list[Played] = [p[0] for p in self._map(
            lambda a, shard: a.play.remote(config, specs, grid, seed_offset, shard), shards, progress)]
        position = {p: i for i, p in enumerate(prompts)}
        failed = [p for p in parts if p.failure is not None]
        hf = [p.hf for p in parts if p.hf.get("checked")]
        return Played(
            # a stopped shard lacks requests: keep what was played (the one-process run keeps its partial runs)
            runs=(merge_runs([p.runs for p in parts], prompts) if not failed
                  else [r for p in parts for r in p.runs]),
            anchor_runs=(merge_runs([p.anchor_runs for p in parts], prompts) if not failed
                         else [r for p in parts for r in p.anchor_runs]),
            references=dict(sorted(((k, v) for p in parts for k, v in p.references.items()),
                                   key=lambda kv: position[kv[0]])),
            trajectories={k: v for p in parts for k, v in p.trajectories.items()},
            traj_prompt=parts[0].traj_prompt,
            monitor={label: merge_monitor_verdicts([p.monitor[label] for p in parts]) for label in parts[0].monitor},
            identity=merge_verdicts([p.identity for p in parts]),
            bitwise=parts[0].bitwise,
            hf={**merge_verdicts(hf), "checked": sum(h["checked"] for h in hf)} if hf else parts[0].hf,
            failure=failed[0].failure if failed else None,
            error=failed[0].error if failed else None,
            kernels=parts[0].kernels,
            power=next((p.power for p in parts if p.power is not None), None),
            anchor_seeds=parts[0].anchor_seeds,
        )
