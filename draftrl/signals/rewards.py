"""Round rewards of the speculative-decoding envs, in wall-clock (or replayed) seconds.

- ``throughput``: ``tokens / seconds``, the per-round throughput of Learning to Draft
  (tokens/s). Its per-round mean favours the throughput-best setting, but its episode sum does
  not measure total tokens / total time (more, shorter rounds collect more terms).
- ``ratio``: ``tokens - rho * seconds`` (tokens), where ``rho`` is a running throughput estimate
  in tokens/s, frozen during an episode. The emitted tokens of an episode do not depend on the
  policy (greedy: the target's continuation; sampling: exact, so the same distribution), so the
  episode return ``N - rho * T`` is maximised by minimising the total time ``T``, i.e. by
  maximising ``N / T``, for any ``rho > 0`` (a Dinkelbach step: near the optimal throughput the
  per-round reward also ranks actions by throughput). The sum splits over the steps of a round,
  which is what ``SpecDecodeDepth-v2``'s shaping uses.

``rho`` starts at ``EnvConfig.rho`` if given, else at one token per plain step of the cost
table or of the cost tracker, else at the first round's throughput; at every reset it moves a
fraction ``rho_rate`` toward the last episode's tokens/s. A seeded reset restarts it.
"""

from __future__ import annotations

from collections.abc import Callable


class RewardModel:
    """Turns (tokens, seconds) into rewards; keeps ``rho`` for ``mode="ratio"``.

    :param mode: ``"ratio"`` or ``"throughput"``.
    :param rho: initial tokens/s (``0`` = estimate it, see the module docstring).
    :param rho_rate: step of the per-episode update of ``rho`` (0 keeps it fixed).
    :param rho_prior: callable returning a tokens/s estimate or None, used when ``rho`` is 0.
    """

    def __init__(self, mode: str, rho: float = 0.0, rho_rate: float = 0.1,
                 rho_prior: Callable[[], float | None] | None = None):
        if mode not in ("ratio", "throughput"):
            raise ValueError(f"reward mode {mode!r} is unknown; use 'ratio' or 'throughput'.")
        self.mode, self.rho_init, self.rho_rate, self.rho_prior = mode, float(rho), float(rho_rate), rho_prior
        self.restart()

    def restart(self) -> None:
        """Back to the initial ``rho`` (seeded reset)."""
        self.rho: float | None = self.rho_init if self.rho_init > 0 else None
        self._episode_tokens = 0.0
        self._episode_seconds = 0.0

    def start_episode(self) -> None:
        """Fold the finished episode's throughput into ``rho``; start counting a new one."""
        if self._episode_seconds > 0 and self._episode_tokens > 0:
            measured = self._episode_tokens / self._episode_seconds
            self.rho = measured if self.rho is None else self.rho + self.rho_rate * (measured - self.rho)
        self._episode_tokens = 0.0
        self._episode_seconds = 0.0
        if self.rho is None and self.rho_prior is not None:
            self.rho = self.rho_prior()

    def __call__(self, tokens: float, seconds: float) -> float:
        """Reward of a round that emitted ``tokens`` in ``seconds``."""
        self._episode_tokens += tokens
        self._episode_seconds += seconds
        seconds = max(seconds, 1e-9)
        if self.mode == "throughput":
            return tokens / seconds
        if self.rho is None:  # nothing known yet: this round's own throughput
            self.rho = tokens / seconds
        return tokens - self.rho * seconds

    def draft_step(self, seconds: float) -> tuple[float, float]:
        """Shaping term of one intermediate draft step (ratio mode): ``(-rho * seconds, seconds)``.

        Returns the reward and the seconds it charged (0 while ``rho`` is still unknown). The
        round's final call then passes only the seconds not yet charged, so the terms sum to
        the round's ratio reward exactly.
        """
        if self.mode != "ratio":
            raise ValueError("per-step shaping needs reward mode 'ratio'")
        if self.rho is None:
            return 0.0, 0.0
        self._episode_seconds += seconds
        return -self.rho * seconds, seconds
