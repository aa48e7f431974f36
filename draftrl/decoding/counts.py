"""Counting what drafts achieved, round by round (vLLM's ``SpecDecodingStats``): only counts.

Terms as in :mod:`draftrl.decoding.engine`: a round drafts positions 1..``num_drafted`` (the depth
of the chain or tree it verified), the target keeps ``num_accepted`` of them (a prefix) and the
round emits ``num_emitted`` = ``num_accepted + 1`` tokens (the recovered or bonus token included;
fewer only when EOS or the length limit cuts it). A round that drafted nothing is a plain target
step and is not counted (vLLM's ``num_drafts`` counts only steps with drafts).

- ``acceptance_per_position``: entry i-1 is P(position i accepted | positions 1..i-1 accepted and
  position i drafted) = rounds that accepted >= i / rounds that accepted >= i-1 and drafted >= i;
- ``accepted_at_least``: entry i-1 is the share of rounds that accepted at least i drafts;
- ``acceptance_length``: mean ``num_emitted`` per round, so it **counts the bonus token** (a draft
  that is never accepted has acceptance length 1.0).

The distillation's measurement (``draftrl.distill.measure``), the evaluation's summaries
(``draftrl.eval.metrics``) and ``benchmarks/drafter_acceptance.py`` all count through
:class:`AcceptanceCounts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceCounts:
    """Counts over drafting rounds, per draft position 1..``num_positions`` (deeper ones are not tracked)."""

    num_positions: int
    num_rounds: int = 0
    """rounds that drafted at least one position"""
    num_emitted: int = 0
    """tokens those rounds emitted"""
    num_reached: list[int] = field(default_factory=list)
    """[num_positions]: rounds that drafted position i and accepted positions 1..i-1"""
    num_accepted_per_pos: list[int] = field(default_factory=list)
    """[num_positions]: rounds that accepted position i (hence 1..i)"""

    def __post_init__(self) -> None:
        if self.num_positions < 1:
            raise ValueError(f"num_positions={self.num_positions} must be >= 1")
        self.num_reached = self.num_reached or [0] * self.num_positions
        self.num_accepted_per_pos = self.num_accepted_per_pos or [0] * self.num_positions

    def observe(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        """One round; ignored when it drafted nothing."""
        assert 0 <= num_accepted <= num_drafted, (num_accepted, num_drafted)
        if not num_drafted:
            return
        self.num_rounds += 1
        self.num_emitted += num_emitted
        for i in range(min(num_drafted, num_accepted + 1, self.num_positions)):
            self.num_reached[i] += 1
        for i in range(min(num_accepted, self.num_positions)):
            self.num_accepted_per_pos[i] += 1

    def observe_round(self, result) -> None:
        """One :class:`~draftrl.decoding.engine.RoundResult` (its verified depth is what it drafted)."""
        self.observe(result.verified_depth, result.num_accepted, result.num_emitted)

    def __add__(self, other: AcceptanceCounts) -> AcceptanceCounts:
        if other.num_positions != self.num_positions:
            raise ValueError(f"cannot add counts over {self.num_positions} and {other.num_positions} positions")
        return AcceptanceCounts(self.num_positions, self.num_rounds + other.num_rounds,
                                self.num_emitted + other.num_emitted,
                                [a + b for a, b in zip(self.num_reached, other.num_reached)],
                                [a + b for a, b in zip(self.num_accepted_per_pos, other.num_accepted_per_pos)])

    @property
    def acceptance_per_position(self) -> list[float | None]:
        """[num_positions] conditional acceptance (None where no round drafted that position)."""
        return [k / r if r else None for k, r in zip(self.num_accepted_per_pos, self.num_reached)]

    @property
    def accepted_at_least(self) -> list[float | None]:
        """[num_positions] share of rounds that accepted at least i drafts (None without rounds)."""
        return [k / self.num_rounds if self.num_rounds else None for k in self.num_accepted_per_pos]

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens emitted per drafting round, bonus token included (None without rounds)."""
        return self.num_emitted / self.num_rounds if self.num_rounds else None

    def summary(self) -> dict:
        """The three measures (rounded for reports) and the number of rounds."""
        return {"rounds": self.num_rounds,
                "acceptance_per_position": [_round(a, 4) for a in self.acceptance_per_position],
                "accepted_at_least": [_round(a, 4) for a in self.accepted_at_least],
                "acceptance_length": _round(self.acceptance_length, 3)}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
