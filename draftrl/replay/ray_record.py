"""``draftrl collect --engine vllm --ray [ADDRESS]``: a serving workload's requests dealt out over Ray
workers, each recording its shard in its own vLLM engine, merged into the one ``recordings.json``.

Each worker (a Ray actor, :class:`RecordWorker`) builds the engine one process builds (vLLM without
speculation, :func:`~draftrl.replay.recordings.record_workload`'s default, on the GPUs Ray gives it)
and records its shard (worker ``w`` of ``W``: requests ``w, w+W, ...``) with every sampling class and
continuation, each continuation seeded from its prompt, class and number
(:func:`~draftrl.replay.recordings.continuation_seed`), not from its place in the shard.
:func:`~draftrl.replay.recordings.merge_recordings` puts the requests back in workload order, each
exactly once (else refused), and ``meta`` gains ``ray_workers`` and ``device_kinds``. Recordings
hold tokens, no timing: workers on different device kinds are noted, not refused.

Greedy continuations equal one process's token for token (float32). Sampled ones do too on vLLM's
CPU build: its sampler draws each seeded request's Gumbel noise from that request's own generator,
and its float32 logits did not move with the batch (``tests/replay/test_ray_record.py``: two
workers, and a request recorded alone). A lost worker stops the command; nothing is saved.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from draftrl.cluster import LOCAL, WorkerLost, actors, device_kinds, map_unordered, note_mixed_kinds
from draftrl.config.serve import ServeConfig
from draftrl.decoding.workload import Workload
from draftrl.replay.ray_calibrate import vllm_device_kind
from draftrl.replay.recordings import Recordings, merge_recordings, record_workload


class RecordWorker:
    """One Ray actor: the recording engine of ``config`` (vLLM, no speculation), built once; :meth:`record` a shard."""

    def __init__(self, config: ServeConfig, continuations: int):
        from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

        self.config = config
        self.continuations = continuations
        self.engine = shared_engine(VLLMEngineConfig.serving(config, method="none"))

    def device_kind(self) -> str:
        return vllm_device_kind()

    def record(self, indices: list[int]) -> tuple[list[int], Recordings, int]:
        """(``indices``, their recordings, this worker's pid)."""
        return indices, record_workload(self.config, self.engine, continuations=self.continuations,
                                        indices=indices), os.getpid()


def record_on_ray(config: ServeConfig, *, continuations: int, address: str = LOCAL, workers: int = 2,
                  gpus_per_worker: float = 0.0, progress: Callable[[str], None] | None = None) -> Recordings:
    """:func:`~draftrl.replay.recordings.record_workload`'s recordings, the requests recorded on
    ``workers`` Ray actors (module docstring)."""
    count = len(Workload(config).prompts)
    workers = max(1, min(workers, count))
    t0 = time.perf_counter()
    shards = []
    try:
        with actors(RecordWorker, (config, continuations), address=address, workers=workers,
                    gpus_per_worker=gpus_per_worker) as (ray, pool):
            kinds = device_kinds(ray, pool)
            note_mixed_kinds(kinds, "collect", "recordings hold tokens, no timing")
            for indices, recs, pid in map_unordered(ray, pool, lambda a, shard: a.record.remote(shard),
                                                    [list(range(w, count, workers)) for w in range(workers)]):
                shards.append((indices, recs))
                if progress is not None:
                    progress(f"{len(indices)} requests, {len(recs)} continuations recorded (worker {pid})")
    except WorkerLost as err:
        raise RuntimeError(f"a Ray worker was lost ({err.reason}); nothing was saved (recordings keep no partial "
                           "files): run the same command again.") from None
    merged = merge_recordings(shards, count)
    merged.meta.update(record_seconds=time.perf_counter() - t0, ray_workers=workers, device_kinds=sorted(set(kinds)))
    return merged
