"""Greedy decoding traces for ``draftrl/TraceReplay-v1``, and how ``draftrl collect`` records them.

For each prompt a trace holds the target's greedy continuation and, from every true prefix
(prompt + continuation[:t]), the drafter's tree grown to ``max_depth`` levels of ``width`` nodes
(tokens, parents, depths, scores) plus the drafter's pre-round signals. Both drafter kinds grow
trees one level at a time and never look ahead, so the tree a depth-d round drafts is exactly
the first d levels of the stored tree; at temperature 0 the target accepts a node iff its
token is the continuation's next token (the target's argmax), so the tokens of any
(depth, verify_size) round follow from walking the selected subtree along the continuation.

Files in the trace directory: ``trace.npz`` (the arrays below) and ``trace.json`` (format,
config, hardware, prompts, per-prompt budget and stop reason), and ``cost_table.json`` when the
collection was given one. Per-position arrays are flattened over all prompts;
``cu_num_positions[p]`` is prompt p's first position and ``cu_num_nodes[i]`` position i's first
node (vLLM's ``cu_num_*`` convention).

The files are one unit: ``Traces.save`` writes them into a temporary sibling directory and renames
it over the trace directory, so a reader never sees the ``trace.json`` of one collection beside
the ``trace.npz`` (or the ``cost_table.json``) of another, and an interrupted save leaves the
earlier traces whole. A random ``trace_id`` is stored in all three files and ``Traces.load`` /
``stored_cost_table`` check it. ``collect`` keeps every finished prompt in ``DIR/.partial/``
(one small npz each, written atomically) so an interrupted ``draftrl collect`` resumes where it
stopped.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from draftrl.config.env import EnvConfig
from draftrl.io import atomic_write_bytes, plain, write_json
from draftrl.prompts import Prompt
from draftrl.runs import ARRAYS_FILE, COST_TABLE_FILE, HEADER_FILE, TRACE_FILES, stored_cost_table_path
from draftrl.signals.features import DRAFT_FEATURES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from draftrl.signals.costs import CostTable

FORMAT = "draftrl-trace/1"
_ARRAYS = (
    "prompt_tokens", "cu_num_prompt_tokens", "continuation", "cu_num_positions",
    "draft_features", "cu_num_nodes", "node_tokens", "node_parents", "node_depths", "node_scores",
)


@dataclass
class Traces:
    """Recorded greedy traces (see the module docstring); arrays are numpy."""

    prompts: list[Prompt]
    budgets: list[int]
    """max_new_tokens of each prompt's recorded request"""
    stop_reasons: list[str]
    prompt_tokens: np.ndarray
    """int64 [sum of prompt lengths]"""
    cu_num_prompt_tokens: np.ndarray
    """int64 [P + 1]"""
    continuation: np.ndarray
    """int64 [T]: greedy continuation tokens, prompt after prompt (T = number of positions)"""
    cu_num_positions: np.ndarray
    """int64 [P + 1]"""
    draft_features: np.ndarray
    """float64 [T, len(DRAFT_FEATURES)]: drafter.features() before the round at each position"""
    cu_num_nodes: np.ndarray
    """int64 [T + 1]"""
    node_tokens: np.ndarray
    """int64 [M]"""
    node_parents: np.ndarray
    """int64 [M]: parent node index within the position's tree (-1 = root)"""
    node_depths: np.ndarray
    """int64 [M]"""
    node_scores: np.ndarray
    """float64 [M]"""
    max_depth: int
    width: int
    meta: dict
    """format, config, hardware, drafter, target, seconds spent collecting"""

    def __len__(self) -> int:
        return len(self.prompts)

    def save(self, directory: str | Path, cost_table: CostTable | None = None) -> Path:
        """Write ``trace.npz``, ``trace.json`` (and ``cost_table.json``) as one unit; returns ``directory``.

        The files go to a temporary sibling directory that is then renamed to ``directory``; an
        earlier trace directory there is replaced whole (its stale cost table and any
        ``.partial`` collection included). A directory holding anything but trace files is
        refused, so a mistyped ``--out`` never deletes unrelated work.
        """
        directory = Path(directory)
        _refuse_foreign(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        trace_id = secrets.token_hex(8)
        staged = Path(tempfile.mkdtemp(prefix=f".{directory.name}.saving-", dir=directory.parent))
        try:
            np.savez_compressed(staged / ARRAYS_FILE, trace_id=np.array(trace_id),
                                **{name: getattr(self, name) for name in _ARRAYS})
            if cost_table is not None:
                write_json(staged / COST_TABLE_FILE, {**cost_table.to_dict(), "trace_id": trace_id})
            header = {
                **{k: v for k, v in self.meta.items() if k != "trace_id"},
                "format": FORMAT,
                "trace_id": trace_id,
                "max_depth": self.max_depth,
                "width": self.width,
                "draft_feature_names": list(DRAFT_FEATURES),
                "prompts": [asdict(p) for p in self.prompts],
                "budgets": self.budgets,
                "stop_reasons": self.stop_reasons,
            }
            write_json(staged / HEADER_FILE, header)
            _replace_dir(staged, directory)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        self.meta["trace_id"] = trace_id
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> Traces:
        """Read a trace directory, checking that ``trace.json`` and ``trace.npz`` belong together.

        :raises FileNotFoundError: no ``trace.json`` / ``trace.npz`` (names ``draftrl collect``).
        :raises ValueError: another format, other draft features, files of two collections, or
            arrays whose lengths contradict the header (each naming the fix).
        """
        directory = Path(directory)
        header_path = directory / HEADER_FILE
        arrays_path = directory / ARRAYS_FILE
        fix = f"record them again with draftrl collect --config CONFIG.yaml --out {directory} --overwrite"
        if not header_path.is_file():
            raise FileNotFoundError(
                f"{header_path} does not exist; record traces with draftrl collect --config CONFIG.yaml "
                f"--out {directory}"
            )
        if not arrays_path.is_file():
            raise FileNotFoundError(f"{arrays_path} does not exist beside {header_path.name}; {fix}.")
        try:
            header = json.loads(header_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{header_path} is not valid JSON ({err}); {fix}.") from None
        if header.get("format") != FORMAT:
            raise ValueError(f"{header_path} has format {header.get('format')!r}, expected {FORMAT!r}; "
                             "re-run draftrl collect.")
        if header.get("draft_feature_names") != list(DRAFT_FEATURES):
            raise ValueError(f"{header_path} stores draft features {header.get('draft_feature_names')}, this draftrl "
                             f"expects {list(DRAFT_FEATURES)}; re-run draftrl collect.")
        try:
            with np.load(arrays_path) as data:
                arrays = {name: data[name] for name in _ARRAYS}
                stored_id = str(data["trace_id"]) if "trace_id" in data.files else None
        except (OSError, ValueError, KeyError, EOFError) as err:
            raise ValueError(f"{arrays_path} is unreadable or incomplete ({type(err).__name__}: {err}); "
                             f"{fix}.") from None
        header_id = header.get("trace_id")
        if stored_id != header_id:
            raise ValueError(
                f"{arrays_path} (trace_id {stored_id}) and {header_path} (trace_id {header_id}) come from different "
                f"collections; {fix}."
            )
        try:
            _check_lengths(header, arrays)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{header_path} lacks or mangles {err}; {fix}.") from None
        except ValueError as err:
            raise ValueError(f"{directory}: {err}; {fix}.") from None
        meta = {k: v for k, v in header.items()
                if k not in ("max_depth", "width", "prompts", "budgets", "stop_reasons", "draft_feature_names")}
        return cls(
            prompts=[Prompt(**p) for p in header["prompts"]],
            budgets=[int(b) for b in header["budgets"]],
            stop_reasons=list(header["stop_reasons"]),
            max_depth=int(header["max_depth"]),
            width=int(header["width"]),
            meta=meta,
            **arrays,
        )

    @property
    def config(self) -> EnvConfig:
        """The EnvConfig the traces were recorded with."""
        from draftrl.config import from_dict

        return from_dict(EnvConfig, self.meta["config"])



def _check_lengths(header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Raise ValueError when the arrays cannot describe the header's prompts (no IndexError later)."""
    num_prompts = len(header["prompts"])
    if len(header["budgets"]) != num_prompts or len(header["stop_reasons"]) != num_prompts:
        raise ValueError(f"the header lists {num_prompts} prompts but {len(header['budgets'])} budgets")
    for name, total in (("cu_num_prompt_tokens", "prompt_tokens"), ("cu_num_positions", "continuation"),
                        ("cu_num_nodes", "node_tokens")):
        cu = arrays[name]
        if cu.ndim != 1 or cu.size == 0 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != len(arrays[total]):
            raise ValueError(f"{name} does not index {total} ({len(arrays[total])} entries)")
    if len(arrays["cu_num_prompt_tokens"]) != num_prompts + 1 or len(arrays["cu_num_positions"]) != num_prompts + 1:
        raise ValueError(f"the arrays hold {len(arrays['cu_num_positions']) - 1} prompts, the header {num_prompts}")
    num_positions = len(arrays["continuation"])
    if len(arrays["cu_num_nodes"]) != num_positions + 1 or len(arrays["draft_features"]) != num_positions:
        raise ValueError(f"per-position arrays disagree with the {num_positions} recorded positions")
    num_nodes = len(arrays["node_tokens"])
    if any(len(arrays[n]) != num_nodes for n in ("node_parents", "node_depths", "node_scores")):
        raise ValueError(f"per-node arrays disagree with the {num_nodes} recorded nodes")


def _refuse_foreign(directory: Path) -> None:
    """Refuse to replace a directory that holds anything besides trace files."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise ValueError(f"{directory} is a file, not a trace directory; choose another --out.")
    foreign = sorted(p.name for p in directory.iterdir() if p.name not in TRACE_FILES)
    if foreign:
        raise ValueError(
            f"{directory} holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}, not traces; "
            "choose an empty or new --out for traces."
        )


def _replace_dir(staged: Path, directory: Path) -> None:
    """Rename ``staged`` to ``directory``, moving an earlier ``directory`` aside and deleting it after."""
    old = None
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=directory.parent))
        os.rename(directory, old / directory.name)
    try:
        os.rename(staged, directory)
    except BaseException:
        if old is not None:  # put the earlier traces back
            os.rename(old / directory.name, directory)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def stored_cost_table(directory: str | Path) -> CostTable | None:
    """The cost table stored with the traces in ``directory`` (checked), or None."""
    from draftrl.signals.costs import CostTable

    path = stored_cost_table_path(directory)
    return CostTable.load(path) if path is not None else None


def collect(config: EnvConfig, engine, tokenizer, *, max_depth: int | None = None, width: int | None = None,
            prompts: list[Prompt] | None = None, generate_depth: int = 4, progress=None,
            partial_dir: str | Path | None = None) -> Traces:
    """Record greedy traces of ``config``'s prompts on ``engine`` (a ``SpeculativeDecoder``).

    :param max_depth: levels of every stored tree; default ``max(config.depths)``.
    :param width: tree width; default ``config.width``.
    :param prompts: override the config's prompt selection.
    :param generate_depth: chain depth used to produce the greedy continuation (greedy output
        does not depend on it; it only makes collection faster).
    :param progress: callable ``(index, prompt, seconds)`` after each prompt, or None.
    :param partial_dir: keep each finished prompt here (``NNNNN.npz``, written atomically) and
        skip the prompts already there: an interrupted collection resumes. The directory records
        what is collected (``collection.json``); one made for another config is refused.
    """
    from draftrl.config import to_dict
    from draftrl.decoding.workload import Workload
    from draftrl.models.distribution import SamplingParams
    from draftrl.signals.costs import hardware_info

    if config.temperature != 0 or engine.config.temperature != 0:
        raise ValueError(
            f"traces need greedy decoding (temperature=0), got EnvConfig.temperature={config.temperature}; "
            "replayed acceptance is exact only at temperature 0."
        )
    max_depth = config.max_depth if max_depth is None else max_depth
    width = config.width if width is None else width
    workload = Workload(config, tokenizer, prompts)
    drafter = engine.drafter
    greedy = SamplingParams()
    config_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in to_dict(config).items()}
    partial = None
    if partial_dir is not None:
        partial = Path(partial_dir)
        open_partial(partial, {"config": config_dict, "max_depth": max_depth, "width": width,
                               "generate_depth": generate_depth, "prompts": [p.id for p in workload.prompts]})

    records = []
    for index in range(len(workload)):
        saved = partial / f"{index:05d}.npz" if partial is not None else None
        if saved is not None and saved.is_file():
            with np.load(saved) as data:
                records.append({k: data[k] for k in data.files})
            continue
        t0 = time.perf_counter()
        request = workload.request(index)
        ids = list(request.prompt_ids)
        engine.config.max_new_tokens = request.max_new_tokens
        engine.start(ids)
        depth = generate_depth if drafter is not None else 0
        stop = None
        while not engine.finished:
            stop = engine.round(depth).stop_reason
        cont = list(engine.output_ids)
        if drafter is not None and drafter.reads_target_rows:
            engine.start(ids + cont)  # one forward over the sequence: the drafter keeps every row's hidden states
        elif drafter is not None:
            drafter.reset(ids)
        feats, cu_nodes = [], [0]
        node_tokens, node_parents, node_depths, node_scores = [], [], [], []
        for t in range(len(cont)):
            prefix = ids + cont[:t]
            levels = min(max_depth, request.max_new_tokens - t - 1)
            row = np.zeros(len(DRAFT_FEATURES))
            # the first round feeds the prompt with its drafts (start(prefill=False)): a drafter that
            # reads the target's rows has none yet, so live it drafts nothing and sees no signal there
            if drafter is not None and (t > 0 or not drafter.reads_target_rows):
                signals = drafter.features(prefix)
                row = np.array([signals.get(name, 0.0) for name in DRAFT_FEATURES], dtype=np.float64)
                tree = drafter.propose(prefix, levels, width, greedy, None)
                node_tokens += tree.tokens
                node_parents += tree.parents
                node_depths += tree.depths
                node_scores += tree.scores
            if drafter is not None:
                drafter.commit(prefix + [cont[t]], [])
            feats.append(row)
            cu_nodes.append(len(node_tokens))
        record = {
            "prompt_tokens": np.asarray(ids, dtype=np.int64),
            "continuation": np.asarray(cont, dtype=np.int64),
            "draft_features": np.asarray(feats, dtype=np.float64).reshape(-1, len(DRAFT_FEATURES)),
            "num_nodes": np.diff(np.asarray(cu_nodes, dtype=np.int64)),
            "node_tokens": np.asarray(node_tokens, dtype=np.int64),
            "node_parents": np.asarray(node_parents, dtype=np.int64),
            "node_depths": np.asarray(node_depths, dtype=np.int64),
            "node_scores": np.asarray(node_scores, dtype=np.float64),
            "budget": np.array(request.max_new_tokens, dtype=np.int64),
            "stop_reason": np.array(stop or "length"),
            "seconds": np.array(time.perf_counter() - t0),
        }
        if saved is not None:
            buffer = io.BytesIO()
            np.savez(buffer, **record)
            atomic_write_bytes(saved, buffer.getvalue())
        records.append(record)
        if progress is not None:
            progress(index, request.prompt, float(record["seconds"]))

    def joined(name: str, dtype) -> np.ndarray:
        return np.concatenate([r[name] for r in records]).astype(dtype) if records else np.zeros(0, dtype=dtype)

    def cumulative(lengths) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    meta = {
        "config": config_dict,
        "target": config.target,
        "drafter": config.drafter,
        "hardware": hardware_info(config.device),
        "collect_seconds": float(sum(float(r["seconds"]) for r in records)),
        "generate_depth": generate_depth,
    }
    return Traces(
        prompts=list(workload.prompts),
        budgets=[int(r["budget"]) for r in records],
        stop_reasons=[str(r["stop_reason"]) for r in records],
        prompt_tokens=joined("prompt_tokens", np.int64),
        cu_num_prompt_tokens=cumulative([len(r["prompt_tokens"]) for r in records]),
        continuation=joined("continuation", np.int64),
        cu_num_positions=cumulative([len(r["continuation"]) for r in records]),
        draft_features=(np.concatenate([r["draft_features"] for r in records]) if records
                        else np.zeros((0, len(DRAFT_FEATURES)))).astype(np.float64),
        cu_num_nodes=cumulative(np.concatenate([r["num_nodes"] for r in records]) if records else []),
        node_tokens=joined("node_tokens", np.int64),
        node_parents=joined("node_parents", np.int64),
        node_depths=joined("node_depths", np.int64),
        node_scores=joined("node_scores", np.float64),
        max_depth=max_depth,
        width=width,
        meta=meta,
    )


def open_partial(partial: Path, what: dict) -> int:
    """Create (or reopen) a partial collection directory for ``what``; returns the prompts already kept.

    :raises ValueError: the directory was started for another config (names the fix).
    """
    state = partial / "collection.json"
    if state.is_file():
        try:
            earlier = json.loads(state.read_text())
        except json.JSONDecodeError:
            earlier = None
        if earlier != json.loads(json.dumps(plain(what))):
            raise ValueError(
                f"{partial} holds an interrupted collection of another config; run the same command as before to "
                f"resume it, or pass --overwrite to discard it."
            )
    else:
        partial.mkdir(parents=True, exist_ok=True)
        write_json(state, what)
    return len(list(partial.glob("[0-9]*.npz")))


def load_choice_traces(traces: Mapping[str, str | Path | Traces]) -> tuple[dict[str, Traces], dict[str, CostTable]]:
    """Each drafter's traces and the cost table stored with them."""
    loaded, costs = {}, {}
    for name, source in traces.items():
        loaded[name] = source if isinstance(source, Traces) else Traces.load(source)
        table = None if isinstance(source, Traces) else stored_cost_table(source)
        if table is None:
            raise ValueError(f"the {name!r} traces have no stored cost table; collect them with --cost-table FILE "
                             "or pass cost_tables={name: table}.")
        costs[name] = table
    return loaded, costs
