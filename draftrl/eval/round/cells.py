"""A grid cell: one fixed (depth, verify size, width) setting and its one name, shared by the grid and the
sources that rank its cells (``eval.round.ranking``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    """One fixed setting; ``verify_size`` 0 = verify every drafted node."""

    depth: int
    verify_size: int = 0
    width: int = 1

    @property
    def name(self) -> str:
        return cell_name(self.depth, self.verify_size, self.width)


def cell_name(depth: int, verify_size: int = 0, width: int = 1) -> str:
    """``d{depth}_v{verify_size}_w{width}``; plain decoding is always ``d0_v0_w1``."""
    if depth == 0:
        return "d0_v0_w1"
    return f"d{depth}_v{verify_size}_w{width}"
