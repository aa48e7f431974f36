"""Decoding traces for ``draftrl/TraceReplay-v1``, at any temperature, and how ``draftrl collect`` records them.

For each prompt and each sampling class of the config (``EnvConfig.sampling_classes``: the temperature,
top-k and top-p of a request), a trace holds K *recordings*: continuations the live engine decoded with
that sampling, each seeded from (config seed, prompt id, class, k) (:func:`recording_seed`), and, from
every true prefix (prompt + continuation[:t]), the drafter's tree grown to ``max_depth`` levels of
``width`` nodes in deterministic mode (tokens, parents, depths, scores) plus the drafter's pre-round
signals. Both drafter kinds grow trees one level at a time and never look ahead, so the tree a depth-d
round drafts is exactly the first d levels of the stored tree. A deterministic tree has distinct
siblings and a one-hot q, and exact verification then emits what "draw y ~ p, follow the child equal to
y, else emit y" emits; so a round's tokens follow from walking the selected subtree along the stored
continuation, exactly at temperature 0 and exactly in law at temperature > 0 (``docs/design.md``,
"Sampled traces replay exactly in law"). Greedy decoding is deterministic, so a greedy class stores one
recording (K > 1 would repeat it); a sampled class stores K (default :data:`DEFAULT_CONTINUATIONS`): a
replayed request walks one of them, and more recordings are more of the target's law to learn from.
Sampled drafts (``EnvConfig.draft_sampling``: children drawn from q) are exact but not replayable this
way: ``collect`` refuses them at temperature > 0.

Per position the trace also stores what the target said at the row that predicted that token, from one
teacher-forced forward over prompt + continuation: ``p_token``, ``mass_before`` and ``p_entropy`` under
the request's distribution (what ``TokenStats`` reports), ``target_top1_prob`` and ``target_entropy`` of
the raw softmax (temperature 1, no top-k/top-p; ``RoundResult.target_features``), and per node
``node_p``: p of the node's token at the row of the true prefix it extends (the exact acceptance
probability of a node whose ancestors follow the continuation).

Files in the trace directory: ``trace.npz`` (the arrays below) and ``trace.json`` (format, config,
sampling classes, continuations per class, hardware, prompts, per-prompt budget, per-recording stop
reason), and ``cost_table.json`` when the collection was given one. Per-position arrays are flattened
over all recordings (prompt-major, then class, then k); ``cu_num_positions[r]`` is recording r's first
position and ``cu_num_nodes[i]`` position i's first node (vLLM's ``cu_num_*`` convention). Format
``draftrl-trace/2``; a ``draftrl-trace/1`` directory (greedy, one recording per prompt, no target
signals) loads as the K = 1, temperature-0 case.

The files are one unit: ``Traces.save`` writes them into a temporary sibling directory and renames
it over the trace directory, so a reader never sees the ``trace.json`` of one collection beside
the ``trace.npz`` (or the ``cost_table.json``) of another, and an interrupted save leaves the
earlier traces whole. A random ``trace_id`` is stored in all three files and ``Traces.load`` /
``stored_cost_table`` check it. ``collect`` keeps every finished recording in ``DIR/.partial/``
(one small npz per (prompt, class, k), written atomically) so an interrupted ``draftrl collect``
resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import secrets
import shutil
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from draftrl.config.env import EnvConfig
from draftrl.config.workload import SamplingClass
from draftrl.io import atomic_write_bytes, plain, write_json
from draftrl.prompts import Prompt
from draftrl.runs import ARRAYS_FILE, COST_TABLE_FILE, HEADER_FILE, TRACE_FILES, stored_cost_table_path
from draftrl.signals.features import DRAFT_FEATURES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from draftrl.signals.costs import CostTable

FORMAT = "draftrl-trace/2"
#: greedy traces of one recording per prompt, without target signals: still read (as K = 1 at temperature 0)
FORMAT_V1 = "draftrl-trace/1"
#: recordings per sampled class when ``collect`` is not told (a greedy class always stores one)
DEFAULT_CONTINUATIONS = 4
_V1_ARRAYS = (
    "prompt_tokens", "cu_num_prompt_tokens", "continuation", "cu_num_positions",
    "draft_features", "cu_num_nodes", "node_tokens", "node_parents", "node_depths", "node_scores",
)
_RECORDING_ARRAYS = ("recording_prompt", "recording_class", "recording_k", "recording_seed")
_POSITION_ARRAYS = ("p_token", "mass_before", "p_entropy", "target_top1_prob", "target_entropy")
#: every array of a trace directory (trace.npz), in the order saved
ARRAYS = _V1_ARRAYS + _RECORDING_ARRAYS + _POSITION_ARRAYS + ("node_p",)


@dataclass
class Traces:
    """Recorded traces (see the module docstring); arrays are numpy. R = recordings, T = positions, M = nodes.

    Built without the recording, signal and ``node_p`` arrays (greedy traces written by hand, a
    ``draftrl-trace/1`` directory), it is one temperature-0 recording per prompt: p = 1 on every
    continuation token, ``node_p`` = [the node's token is the continuation's], raw-softmax signals NaN.
    """

    prompts: list[Prompt]
    budgets: list[int]
    """max_new_tokens of each prompt's recorded requests [P]"""
    stop_reasons: list[str]
    """each recording's stop reason [R]"""
    prompt_tokens: np.ndarray
    """int64 [sum of prompt lengths]"""
    cu_num_prompt_tokens: np.ndarray
    """int64 [P + 1]"""
    continuation: np.ndarray
    """int64 [T]: the recordings' continuation tokens, one after the other"""
    cu_num_positions: np.ndarray
    """int64 [R + 1]"""
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
    classes: tuple[SamplingClass, ...] = (SamplingClass(),)
    """the sampling classes recorded (``EnvConfig.sampling_classes`` of the collection)"""
    num_continuations: tuple[int, ...] | None = None
    """recordings per prompt of each class (1 for a greedy class); None = 1 each"""
    recording_prompt: np.ndarray | None = None
    """int64 [R]: each recording's prompt (index into ``prompts``)"""
    recording_class: np.ndarray | None = None
    """int64 [R]: each recording's sampling class (index into ``classes``)"""
    recording_k: np.ndarray | None = None
    """int64 [R]: each recording's index among its (prompt, class)'s continuations"""
    recording_seed: np.ndarray | None = None
    """int64 [R]: the sampling seed its continuation was decoded with (:func:`recording_seed`)"""
    p_token: np.ndarray | None = None
    """float64 [T]: p of the continuation's token under the request's distribution (after temperature,
    top-k, top-p) at the row that predicted it"""
    mass_before: np.ndarray | None = None
    """float64 [T]: that row's p mass ranked strictly before the token (``TokenStats.mass_before``)"""
    p_entropy: np.ndarray | None = None
    """float64 [T]: entropy of that row's p, nats (``TokenStats.entropy``)"""
    target_top1_prob: np.ndarray | None = None
    """float64 [T]: top-1 probability of that row's raw softmax (temperature 1, no top-k/top-p); NaN: unknown"""
    target_entropy: np.ndarray | None = None
    """float64 [T]: entropy (nats) of that row's raw softmax; NaN: unknown"""
    node_p: np.ndarray | None = None
    """float64 [M]: p of the node's token at the row of the true prefix its depth extends (position
    t + depth - 1 of its recording; 0 past the continuation): a node whose ancestors follow the
    continuation is accepted, or in a sibling group drawn, with exactly this probability"""

    def __post_init__(self) -> None:
        self.classes = tuple(self.classes)
        if self.num_continuations is None:
            self.num_continuations = (1,) * len(self.classes)
        self.num_continuations = tuple(int(k) for k in self.num_continuations)
        num_recordings, num_positions = len(self.cu_num_positions) - 1, len(self.continuation)
        if self.recording_prompt is None:
            self.recording_prompt = np.arange(num_recordings, dtype=np.int64)
        for name in ("recording_class", "recording_k", "recording_seed"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(num_recordings, dtype=np.int64))
        greedy = all(c.greedy for c in self.classes)
        if self.p_token is None:
            if not greedy:
                raise ValueError("traces of sampled classes need their p_token, mass_before and p_entropy arrays; "
                                 "record them with draftrl collect.")
            self.p_token = np.ones(num_positions)
            self.mass_before = np.zeros(num_positions)
            self.p_entropy = np.zeros(num_positions)
        for name in ("target_top1_prob", "target_entropy"):
            if getattr(self, name) is None:
                setattr(self, name, np.full(num_positions, np.nan))
        if self.node_p is None:
            self.node_p = greedy_node_p(self.continuation, self.cu_num_positions, self.cu_num_nodes,
                                        self.node_tokens, self.node_depths)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def num_recordings(self) -> int:
        return len(self.cu_num_positions) - 1

    @property
    def greedy(self) -> bool:
        """Every recorded class is greedy (temperature 0)."""
        return all(c.greedy for c in self.classes)

    @property
    def one_per_prompt(self) -> bool:
        """Greedy, one recording per prompt in prompt order: recording p is prompt p (what the drafter-choice
        tables read)."""
        return self.greedy and np.array_equal(self.recording_prompt, np.arange(len(self.prompts)))

    def check_one_per_prompt(self, what: str) -> None:
        """Refuse traces with sampled classes or several recordings per prompt for a greedy-only reader."""
        if not self.one_per_prompt:
            labels = ", ".join(c.label for c in self.classes)
            raise ValueError(f"{what} reads greedy traces of one recording per prompt; these hold {labels} with "
                             f"{self.num_recordings} recordings of {len(self.prompts)} prompts: collect with "
                             "--set env.temperature=0.")

    def class_index(self, sampling) -> int | None:
        """The index of ``sampling`` (a ``SamplingClass`` or ``SamplingParams``) among ``classes``, or None.
        Greedy decoding is the argmax whatever top-k and top-p say, so any greedy class serves a greedy request."""
        key = (float(sampling.temperature), int(sampling.top_k), float(sampling.top_p))
        for i, c in enumerate(self.classes):
            if c.key == key or (c.greedy and key[0] == 0):
                return i
        return None

    def select(self, keep: list[int]) -> Traces:
        """The traces of the prompts ``keep`` (indices into ``prompts``, in the order given), every recording
        of each, arrays re-indexed: a smaller training set cut from one collection
        (``benchmarks/learning_curve.py``)."""
        keep = [int(p) for p in keep]
        new = {p: i for i, p in enumerate(keep)}
        if len(new) != len(keep) or any(not 0 <= p < len(self.prompts) for p in keep):
            raise ValueError(f"select({keep}) needs distinct prompt indices in [0, {len(self.prompts)}).")
        owner = self.recording_prompt.tolist()
        recs = [r for p in keep for r in range(self.num_recordings) if owner[r] == p]
        cu_pos, cu_nodes, cu_tok = self.cu_num_positions, self.cu_num_nodes, self.cu_num_prompt_tokens

        def spans(cu: np.ndarray, items) -> np.ndarray:
            return np.concatenate([np.arange(cu[i], cu[i + 1]) for i in items] or [np.zeros(0, np.int64)])

        def cumulative(cu: np.ndarray, items) -> np.ndarray:
            items = np.asarray(items, dtype=np.int64)
            return np.concatenate([[0], np.cumsum(cu[items + 1] - cu[items])]).astype(np.int64)

        pos = spans(cu_pos, recs)
        nodes = spans(cu_nodes, pos)
        per_position = ("continuation", "draft_features", *_POSITION_ARRAYS)
        per_node = ("node_tokens", "node_parents", "node_depths", "node_scores", "node_p")
        return dataclasses.replace(
            self, prompts=[self.prompts[p] for p in keep], budgets=[self.budgets[p] for p in keep],
            stop_reasons=[self.stop_reasons[r] for r in recs], meta=dict(self.meta),
            prompt_tokens=self.prompt_tokens[spans(cu_tok, keep)], cu_num_prompt_tokens=cumulative(cu_tok, keep),
            cu_num_positions=cumulative(cu_pos, recs), cu_num_nodes=cumulative(cu_nodes, pos),
            recording_prompt=np.array([new[owner[r]] for r in recs], dtype=np.int64),
            **{n: getattr(self, n)[recs] for n in ("recording_class", "recording_k", "recording_seed")},
            **{n: getattr(self, n)[pos] for n in per_position}, **{n: getattr(self, n)[nodes] for n in per_node})

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
                                **{name: getattr(self, name) for name in ARRAYS})
            if cost_table is not None:
                write_json(staged / COST_TABLE_FILE, {**cost_table.to_dict(), "trace_id": trace_id})
            header = {
                **{k: v for k, v in self.meta.items() if k not in ("trace_id", "read_format")},
                "format": FORMAT,
                "trace_id": trace_id,
                "max_depth": self.max_depth,
                "width": self.width,
                "draft_feature_names": list(DRAFT_FEATURES),
                "classes": [asdict(c) for c in self.classes],
                "num_continuations": list(self.num_continuations),
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

        A ``draftrl-trace/1`` directory loads as greedy traces of one recording per prompt (its
        ``meta["read_format"]`` says so); another format is refused.

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
        version = header.get("format")
        if version not in (FORMAT, FORMAT_V1):
            raise ValueError(f"{header_path} has format {version!r}; this draftrl reads {FORMAT!r} and {FORMAT_V1!r}: "
                             f"{fix}.")
        if header.get("draft_feature_names") != list(DRAFT_FEATURES):
            raise ValueError(f"{header_path} stores draft features {header.get('draft_feature_names')}, this draftrl "
                             f"expects {list(DRAFT_FEATURES)}; re-run draftrl collect.")
        names = ARRAYS if version == FORMAT else _V1_ARRAYS
        try:
            with np.load(arrays_path) as data:
                arrays = {name: data[name] for name in names}
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
            classes = tuple(SamplingClass(**c) for c in header.get("classes", [{}]))
            num_continuations = tuple(int(k) for k in header.get("num_continuations", [1] * len(classes)))
            _check_lengths(header, arrays, len(classes), num_continuations)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{header_path} lacks or mangles {err}; {fix}.") from None
        except ValueError as err:
            raise ValueError(f"{directory}: {err}; {fix}.") from None
        meta = {k: v for k, v in header.items()
                if k not in ("max_depth", "width", "prompts", "budgets", "stop_reasons", "draft_feature_names",
                             "classes", "num_continuations")}
        meta["read_format"] = version
        return cls(
            prompts=[Prompt(**p) for p in header["prompts"]],
            budgets=[int(b) for b in header["budgets"]],
            stop_reasons=list(header["stop_reasons"]),
            max_depth=int(header["max_depth"]),
            width=int(header["width"]),
            meta=meta,
            classes=classes,
            num_continuations=num_continuations,
            **arrays,
        )

    @property
    def config(self) -> EnvConfig:
        """The EnvConfig the traces were recorded with."""
        from draftrl.config import from_dict

        return from_dict(EnvConfig, self.meta["config"])


def greedy_node_p(continuation: np.ndarray, cu_num_positions: np.ndarray, cu_num_nodes: np.ndarray,
                  node_tokens: np.ndarray, node_depths: np.ndarray) -> np.ndarray:
    """float64 [M]: ``node_p`` at temperature 0, where p is one-hot at the continuation's token: 1.0 where a
    node's token is the continuation's at position t + depth - 1 of its recording, else 0.0."""
    num_positions = len(continuation)
    if len(node_tokens) == 0 or num_positions == 0:
        return np.zeros(len(node_tokens))
    position = np.repeat(np.arange(num_positions), np.diff(cu_num_nodes))
    end = np.repeat(cu_num_positions[1:], np.diff(cu_num_positions))[position]
    row = position + node_depths - 1
    inside = row < end
    return (inside & (node_tokens == continuation[np.minimum(row, num_positions - 1)])).astype(np.float64)


def recording_seed(seed: int | None, prompt_id: str, sampling: SamplingClass, k: int) -> int:
    """The sampling seed of recording ``k`` of (prompt, class): reproducible from the config's seed (None: 0),
    the prompt's id and the class's label (not their positions, so another selection keeps every seed)."""
    words = [int(seed or 0) & 0xFFFFFFFF, zlib.crc32(prompt_id.encode()), zlib.crc32(sampling.label.encode()), int(k)]
    return int(np.random.SeedSequence(words).generate_state(1)[0] & 0x7FFFFFFF)


def _check_lengths(header: dict, arrays: dict[str, np.ndarray], num_classes: int,
                   num_continuations: tuple[int, ...]) -> None:
    """Raise ValueError when the arrays cannot describe the header's prompts (no IndexError later)."""
    num_prompts = len(header["prompts"])
    if len(header["budgets"]) != num_prompts:
        raise ValueError(f"the header lists {num_prompts} prompts but {len(header['budgets'])} budgets")
    if len(num_continuations) != num_classes or min(num_continuations, default=1) < 1:
        raise ValueError(f"num_continuations={list(num_continuations)} does not fit the {num_classes} classes")
    for name, total in (("cu_num_prompt_tokens", "prompt_tokens"), ("cu_num_positions", "continuation"),
                        ("cu_num_nodes", "node_tokens")):
        cu = arrays[name]
        if cu.ndim != 1 or cu.size == 0 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != len(arrays[total]):
            raise ValueError(f"{name} does not index {total} ({len(arrays[total])} entries)")
    if len(arrays["cu_num_prompt_tokens"]) != num_prompts + 1:
        raise ValueError(f"the arrays hold {len(arrays['cu_num_prompt_tokens']) - 1} prompts, the header {num_prompts}")
    num_recordings = len(arrays["cu_num_positions"]) - 1
    if len(header["stop_reasons"]) != num_recordings:
        raise ValueError(f"the arrays hold {num_recordings} recordings, the header {len(header['stop_reasons'])} "
                         "stop reasons")
    if "recording_prompt" not in arrays and num_recordings != num_prompts:
        raise ValueError(f"the arrays hold {num_recordings} recordings of {num_prompts} prompts")
    if any(len(arrays[n]) != num_recordings for n in _RECORDING_ARRAYS if n in arrays):
        raise ValueError(f"per-recording arrays disagree with the {num_recordings} recordings")
    if "recording_prompt" in arrays and num_recordings and (
            arrays["recording_prompt"].min() < 0 or arrays["recording_prompt"].max() >= num_prompts
            or arrays["recording_class"].min() < 0 or arrays["recording_class"].max() >= num_classes):
        raise ValueError("recording_prompt or recording_class point past the prompts or classes")
    num_positions = len(arrays["continuation"])
    if len(arrays["cu_num_nodes"]) != num_positions + 1 or len(arrays["draft_features"]) != num_positions or any(
            len(arrays[n]) != num_positions for n in _POSITION_ARRAYS if n in arrays):
        raise ValueError(f"per-position arrays disagree with the {num_positions} recorded positions")
    num_nodes = len(arrays["node_tokens"])
    per_node = ("node_parents", "node_depths", "node_scores", "node_p")
    if any(len(arrays[n]) != num_nodes for n in per_node if n in arrays):
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
            partial_dir: str | Path | None = None, num_continuations: int | None = None) -> Traces:
    """Record traces of ``config``'s prompts and sampling classes on ``engine`` (a ``SpeculativeDecoder``).

    For each prompt, each class of ``config.sampling_classes`` and each k, the engine decodes the
    request with that class's sampling and seed :func:`recording_seed` (exact at every temperature),
    one teacher-forced target forward over prompt + continuation gives the per-position signals, and
    the drafter proposes, in deterministic mode, from every true prefix. The engine's own sampling is
    put back afterwards.

    :param max_depth: levels of every stored tree; default ``max(config.depths)``.
    :param width: tree width; default ``config.width``.
    :param prompts: override the config's prompt selection.
    :param generate_depth: chain depth used to produce the continuations (their law does not depend
        on it: the engine is exact; it only makes collection faster).
    :param progress: callable ``(index, prompt, seconds, label, k)`` after each recording (``index``
        counts recordings; ``label`` is the class's, e.g. ``T0.7``), or None.
    :param partial_dir: keep each finished recording here (``PPPPP-cC-kK.npz``, written atomically) and
        skip the ones already there: an interrupted collection resumes. The directory records what is
        collected (``collection.json``); one made for another config or K is refused.
    :param num_continuations: recordings per prompt of each sampled class (default
        :data:`DEFAULT_CONTINUATIONS`); a greedy class always stores one (greedy decoding is deterministic).
    :raises ValueError: sampled drafts at temperature > 0 (exact but not replayable), or ``num_continuations < 1``.
    """
    import torch

    from draftrl.config import to_dict
    from draftrl.decoding.workload import Workload, budget
    from draftrl.models.distribution import SamplingParams
    from draftrl.signals.costs import hardware_info

    classes = config.sampling_classes
    drafter = engine.drafter
    if any(not c.greedy for c in classes) and (config.draft_sampling or getattr(drafter, "sampled", False)):
        raise ValueError(
            "draft_sampling=True draws each draft from q: exact, but a sampled continuation does not determine the "
            "rounds, so such drafts are not replayable; train them on the live env (draftrl/SpecDecode-v2), or "
            "collect with --set env.draft_sampling=false."
        )
    if num_continuations is not None and num_continuations < 1:
        raise ValueError(f"num_continuations={num_continuations} must be >= 1 (recordings per prompt and class).")
    per_class = continuations_per_class(config, num_continuations)
    max_depth = config.max_depth if max_depth is None else max_depth
    width = config.width if width is None else width
    workload = Workload(config, tokenizer, prompts)
    greedy = SamplingParams()
    config_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in to_dict(config).items()}
    partial = None
    if partial_dir is not None:
        partial = Path(partial_dir)
        open_partial(partial, collection_state(config, [p.id for p in workload.prompts], num_continuations,
                                               max_depth=max_depth, width=width, generate_depth=generate_depth))

    records, budgets = [], []
    saved_budget = engine.config.max_new_tokens
    try:
        for index, prompt in enumerate(workload.prompts):
            budgets.append(budget(config, prompt))
            request = None  # tokenised only when a recording of it is not kept yet
            for class_index, sampling in enumerate(classes):
                for k in range(per_class[class_index]):
                    saved = partial / recording_file(index, class_index, k) if partial is not None else None
                    if saved is not None and saved.is_file():
                        with np.load(saved) as data:
                            records.append({name: data[name] for name in data.files})
                        continue
                    request = request or workload.request(index)
                    seed = recording_seed(config.seed, request.prompt.id, sampling, k)
                    record = _record(engine, request, sampling, seed, max_depth, width, generate_depth, greedy, torch)
                    record.update(prompt_index=np.array(index), class_index=np.array(class_index),
                                  k=np.array(k), seed=np.array(seed))
                    if saved is not None:
                        buffer = io.BytesIO()
                        np.savez(buffer, **record)
                        atomic_write_bytes(saved, buffer.getvalue())
                    records.append(record)
                    if progress is not None:
                        progress(len(records) - 1, request.prompt, float(record["seconds"]), sampling.label, k)
    finally:
        engine.config.max_new_tokens = saved_budget

    def joined(name: str, dtype) -> np.ndarray:
        return np.concatenate([r[name] for r in records]).astype(dtype) if records else np.zeros(0, dtype=dtype)

    def cumulative(lengths) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    meta = {
        "config": config_dict,
        "target": config.target,
        "drafter": config.drafter,
        "draft_mode": "greedy",
        "hardware": hardware_info(config.device),
        "collect_seconds": float(sum(float(r["seconds"]) for r in records)),
        "generate_depth": generate_depth,
    }
    return Traces(
        prompts=list(workload.prompts),
        budgets=budgets,
        stop_reasons=[str(r["stop_reason"]) for r in records],
        prompt_tokens=(np.concatenate([r["prompt_tokens"] for r in records if int(r["class_index"]) == 0
                                       and int(r["k"]) == 0]) if records else np.zeros(0)).astype(np.int64),
        cu_num_prompt_tokens=cumulative([len(r["prompt_tokens"]) for r in records if int(r["class_index"]) == 0
                                         and int(r["k"]) == 0]),
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
        classes=classes,
        num_continuations=per_class,
        recording_prompt=np.array([int(r["prompt_index"]) for r in records], dtype=np.int64),
        recording_class=np.array([int(r["class_index"]) for r in records], dtype=np.int64),
        recording_k=np.array([int(r["k"]) for r in records], dtype=np.int64),
        recording_seed=np.array([int(r["seed"]) for r in records], dtype=np.int64),
        **{name: joined(name, np.float64) for name in _POSITION_ARRAYS + ("node_p",)},
    )


