"""The Ray plumbing every ``--ray`` command shares: join a cluster (or start a loopback-only local
one), start one actor per worker, check their device kinds, and map work over them.

A base module (it imports only :mod:`draftrl.deps`), so ``replay`` (``collect``, ``calibrate``) and
``eval`` (``grid``, ``eval``) use one recipe. Every worker class defines ``device_kind() -> str``
(the GPU name, else the CPU model): timings from different kinds are never pooled.

The local cluster (no ADDRESS) binds to 127.0.0.1 only, with no dashboard, no metrics and no usage
reports, and stops with the command. Install: ``pip install "draftrl[ray]"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

#: ``--ray`` without an address: a local cluster on this machine
LOCAL = "local"


class WorkerLost(RuntimeError):
    """A Ray worker died or its task failed; ``reason`` is Ray's error in one line."""

    def __init__(self, reason: str):
        super().__init__(f"a Ray worker was lost ({reason})")
        self.reason = reason


def check_request(workers: int, gpus_per_worker: float, device: str) -> None:
    """Refuse, in one line, a worker count or GPU request that cannot run ``device``'s engine."""
    if workers < 1 or gpus_per_worker < 0:
        raise ValueError(f"--ray-workers {workers} must be >= 1 and --ray-gpus {gpus_per_worker} >= 0.")
    if device.startswith("cuda") and gpus_per_worker == 0:
        raise ValueError(f"env.device={device!r} with --ray-gpus 0: Ray gives a worker GPUs only when asked; "
                         "pass --ray-gpus 1 (or the GPUs one worker's target spans).")


def start(address: str, workers: int):
    """Connect to the cluster at ``address``, or start a local one bound to 127.0.0.1 (no dashboard,
    metrics or usage reports) with a CPU per worker; returns the ``ray`` module."""
    from draftrl.deps import require

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address == LOCAL:
        # Ray 2.60 resolves the node address 127.0.0.1 to the machine's outward address, and its gRPC
        # servers then listen on every interface; with clusters of one machine only (Ray's own switch
        # for laptops) the node is 127.0.0.1 and every server listens there alone. Read at import by
        # Ray, at start by its processes: both are set.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = require("ray")
    if ray.is_initialized():
        return ray
    if address == LOCAL:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=workers,
                 log_to_driver=False, configure_logging=False, _system_config={"enable_metrics_collection": False})
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    return ray


@contextmanager
def actors(worker_class: type, args: tuple, *, address: str = LOCAL, workers: int = 2,
           gpus_per_worker: float = 0.0) -> Iterator[tuple[Any, list]]:
    """``(ray, [actor, ...])``: ``workers`` actors of ``worker_class(*args)``, each with one CPU and
    ``gpus_per_worker`` GPUs (Ray sets its ``CUDA_VISIBLE_DEVICES``). A local cluster this call started
    stops on exit; one already running in this process (a caller's, a test module's) is left running,
    its actors killed."""
    import sys

    running = "ray" in sys.modules and sys.modules["ray"].is_initialized()  # not imported before start() sets it up
    ray = start(address, workers)
    pool: list = []
    try:
        remote = ray.remote(num_cpus=1, num_gpus=gpus_per_worker, max_restarts=0)(worker_class)
        pool = [remote.remote(*args) for _ in range(workers)]
        yield ray, pool
    finally:
        if address == LOCAL and not running:
            ray.shutdown()
        else:
            for actor in pool:
                ray.kill(actor)


def device_kinds(ray, pool: list) -> list[str]:
    """Each actor's ``device_kind()``, in order (waits for every engine to load)."""
    return _get(ray, [a.device_kind.remote() for a in pool])


def refuse_mixed_kinds(kinds: list[str], command: str) -> str:
    """The one device kind of ``kinds``; else a one-line refusal: a timed ratio is paired on one device
    kind, and pooling kinds would average machines, not settings."""
    distinct = sorted(set(kinds))
    if len(distinct) > 1:
        raise ValueError(f"draftrl {command} --ray: workers on {len(distinct)} device kinds ({'; '.join(distinct)}) "
                         "would pool timings of different hardware; start the workers on one GPU model "
                         "(e.g. a Ray custom resource per model) or run one command per kind.")
    return distinct[0]


def note_mixed_kinds(kinds: list[str], command: str, holds: str) -> None:
    """Print a one-line note when ``kinds`` span several device kinds, for a command whose output
    holds no timing (``holds``: what it holds instead, the same on each kind)."""
    distinct = sorted(set(kinds))
    if len(distinct) > 1:
        print(f"[{command}] note: workers on {len(distinct)} device kinds ({', '.join(distinct)}); {holds}", flush=True)


def map_unordered(ray, pool: list, call: Callable[[Any, Any], Any], items: Iterable) -> Iterator:
    """``call(actor, item)`` (an actor method's ``.remote(...)``) over ``items``, results as they
    finish; a dead worker or a failed task raises :class:`WorkerLost`."""
    from ray.exceptions import RayActorError, RayTaskError
    from ray.util import ActorPool

    try:
        yield from ActorPool(pool).map_unordered(call, list(items))
    except (RayActorError, RayTaskError) as err:
        raise _lost(err) from None


def _get(ray, refs: list) -> list:
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(refs)
    except (RayActorError, RayTaskError) as err:
        raise _lost(err) from None


def _lost(err: Exception) -> WorkerLost:
    """Ray's error about a dead worker or a failed task, in one line."""
    return WorkerLost(f"{type(err).__name__}: {' '.join(str(err).split())[:200]}")
