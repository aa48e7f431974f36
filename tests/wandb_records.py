"""Read wandb's offline runs back, for tests: what a user would see after ``wandb sync``.

wandb 0.31's Python package writes ``offline-run-*/run-<id>.wandb`` but ships no reader for it.
The file is a LevelDB-style log (wandb's ``datastore`` format): a 7-byte header (``:W&B``, magic
0xBEE1 little-endian, version 0), then 32 KiB blocks of records, each ``crc32 (4 bytes, over the
type byte then the data), length (2), type (1: full, 2: first, 3: middle, 4: last)`` and the data;
fewer than 7 bytes left in a block are zero padding. Each assembled record is a
``wandb.proto.wandb_internal_pb2.Record``.

:func:`read_run` folds the records into an :class:`OfflineRun`: the run record (id, project,
group, job type, name), the config, the summary after every update, the history rows, the exit
code, and the run's ``files/`` folder, where logged tables (``*.table.json``) and images live.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<4sHB")  # ident, magic, version
RECORD_HEADER = struct.Struct("<IHB")  # crc32, length, type
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path) -> Iterator[bytes]:
    """The records of a ``.wandb`` file, fragments joined, checksums checked.

    :raises ValueError: on a wrong header, a checksum mismatch or a fragment out of order.
    """
    data = Path(path).read_bytes()
    if len(data) < HEADER.size or HEADER.unpack_from(data) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path} does not start with wandb's header (':W&B', 0xBEE1, 0)")
    pos, pending = HEADER.size, None
    while pos + RECORD_HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER.size:  # the block's tail is padding
            pos += left
            continue
        crc, length, kind = RECORD_HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding written before the next block
            pos += left
            continue
        chunk = data[pos + RECORD_HEADER.size: pos + RECORD_HEADER.size + length]
        if len(chunk) < length:
            break  # a record the writer had not finished (a live run)
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: checksum mismatch in the record at byte {pos}")
        pos += RECORD_HEADER.size + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind in (MIDDLE, LAST) and pending is not None:
            pending += chunk
            if kind == LAST:
                yield pending
                pending = None
        else:
            raise ValueError(f"{path}: record type {kind} at byte {pos} out of order")


def _put(target: dict, item: Any) -> None:
    keys = [item.key] if item.key else list(item.nested_key)
    node = target
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = json.loads(item.value_json)


@dataclass
class OfflineRun:
    """One offline run as its ``.wandb`` file records it."""

    folder: Path
    id: str = ""
    project: str = ""
    group: str = ""
    job_type: str = ""
    name: str = ""
    start_time: float = 0.0
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    exit_code: int | None = None

    def table(self, key: str) -> tuple[list[str], list[list[Any]]]:
        """``(columns, rows)`` of the ``wandb.Table`` logged under ``key`` (its file in ``files/``)."""
        entry = self.summary.get(key)
        if not isinstance(entry, dict) or entry.get("_type") != "table-file":
            raise KeyError(f"no table logged under {key!r} in run {self.name}")
        data = json.loads((self.folder / "files" / entry["path"]).read_text())
        return data["columns"], data["data"]

    def image(self, key: str) -> Path:
        """The file of the ``wandb.Image`` logged under ``key``."""
        entry = self.summary.get(key)
        if not isinstance(entry, dict) or entry.get("_type") != "image-file":
            raise KeyError(f"no image logged under {key!r} in run {self.name}")
        return self.folder / "files" / entry["path"]

    def chart(self, key: str) -> dict:
        """The custom chart (``wandb.plot.*``) logged under ``key``: its panel config."""
        charts = self.config.get("_wandb", {}).get("visualize", {})
        if key not in charts:
            raise KeyError(f"no chart logged under {key!r} in run {self.name}")
        return charts[key]


def read_run(folder: str | Path, wait: float = 30.0) -> OfflineRun:
    """The :class:`OfflineRun` in an ``offline-run-*`` folder.

    ``run.finish()`` returns before wandb's service process has written the records out: the file
    is read again until its exit record is there, for up to ``wait`` seconds.
    """
    import time

    deadline = time.monotonic() + wait
    while True:
        run = _read_once(Path(folder))
        if run.exit_code is not None or time.monotonic() > deadline:
            return run
        time.sleep(0.1)


def _read_once(folder: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2

    (path,) = folder.glob("run-*.wandb")
    run = OfflineRun(folder)
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.id, run.project, run.group, run.job_type, run.name = (r.run_id, r.project, r.run_group, r.job_type,
                                                                      r.display_name)
            run.start_time = r.start_time.seconds + r.start_time.nanos * 1e-9
            for item in r.config.update:
                _put(run.config, item)
        elif kind == "config":
            for item in record.config.update:
                _put(run.config, item)
        elif kind == "summary":
            for item in record.summary.update:
                _put(run.summary, item)
        elif kind == "history":
            row: dict = {}
            for item in record.history.item:
                _put(row, item)
            run.history.append(row)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def read_runs(wandb_dir: str | Path) -> list[OfflineRun]:
    """Every offline run in a ``wandb/`` folder, in the order they started."""
    return sorted((read_run(f) for f in Path(wandb_dir).glob("offline-run-*")), key=lambda r: r.start_time)