def _record(engine, request, sampling: SamplingClass, seed: int, max_depth: int, width: int, generate_depth: int,
            greedy, torch) -> dict[str, np.ndarray]:
    """One recording: the engine decodes ``request`` with ``sampling`` and ``seed``; the target's signals
    along the continuation; the drafter's deterministic tree from every true prefix."""
    t0 = time.perf_counter()
    drafter = engine.drafter
    ids = list(request.prompt_ids)
    params = sampling.params()
    engine.config.max_new_tokens = request.max_new_tokens
    engine.start(ids, seed=seed, sampling=params)  # the request's own sampling, as a mixed workload's request
    depth = generate_depth if drafter is not None else 0
    stop = None
    while not engine.finished:
        stop = engine.round(depth).stop_reason
    cont = list(engine.output_ids)
    signals, probs = _target_signals(engine, ids, cont, params, torch)
    if drafter is not None and drafter.reads_target_rows:
        engine.start(ids + cont)  # one forward over the sequence: the drafter keeps every row's hidden states
    elif drafter is not None:
        drafter.reset(ids)
    feats, cu_nodes = [], [0]
    node_tokens, node_parents, node_depths, node_scores, node_rows = [], [], [], [], []
    for t in range(len(cont)):
        prefix = ids + cont[:t]
        levels = min(max_depth, request.max_new_tokens - t - 1)
        row = np.zeros(len(DRAFT_FEATURES))
        # the first round feeds the prompt with its drafts (start(prefill=False)): a drafter that
        # reads the target's rows has none yet, so live it drafts nothing and sees no signal there
        if drafter is not None and (t > 0 or not drafter.reads_target_rows):
            found = drafter.features(prefix)
            row = np.array([found.get(name, 0.0) for name in DRAFT_FEATURES], dtype=np.float64)
            tree = drafter.propose(prefix, levels, width, greedy, None)  # deterministic drafts: any temperature
            node_tokens += tree.tokens
            node_parents += tree.parents
            node_depths += tree.depths
            node_scores += tree.scores
            node_rows += [t + d - 1 for d in tree.depths]
        if drafter is not None:
            drafter.commit(prefix + [cont[t]], [])
        feats.append(row)
        cu_nodes.append(len(node_tokens))
    tokens = np.asarray(node_tokens, dtype=np.int64)
    rows = np.asarray(node_rows, dtype=np.int64)
    if params.greedy:  # p is one-hot at the continuation's token (its argmax)
        padded = np.asarray(cont + [-1], dtype=np.int64)
        node_p = (tokens == padded[np.minimum(rows, len(cont))]).astype(np.float64)
    else:  # rows 0..len(cont): the teacher-forced forward's rows, the last one past the continuation
        node_p = np.zeros(len(tokens))
        if len(tokens):
            inside = torch.as_tensor(np.minimum(rows, len(cont)), device=probs.device)
            node_p = probs[inside, torch.as_tensor(tokens, device=probs.device)].double().cpu().numpy()
        node_p[rows >= len(cont)] = 0.0
    return {
        "prompt_tokens": np.asarray(ids, dtype=np.int64),
        "continuation": np.asarray(cont, dtype=np.int64),
        "draft_features": np.asarray(feats, dtype=np.float64).reshape(-1, len(DRAFT_FEATURES)),
        "num_nodes": np.diff(np.asarray(cu_nodes, dtype=np.int64)),
        "node_tokens": tokens,
        "node_parents": np.asarray(node_parents, dtype=np.int64),
        "node_depths": np.asarray(node_depths, dtype=np.int64),
        "node_scores": np.asarray(node_scores, dtype=np.float64),
        "node_p": node_p,
        **signals,
        "budget": np.array(request.max_new_tokens, dtype=np.int64),
        "stop_reason": np.array(stop or "length"),
        "seconds": np.array(time.perf_counter() - t0),
    }


