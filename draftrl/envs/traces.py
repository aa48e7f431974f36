"""Greedy decoding traces for ``draftrl/TraceReplay-v0``, and how ``draftrl collect`` records them.

For each prompt a trace holds the target's greedy continuation and, from every true prefix
(prompt + continuation[:t]), the drafter's tree grown to ``max_depth`` levels of ``width`` nodes
(tokens, parents, depths, scores) plus the drafter's pre-round signals. Both drafter kinds grow
trees one level at a time and never look ahead, so the tree a depth-d round drafts is exactly
the first d levels of the stored tree; at temperature 0 the target accepts a node iff its
token is the continuation's next token (the target's argmax), so the tokens of any
(depth, verify_size) round follow from walking the selected subtree along the continuation.

Files in the trace directory: ``trace.npz`` (the arrays below) and ``trace.json`` (format,
config, hardware, prompts, per-prompt budget and stop reason). Per-position arrays are
flattened over all prompts; ``cu_num_positions[p]`` is prompt p's first position and
``cu_num_nodes[i]`` position i's first node (vLLM's ``cu_num_*`` convention).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from draftrl.config.env import EnvConfig
from draftrl.signals.features import DRAFT_FEATURES
from draftrl.prompts import Prompt

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

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(directory / "trace.npz", **{name: getattr(self, name) for name in _ARRAYS})
        header = {
            **self.meta,
            "format": FORMAT,
            "max_depth": self.max_depth,
            "width": self.width,
            "draft_feature_names": list(DRAFT_FEATURES),
            "prompts": [asdict(p) for p in self.prompts],
            "budgets": self.budgets,
            "stop_reasons": self.stop_reasons,
        }
        (directory / "trace.json").write_text(json.dumps(header, indent=1, ensure_ascii=False) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "Traces":
        directory = Path(directory)
        header_path = directory / "trace.json"
        if not header_path.is_file():
            raise FileNotFoundError(
                f"{header_path} does not exist; record traces with draftrl collect --config CONFIG.yaml --out {directory}"
            )
        header = json.loads(header_path.read_text())
        if header.get("format") != FORMAT:
            raise ValueError(f"{header_path} has format {header.get('format')!r}, expected {FORMAT!r}; re-run draftrl collect.")
        if header.get("draft_feature_names") != list(DRAFT_FEATURES):
            raise ValueError(f"{header_path} stores draft features {header.get('draft_feature_names')}, this draftrl "
                             f"expects {list(DRAFT_FEATURES)}; re-run draftrl collect.")
        with np.load(directory / "trace.npz") as data:
            arrays = {name: data[name] for name in _ARRAYS}
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


def collect(config: EnvConfig, engine, tokenizer, *, max_depth: int | None = None, width: int | None = None,
            prompts: list[Prompt] | None = None, generate_depth: int = 4, progress=None) -> Traces:
    """Record greedy traces of ``config``'s prompts on ``engine`` (a ``SpeculativeDecoder``).

    :param max_depth: levels of every stored tree; default ``max(config.depths)``.
    :param width: tree width; default ``config.width``.
    :param prompts: override the config's prompt selection.
    :param generate_depth: chain depth used to produce the greedy continuation (greedy output
        does not depend on it; it only makes collection faster).
    :param progress: callable ``(index, prompt, seconds)`` after each prompt, or None.
    """
    from draftrl.decoding.sampling import SamplingParams
    from draftrl.signals.costs import hardware_info
    from draftrl.envs.workload import Workload

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
    started = time.perf_counter()

    prompt_tokens, cu_prompt = [], [0]
    continuation, cu_positions = [], [0]
    feats, cu_nodes = [], [0]
    node_tokens, node_parents, node_depths, node_scores = [], [], [], []
    budgets, stop_reasons = [], []
    for index in range(len(workload)):
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
        if drafter is not None:
            drafter.reset(ids)
        for t in range(len(cont)):
            prefix = ids + cont[:t]
            levels = min(max_depth, request.max_new_tokens - t - 1)
            row = np.zeros(len(DRAFT_FEATURES))
            if drafter is not None:
                signals = drafter.features(prefix)
                row = np.array([signals.get(name, 0.0) for name in DRAFT_FEATURES], dtype=np.float64)
                builder = drafter.begin(prefix, width, greedy, None)
                for _ in range(levels):
                    if not builder.step():
                        break
                tree = builder.tree
                node_tokens += tree.tokens
                node_parents += tree.parents
                node_depths += tree.depths
                node_scores += tree.scores
                drafter.commit(prefix + [cont[t]], [])
            feats.append(row)
            cu_nodes.append(len(node_tokens))
        prompt_tokens += ids
        cu_prompt.append(len(prompt_tokens))
        continuation += cont
        cu_positions.append(len(continuation))
        budgets.append(request.max_new_tokens)
        stop_reasons.append(stop or "length")
        if progress is not None:
            progress(index, request.prompt, time.perf_counter() - t0)

    from draftrl.config import to_dict

    meta = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in to_dict(config).items()},
        "target": config.target,
        "drafter": config.drafter,
        "hardware": hardware_info(config.device),
        "collect_seconds": time.perf_counter() - started,
        "generate_depth": generate_depth,
    }
    return Traces(
        prompts=list(workload.prompts),
        budgets=budgets,
        stop_reasons=stop_reasons,
        prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
        cu_num_prompt_tokens=np.asarray(cu_prompt, dtype=np.int64),
        continuation=np.asarray(continuation, dtype=np.int64),
        cu_num_positions=np.asarray(cu_positions, dtype=np.int64),
        draft_features=np.asarray(feats, dtype=np.float64).reshape(-1, len(DRAFT_FEATURES)),
        cu_num_nodes=np.asarray(cu_nodes, dtype=np.int64),
        node_tokens=np.asarray(node_tokens, dtype=np.int64),
        node_parents=np.asarray(node_parents, dtype=np.int64),
        node_depths=np.asarray(node_depths, dtype=np.int64),
        node_scores=np.asarray(node_scores, dtype=np.float64),
        max_depth=max_depth,
        width=width,
        meta=meta,
    )
