"""``draftrl calibrate --engine vllm --ray [ADDRESS]``: the serving calibration's cells shared out over
Ray workers, each with its own vLLM engine, merged into the one ``vllm_costs.json``.

Each worker (a Ray actor, :class:`CalibrateWorker`) builds the engine one process builds
(:func:`~draftrl.replay.serve_calibrate.calibration_engine`, on the GPUs Ray gives it) and times
its shard of the (B, d) and (B, P) pairs (:func:`~draftrl.replay.serve_calibrate.calibrate` with
``shard``: a decode cell and its head cell side by side on one engine), in shuffled passes as one
process does. :func:`~draftrl.replay.serve_calibrate.merge_calibrations` joins the points (each
cell once) and fits the cost model over all of them, so the workers must run on one device kind:
others are refused (:func:`draftrl.cluster.refuse_mixed_kinds`). Workers sharing one machine's CPU
(a local CPU cluster) slow each other's steps: the cluster is meant for one GPU per worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from draftrl.cluster import LOCAL, actors, device_kinds, map_unordered, refuse_mixed_kinds
from draftrl.replay.serve_calibrate import CalibrationSizes, calibrate, calibration_engine, merge_calibrations


def vllm_device_kind() -> str:
    """The device kind a vLLM engine in this process runs on: the GPU's name, else the CPU model."""
    import torch

    from draftrl.signals.costs import hardware_info, hardware_name

    return hardware_name(hardware_info("cuda" if torch.cuda.is_available() else "cpu"))


class CalibrateWorker:
    """One Ray actor: the calibration engine of ``model``, built once; :meth:`measure` a shard."""

    def __init__(self, model: str, sizes: CalibrationSizes, engine: dict[str, Any]):
        self.sizes = sizes
        self.engine = calibration_engine(model, sizes, **engine)

    def device_kind(self) -> str:
        return vllm_device_kind()

    def measure(self, shard: tuple[int, int], seed: int) -> tuple[dict[str, Any], int]:
        return calibrate(self.engine, **asdict(self.sizes), seed=seed, shard=shard), os.getpid()


def calibrate_on_ray(model: str, sizes: CalibrationSizes, *, address: str = LOCAL, workers: int = 2,
                     gpus_per_worker: float = 0.0, seed: int = 0, progress: Callable[[str], None] | None = None,
                     **engine: Any) -> dict[str, Any]:
    """The calibration of :func:`~draftrl.replay.serve_calibrate.calibrate_model`, its cells measured on
    ``workers`` Ray actors (module docstring); ``engine``: :func:`calibration_engine`'s keywords."""
    with actors(CalibrateWorker, (model, sizes, engine), address=address, workers=workers,
                gpus_per_worker=gpus_per_worker) as (ray, pool):
        refuse_mixed_kinds(device_kinds(ray, pool), "calibrate")
        parts = []
        for part, pid in map_unordered(ray, pool, lambda a, shard: a.measure.remote(shard, seed),
                                       [(w, len(pool)) for w in range(len(pool))]):
            parts.append(part)
            if progress is not None:
                progress(f"{len(part['points'])} cells measured (worker {pid})")
    return merge_calibrations(parts)