def _target_signals(engine, ids: list[int], cont: list[int], params, torch) -> tuple[dict[str, np.ndarray], object]:
    """Per continuation position, from one teacher-forced target forward over ``ids + cont``: the row that
    predicted the token gives ``p_token``, ``mass_before``, ``p_entropy`` (under ``params``) and the raw
    softmax's ``target_top1_prob`` and ``target_entropy``. Also returns p [len(cont) + 1, V] on the target's
    device, for ``node_p`` (None at temperature 0, where p is one-hot at the continuation's token: p_token 1,
    mass and entropy 0)."""
    from draftrl.decoding.sampling import target_stats_batch
    from draftrl.models.distribution import logits_to_probs

    n = len(cont)
    if n == 0:
        empty = np.zeros(0)
        return {name: empty for name in _POSITION_ARRAYS}, None
    with torch.inference_mode():
        sequence = torch.tensor([ids + cont], device=engine.device)
        logits = engine.target(input_ids=sequence, use_cache=False).logits[0, len(ids) - 1:].float()  # [n + 1, V]
        logp = torch.log_softmax(logits.double(), dim=-1)
        top1 = logp[:n].max(dim=-1).values.exp()
        entropy = -torch.special.xlogy(logp[:n].exp(), logp[:n].exp()).sum(dim=-1)
        raw = {"target_top1_prob": top1.cpu().numpy(), "target_entropy": entropy.cpu().numpy()}
        if params.greedy:
            return {"p_token": np.ones(n), "mass_before": np.zeros(n), "p_entropy": np.zeros(n), **raw}, None
        probs = logits_to_probs(logits, params)  # [n + 1, V]
        p_token, mass_before, p_entropy = target_stats_batch(probs[:n], torch.tensor(cont, device=probs.device))
        return {"p_token": p_token.double().cpu().numpy(), "mass_before": mass_before.double().cpu().numpy(),
                "p_entropy": p_entropy.double().cpu().numpy(), **raw}, probs


