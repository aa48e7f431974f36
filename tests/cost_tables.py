"""A hand-made cost table for the signals and env tests: plain step 20 ms at context 64, twice that at 1024."""

from __future__ import annotations

from draftrl.signals.costs import CostTable


def synthetic_table(g=(1.0, 1.1, 1.3, 1.8), step=0.02) -> CostTable:
    """``g``: forwards over 1, 2, 5 and 17 tokens in plain steps."""
    return CostTable(
        num_tokens=[1, 2, 5, 17][: len(g)], context_lens=[64, 1024],
        verify_seconds=[[step * x for x in g], [2 * step * x for x in g]],
        draft_widths=[1, 4], draft_level_seconds=[0.001, 0.002], draft_base_seconds=0.0005,
        sample_base_seconds=0.001, sample_token_seconds=0.0001,
    )
