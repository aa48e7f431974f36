"""Per-token exactness statistics: what the engine records and the exactness monitor consumes.

One entry per *emitted* token (accepted, recovered and bonus tokens; never rejected drafts).
``p`` below is the target distribution at that position after temperature, top-k, top-p and
masking, i.e. the distribution the output must be drawn from (see ``docs/architecture.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

_DTYPES = {
    "token": np.int64,
    "p_token": np.float64,
    "mass_before": np.float64,
    "entropy": np.float64,
    "drafted": np.bool_,
    "agree": np.float64,
    "agree_expected": np.float64,
}


@dataclass
class TokenStats:
    """Numpy arrays, all of shape ``[num_tokens]``; build with arrays or lists, dtypes are coerced."""

    token: np.ndarray
    """int64 emitted token id x_t"""
    p_token: np.ndarray
    """float64 p_t(x_t)"""
    mass_before: np.ndarray
    """float64 sum of p_t over tokens ranked strictly before x_t (decreasing p, ties by ascending id)"""
    entropy: np.ndarray
    """float64 H(p_t) in nats"""
    drafted: np.ndarray
    """bool: a draft proposal existed at this position (False for bonus tokens and plain steps)"""
    agree: np.ndarray
    """float64 1.0 if x_t is among the draft's proposals at this position, else 0.0"""
    agree_expected: np.ndarray
    """float64 exact E[agree | proposals] under exact sampling: p_t(C) for deterministic
    proposals C, min(1, p/q) for one sampled proposal (0.0 where not drafted)"""

    def __post_init__(self) -> None:
        n = None
        for f in fields(self):
            value = np.asarray(getattr(self, f.name), dtype=_DTYPES[f.name])
            if value.ndim != 1:
                raise ValueError(f"TokenStats.{f.name} must be 1-D [num_tokens], got shape {value.shape}")
            if n is None:
                n = value.shape[0]
            elif value.shape[0] != n:
                raise ValueError(
                    f"TokenStats fields differ in length: token has {n} entries, {f.name} has {value.shape[0]}"
                )
            object.__setattr__(self, f.name, value)

    def __len__(self) -> int:
        return int(self.token.shape[0])

    def __eq__(self, other: object) -> bool:
        """Field-wise array equality (the generated ``__eq__`` would compare arrays ambiguously)."""
        if not isinstance(other, TokenStats):
            return NotImplemented
        return all(np.array_equal(getattr(self, name), getattr(other, name)) for name in _DTYPES)

    def slice(self, start: int, stop: int) -> TokenStats:
        """Entries ``start:stop`` (e.g. a round cut short by EOS or the length limit)."""
        return TokenStats(**{f.name: getattr(self, f.name)[start:stop] for f in fields(self)})

    @classmethod
    def empty(cls) -> TokenStats:
        """Zero tokens."""
        return cls(**{name: np.zeros(0, dtype=dtype) for name, dtype in _DTYPES.items()})

    @classmethod
    def concat(cls, parts: list[TokenStats]) -> TokenStats:
        """Concatenate in order; an empty list gives :meth:`empty`."""
        if not parts:
            return cls.empty()
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in _DTYPES})