def continuations_per_class(config: EnvConfig, num_continuations: int | None = None) -> tuple[int, ...]:
    """Recordings per prompt of each of ``config.sampling_classes``: one for a greedy class (greedy decoding
    is deterministic), ``num_continuations`` (default :data:`DEFAULT_CONTINUATIONS`) for a sampled one."""
    return tuple(1 if c.greedy else (num_continuations or DEFAULT_CONTINUATIONS) for c in config.sampling_classes)


def recording_file(index: int, class_index: int, k: int) -> str:
    """The ``.partial`` file of recording k of prompt ``index`` (in the selection) at class ``class_index``."""
    return f"{index:05d}-c{class_index}-k{k}.npz"


def collection_state(config: EnvConfig, prompt_ids: list[str], num_continuations: int | None = None, *,
                     max_depth: int | None = None, width: int | None = None, generate_depth: int = 4) -> dict:
    """What a collection records in ``.partial/collection.json`` (:func:`open_partial`): a resumed or sharded
    collection (``draftrl.replay.ray_collect``) must be this one."""
    from draftrl.config import to_dict

    config_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in to_dict(config).items()}
    return {"format": FORMAT, "config": config_dict,
            "max_depth": config.max_depth if max_depth is None else max_depth,
            "width": config.width if width is None else width, "generate_depth": generate_depth,
            "prompts": list(prompt_ids), "classes": [c.label for c in config.sampling_classes],
            "num_continuations": list(continuations_per_class(config, num_continuations))}


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
