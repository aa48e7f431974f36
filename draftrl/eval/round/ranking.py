"""Where ``draftrl grid`` ranks its cells before timing the best ones for real.

:class:`LiveRanking` (the default) times every cell live; :class:`ReplayRanking` (``grid.replay_rank``)
scores every cell it can replay on recorded traces first, so that only the top cells are timed live,
interleaved (:func:`ranked_cells`). Another source subclasses :class:`RankingSource`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from draftrl.eval.round.cells import Cell

if TYPE_CHECKING:
    from draftrl.eval.round.config import EvalConfig


class RankingSource:
    """Where the grid's ranking of cells comes from, before the top cells are timed for real.

    :meth:`rank` returns a score per cell name (higher is better) for the workload of ``config``
    (one sampling class). ``draftrl grid`` ranks with :class:`LiveRanking` (every cell timed live,
    which is also the final measurement); a replay source (trace replay with the calibrated costs,
    over many more requests than real time allows) plugs in here, and then only its
    ``top_cells`` best cells (plus plain decoding) are timed live, interleaved."""

    name = "abstract"

    def rank(self, config: EvalConfig, cells: list[Cell], *, target=None) -> dict[str, float]:  # pragma: no cover
        raise NotImplementedError


class LiveRanking(RankingSource):
    """Every cell timed live: the ranking is the live measurement itself (nothing ranked first)."""

    name = "live"

    def rank(self, config: EvalConfig, cells: list[Cell], *, target=None) -> dict[str, float]:
        return {cell.name: 0.0 for cell in cells}


class ReplayRanking(RankingSource):
    """Cells ranked on recorded traces (``draftrl collect``) with their cost table: each cell's
    replayed speedup over plain decoding (:func:`draftrl.replay.round_table.round_table`, the seconds
    ``TraceReplay-v0`` charges, no noise) over every prompt the traces hold, far more than real time
    can decode per cell.

    Greedy traces replay exactly at temperature 0 only: at T > 0 nothing is scored (every cell is
    timed live) until the replay walks sampled continuations (issue 45 item 1; then this source
    reads traces collected at that class). The replay verifies every drafted node of the traces'
    tree width: other cells (a verify size, another width, deeper than the traces) get no score
    and are always timed live.

    :param traces: a ``draftrl collect`` directory, or loaded ``Traces``.
    :param cost_table: a ``CostTable`` (or its file); None = the one stored with the traces.
    """

    name = "replay"

    def __init__(self, traces, cost_table=None):
        self.traces, self.cost_table = traces, cost_table
        self.why: str | None = None

    def _load(self):
        from draftrl.replay.traces import Traces, stored_cost_table
        from draftrl.signals.costs import CostTable

        traces = self.traces if isinstance(self.traces, Traces) else Traces.load(self.traces)
        table = self.cost_table
        if table is None and not isinstance(self.traces, Traces):
            table = stored_cost_table(self.traces)
        if isinstance(table, (str, Path)):
            table = CostTable.load(table)
        if table is None:
            raise ValueError(f"grid.replay_rank needs a cost table for the traces {self.traces}; collect them with "
                             "--cost-table FILE (draftrl calibrate writes one) or set env.cost_table.")
        return traces, table

    def rank(self, config: EvalConfig, cells: list[Cell], *, target=None) -> dict[str, float]:
        from draftrl.eval.round.headroom import headroom
        from draftrl.replay.round_table import round_table

        if config.env.temperature != 0:
            self.why = (f"greedy traces replay exactly at temperature 0 only (this class samples at "
                        f"{config.env.temperature:g}): every cell timed live")
            return {}
        traces, table = self._load()
        recorded = (traces.meta or {}).get("drafter")
        if recorded is not None and recorded != config.env.drafter:
            raise ValueError(f"grid.traces {self.traces} were collected with drafter={recorded!r}, the grid drafts "
                             f"with {config.env.drafter!r}; collect traces with the grid's drafter or set "
                             f"env.drafter={recorded}.")
        replayable = [c for c in cells if c.depth > 0 and c.verify_size == 0 and c.width == traces.width
                      and c.depth <= traces.max_depth]
        if not replayable:
            self.why = f"no cell verifies every node of width {traces.width} within depth {traces.max_depth}"
            return {}
        self.why = None
        room = headroom(round_table({"drafter": traces}, {"drafter": table}, [c.depth for c in replayable]))
        return {c.name: room.speedup(f"fixed:drafter:{c.depth}") for c in replayable}


def ranked_cells(config: EvalConfig, cells: list[Cell], ranking: RankingSource | None, top_cells: int | None, *,
                 target=None) -> tuple[list[Cell], dict | None]:
    """The cells to time live: all of them (no ranking, or :class:`LiveRanking`), else plain
    decoding, every cell ``ranking`` gave no score, and the ``top_cells`` best it scored (ties by
    cell order); and what the ranking said (``source``, ``scores``, ``top_cells``, ``timed``, ``why``)."""
    if ranking is None or isinstance(ranking, LiveRanking) or not top_cells:
        return cells, None
    scores = ranking.rank(config, cells, target=target)
    order = sorted((c for c in cells if c.depth > 0 and c.name in scores), key=lambda c: -scores[c.name])
    keep = {c.name for c in order[:top_cells]}
    timed = [c for c in cells if c.depth == 0 or c.name not in scores or c.name in keep]
    return timed, {"source": ranking.name, "scores": scores, "top_cells": top_cells, "timed": [c.name for c in timed],
                   "why": getattr(ranking, "why", None)}
