"""The analytic model of speculative decoding as a Gymnasium env, ``draftrl/Analytic-v0``.

The model (docs/design.md, "Cost model"): each drafted token is accepted i.i.d. with probability
``alpha`` until the first rejection; a round always emits the accepted tokens plus one target
token (the correction on a rejection, the bonus token when every verified draft was accepted).
Costs are in units of one plain target step ``T``: a draft step costs ``draft_cost``, verifying
``n`` drafted tokens costs ``g(n)``. No model code runs here, so an episode takes milliseconds,
the numbers can be checked by hand, and a policy trains in seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from draftrl.signals.speedup import (
    DRAFT_COST,
    VERIFY_COST,
    VerifyCost,
    check_alpha,
    check_cost,
    expected_tokens,
    num_verified,
    verify_cost_table,
)

#: Observation features, in the order of the observation vector (see ``AnalyticEnv``).
FEATURE_NAMES: tuple[str, ...] = (
    "last_num_emitted",
    "last_accept_rate",
    "window_accept_rate",
    "ema_accept_rate",
    "progress",
    "draft_confidence",
)

#: Reward modes accepted by ``AnalyticEnv(reward=...)``.
REWARD_MODES: tuple[str, ...] = ("ratio", "throughput")

def _index_tuple(values: Any, name: str) -> tuple[int, ...]:
    """Validate a tuple of distinct non-negative integers (``depths``, ``verify_sizes``)."""
    items = tuple(values)
    if not items:
        raise ValueError(f"{name} is empty; give at least one value, e.g. {name}=(0,).")
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}={items!r} must hold non-negative integers; {v!r} is not one.")
    if len(set(items)) != len(items):
        raise ValueError(f"{name}={items!r} repeats a value; each action index must mean one setting.")
    return tuple(int(v) for v in items)


class AnalyticEnv(gym.Env[np.ndarray, np.ndarray]):
    """
    ## Description

    The analytic model of speculative decoding from the source article (docs/design.md, "Cost model"),
    as an episode of rounds that generates ``max_new_tokens`` tokens. Every round, the agent picks
    how many tokens the draft model proposes (``depth``, 0 = no speculation) and how many of them
    the target verifies (``verify_size``). Each verified draft token is accepted independently
    with probability ``alpha`` until the first rejection, and the target always adds one token
    (the correction after a rejection, or the bonus token when all verified drafts pass), so a
    round emits ``accepted + 1`` tokens, between 1 and ``n + 1`` for ``n`` verified drafts.

    Costs are in units of one plain target forward step: a draft step costs ``draft_cost`` (the
    article's ``c``), verifying ``n >= 1`` drafted tokens costs ``g(n)`` (``verify_cost``), and a
    round without speculation is one plain target step, cost 1. The expected tokens per round are
    ``E = (1 - alpha^(n+1)) / (1 - alpha)`` and the expected speedup over plain decoding is
    ``E / (g(n) + c * depth)`` (``expected_tokens``, ``expected_speedup``). With ``alpha=0.7``,
    ``c=0.05`` the best depth in 1..16 is 6 (``E=3.058819``, speedup ~2.353).

    Acceptance can switch between regimes (e.g. code at ``alpha=0.9`` and chat at ``alpha=0.3``)
    along a Markov chain. The agent does not see ``alpha``; it sees acceptance statistics of past
    rounds and a noisy draft-confidence signal of the coming round's regime, i.e. only what a real
    controller knows before the target verifies (the exactness contract in docs/design.md).

    **Verification size in the chain model.** The draft is a chain, so ``verify_size`` caps the
    number of drafted tokens that are verified: ``n = min(depth, verify_size)``, and
    ``verify_size=0`` means "verify every drafted token" (``n = depth``, the default and the
    article's model). Drafted tokens beyond ``n`` are paid for (``draft_cost`` each) and thrown
    away. ``depth=0`` verifies nothing whatever ``verify_size`` is. The second action dimension
    exists for interface parity with ``draftrl/SpecDecode-v2``, where ``verify_size`` counts
    tree nodes.

    ## Action Space

    ``MultiDiscrete([len(depths), len(verify_sizes)])``: ``action[0]`` indexes
    ``env.unwrapped.depths`` (default ``0..12``) and ``action[1]`` indexes
    ``env.unwrapped.verify_sizes`` (default ``(0,)``, one choice: verify everything drafted).

    ## Observation Space

    ``Box(float32, shape=(6,))``, names in ``env.unwrapped.feature_names``. Every feature is known
    before the round's verification. ``D = max(depths)``.

    | Num | Observation          | Min | Max   |
    |-----|----------------------|-----|-------|
    | 0   | `last_num_emitted`   | 0   | D + 1 |
    | 1   | `last_accept_rate`   | 0   | 1     |
    | 2   | `window_accept_rate` | 0   | 1     |
    | 3   | `ema_accept_rate`    | 0   | 1     |
    | 4   | `progress`           | 0   | 1     |
    | 5   | `draft_confidence`   | 0   | 1     |

    - `last_num_emitted`: tokens the previous round emitted (0 before the first round).
    - The three acceptance rates estimate the per-token acceptance probability from verified
      draft tokens: a round with ``a`` accepted of ``n`` verified is ``a`` successes and
      ``(a < n)`` failures (the trials stop at the first rejection). Each rate is
      ``(successes + 0.5) / (trials + 1)`` (Jeffreys-smoothed, 0.5 with no evidence) over the last
      round, the last ``accept_window`` rounds, and exponentially discounted counts (factor
      ``ema_decay`` per round) respectively. Rounds without speculation add no evidence.
    - `progress`: fraction of ``max_new_tokens`` emitted so far.
    - `draft_confidence`: ``clip(alpha_next + signal_noise * N(0, 1), 0, 1)`` where ``alpha_next``
      is the acceptance probability of the coming round's regime. It stands in for the draft's
      own confidences; ``signal_noise`` sets how informative it is (0 reveals alpha).

    ## Rewards

    In target-step units, never wall clock, so runs are reproducible from the seed. With
    ``tokens`` the round's emitted tokens and ``cost = g(n) + draft_cost * depth`` (1 without
    speculation):

    - ``reward="ratio"`` (default): ``tokens - rho * cost``, where ``rho`` (tokens per target
      step) is a running estimate of episode throughput, frozen during an episode. Since an
      episode emits a fixed ``max_new_tokens``, the episode return ``max_new_tokens - rho *
      total_cost`` is maximised by minimising total cost, i.e. by maximising total tokens / total
      time, for any ``rho > 0``. At reset ``rho <- (1 - rho_rate) * rho + rho_rate *
      (previous episode's tokens / cost)``; near the optimal throughput the per-round reward is
      also maximised by the throughput-best action (a Dinkelbach step), which helps discounted
      returns.
    - ``reward="throughput"``: ``tokens / cost``, the per-round throughput of Learning to Draft.
      Its per-round mean is maximised by the throughput-best fixed setting, but its episode sum
      is not: with a fixed token budget, more and shorter rounds collect more terms (plain
      decoding sums to ``max_new_tokens``, more than the best speculative setting does). Across
      regimes it is greedy per regime, which is not the ratio-of-sums optimum (alternating
      alphas 0.9 / 0.3 with ``c=0.05``: it picks depth 2 at 0.3, where depth 1 gives more total
      tokens per total time).

    Actions do not steer the regime process; rounds are coupled only through the token budget
    and the history features, so a short discount suits it: with SB3's PPO defaults and regimes
    (0.9, 0.3), ``gamma=0.99`` still played one fixed depth after 60k steps, while ``gamma=0``
    or ``0.5`` adapted depth to the regime within 10k-20k steps.

    ## Starting State

    No round has run: `last_num_emitted` = 0, the acceptance rates are 0.5, `progress` = 0. The
    regime is drawn uniformly (or set with ``reset(options={"regime": i})``) and
    `draft_confidence` is drawn for it. ``reset(seed=...)`` also restarts ``rho`` from its initial
    value, so a seed fixes the whole trajectory, rewards included.

    ## Episode End

    - Termination: ``max_new_tokens`` tokens have been emitted; the last round's tokens are
      clipped to the remaining budget (its cost is not).
    - Truncation: ``max_episode_steps`` rounds, set in ``register(...)`` (1024 for
      ``draftrl/Analytic-v0``; every round emits at least one token, so it never binds with
      ``max_new_tokens <= 1024``).

    ## Information

    ``info`` per step: ``num_emitted`` (tokens emitted this round, after clipping), ``num_accepted`` (draft
    tokens among them), ``num_verified`` (``n``), ``seconds`` (round cost, target steps),
    ``draft_seconds``, ``verify_seconds``, ``depth``, ``verify_size``, ``regime`` (index into
    ``env.unwrapped.alphas`` of the regime that played this round) and ``alpha`` (its acceptance
    probability). ``num_emitted`` and ``num_accepted`` are floats; with ``stochastic=False`` they are
    expected values.

    ## Arguments

    ```python
    import gymnasium as gym
    import draftrl.envs  # registers the ids (or: gym.make("draftrl.envs:draftrl/..."))
    env = gym.make("draftrl/Analytic-v0", alpha=0.7, draft_cost=0.05)
    ```

    - ``alpha`` (float, default 0.7): acceptance probability; not allowed together with ``regimes``.
    - ``draft_cost`` (float, 0.05): cost of one draft step, in target steps.
    - ``verify_cost``: ``g(n)`` for ``n >= 1`` verified tokens, in target steps: a number (the
      same for all ``n``, default 1), a mapping ``n -> cost`` covering every reachable ``n``, or a
      callable ``n -> cost``. ``g`` is not consulted for rounds without speculation (cost 1).
    - ``depths`` (tuple of int, ``0..12``), ``verify_sizes`` (tuple of int, ``(0,)``; 0 = all).
    - ``regimes`` (tuple of float, None): acceptance probability of each regime.
    - ``regime_switch`` (0.02): per-round probability of moving to another regime (chosen
      uniformly), or a row-stochastic ``K x K`` transition matrix.
    - ``max_new_tokens`` (int, 256): tokens per episode.
    - ``stochastic`` (bool, True): sample acceptances; False emits expected values (``E`` tokens
      per round). Regime switches and the confidence noise still use the env's RNG.
    - ``reward`` (``"ratio"`` or ``"throughput"``), ``rho`` (initial throughput estimate, default
      1 = plain decoding), ``rho_rate`` (0.1; 0 keeps ``rho`` fixed).
    - ``signal_noise`` (0.1), ``accept_window`` (8 rounds), ``ema_decay`` (0.8).

    ## Version History

    - v0: initial version.
    """

    metadata = {"render_modes": []}
    feature_names: tuple[str, ...] = FEATURE_NAMES

    def __init__(
        self,
        alpha: float | None = None,
        draft_cost: float = DRAFT_COST,
        verify_cost: VerifyCost = VERIFY_COST,
        depths: Sequence[int] = tuple(range(13)),
        verify_sizes: Sequence[int] = (0,),
        regimes: Sequence[float] | None = None,
        regime_switch: float | Sequence[Sequence[float]] = 0.02,
        max_new_tokens: int = 256,
        stochastic: bool = True,
        reward: str = "ratio",
        rho: float | None = None,
        rho_rate: float = 0.1,
        signal_noise: float = 0.1,
        accept_window: int = 8,
        ema_decay: float = 0.8,
        render_mode: str | None = None,
    ):
        if regimes is not None and alpha is not None:
            raise ValueError(
                f"alpha={alpha!r} and regimes={regimes!r} both given; pass regimes=(a1, a2, ...) alone."
            )
        raw_alphas = tuple(regimes) if regimes is not None else (0.7 if alpha is None else alpha,)
        if not raw_alphas:
            raise ValueError("regimes is empty; give at least one acceptance probability.")
        for a in raw_alphas:
            check_alpha(a, "regimes" if regimes is not None else "alpha")
        self.alphas: tuple[float, ...] = tuple(float(a) for a in raw_alphas)
        check_cost(draft_cost, "draft_cost", allow_zero=True)
        self.draft_cost = float(draft_cost)
        self.depths = _index_tuple(depths, "depths")
        self.verify_sizes = _index_tuple(verify_sizes, "verify_sizes")
        # index = num_verified
        self._verify_cost = verify_cost_table(verify_cost, max(self.depths), f"depths={self.depths}")
        self._transition = self._transition_matrix(regime_switch)  # [K, K], rows sum to 1
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer.")
        self.max_new_tokens = int(max_new_tokens)
        self.stochastic = bool(stochastic)
        if reward not in REWARD_MODES:
            raise ValueError(f"reward={reward!r} is not a reward mode; choose one of {REWARD_MODES}.")
        self.reward_mode = reward
        self._rho_init = 1.0 if rho is None else float(rho)
        check_cost(self._rho_init, "rho", allow_zero=False)
        if not 0.0 <= rho_rate <= 1.0:
            raise ValueError(f"rho_rate={rho_rate!r} must be in [0, 1] (0 keeps rho fixed).")
        self.rho_rate = float(rho_rate)
        self.rho = self._rho_init
        check_cost(signal_noise, "signal_noise", allow_zero=True)
        self.signal_noise = float(signal_noise)
        if isinstance(accept_window, bool) or not isinstance(accept_window, (int, np.integer)) or accept_window < 1:
            raise ValueError(f"accept_window={accept_window!r} must be a positive integer (rounds).")
        self.accept_window = int(accept_window)
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay={ema_decay!r} must be in [0, 1).")
        self.ema_decay = float(ema_decay)
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; AnalyticEnv does not render.")
        self.render_mode = render_mode

        max_depth = max(self.depths)
        self.action_space = spaces.MultiDiscrete([len(self.depths), len(self.verify_sizes)])
        high = np.array([max_depth + 1, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=np.float32)
        self.observation_space = spaces.Box(np.zeros_like(high), high, dtype=np.float32)

        self.regime = 0
        self._reset_episode()

    # ----------------------------------------------------------------------------- construction
    def _transition_matrix(self, regime_switch: float | Sequence[Sequence[float]]) -> np.ndarray:
        k = len(self.alphas)
        if np.ndim(regime_switch) == 0:
            p = float(regime_switch)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"regime_switch={regime_switch!r} must be a probability in [0, 1] per round.")
            if k == 1:
                return np.ones((1, 1))
            return np.full((k, k), p / (k - 1)) + np.eye(k) * (1.0 - p - p / (k - 1))
        matrix = np.asarray(regime_switch, dtype=float)
        if matrix.shape != (k, k) or (matrix < 0).any() or not np.allclose(matrix.sum(axis=1), 1.0):
            raise ValueError(
                f"regime_switch must be a row-stochastic {k}x{k} matrix for {k} regimes, got {regime_switch!r}."
            )
        return matrix / matrix.sum(axis=1, keepdims=True)

    def num_verified(self, depth: int, verify_size: int) -> int:
        """Drafted tokens the target verifies (``draftrl.signals.speedup.num_verified``)."""
        return num_verified(depth, verify_size)

    def round_seconds(self, depth: int, verify_size: int) -> tuple[float, float]:
        """``(draft_seconds, verify_seconds)`` of a round in target steps: ``c * depth`` and ``g(n)``.

        ``g(0) = 1``: a round without speculation is one plain target step.
        """
        return self.draft_cost * depth, float(self._verify_cost[self.num_verified(depth, verify_size)])

    @property
    def transition(self) -> np.ndarray:
        """Regime transition matrix, ``[K, K]``, row = this round's regime (a copy)."""
        return self._transition.copy()

    # ----------------------------------------------------------------------------- episode
    def _reset_episode(self) -> None:
        self.num_emitted = 0.0
        self.total_seconds = 0.0
        self._last_num_emitted = 0.0
        self._last = (0.0, 0.0)  # (accepted, trials) of the last round
        self._window: deque[tuple[float, float]] = deque(maxlen=self.accept_window)
        self._ema = [0.0, 0.0]  # discounted (accepted, trials)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.rho = self._rho_init
        elif self.total_seconds > 0:
            self.rho += self.rho_rate * (self.num_emitted / self.total_seconds - self.rho)
        self._reset_episode()
        regime = (options or {}).get("regime")
        if regime is None:
            self.regime = int(self.np_random.integers(len(self.alphas))) if len(self.alphas) > 1 else 0
        elif isinstance(regime, (int, np.integer)) and 0 <= regime < len(self.alphas):
            self.regime = int(regime)
        else:
            raise ValueError(f"options['regime']={regime!r} must index regimes {self.alphas}.")
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(np.asarray(action)):
            raise ValueError(f"action={action!r} is outside {self.action_space}.")
        depth = self.depths[int(action[0])]
        verify_size = self.verify_sizes[int(action[1])]
        n = self.num_verified(depth, verify_size)
        alpha = self.alphas[self.regime]

        if self.stochastic:
            # Trials stop at the first rejection: a successes, plus one failure if a < n.
            accepted = float(np.cumprod(self.np_random.random(n) < alpha).sum())
            trials = accepted + (accepted < n)
        else:
            accepted = expected_tokens(alpha, n) - 1.0
            trials = expected_tokens(alpha, n - 1) if n > 0 else 0.0
        self._record_acceptance(accepted, trials)

        remaining = self.max_new_tokens - self.num_emitted
        tokens = min(accepted + 1.0, remaining)
        accepted = min(accepted, tokens)
        terminated = tokens >= remaining
        self.num_emitted = float(self.max_new_tokens) if terminated else self.num_emitted + tokens
        self._last_num_emitted = tokens

        draft_seconds, verify_seconds = self.round_seconds(depth, verify_size)
        seconds = draft_seconds + verify_seconds
        self.total_seconds += seconds
        if self.reward_mode == "ratio":
            reward = tokens - self.rho * seconds
        else:
            reward = tokens / seconds

        info = {
            "num_emitted": tokens,
            "num_accepted": accepted,
            "num_verified": n,
            "seconds": seconds,
            "draft_seconds": draft_seconds,
            "verify_seconds": verify_seconds,
            "depth": depth,
            "verify_size": verify_size,
            "regime": self.regime,
            "alpha": alpha,
        }
        if len(self.alphas) > 1:
            self.regime = int(self.np_random.choice(len(self.alphas), p=self._transition[self.regime]))
        return self._observation(), float(reward), bool(terminated), False, info

    def _record_acceptance(self, accepted: float, trials: float) -> None:
        self._last = (accepted, trials)
        self._window.append(self._last)
        self._ema[0] = self.ema_decay * self._ema[0] + accepted
        self._ema[1] = self.ema_decay * self._ema[1] + trials

    def _observation(self) -> np.ndarray:
        def rate(successes: float, trials: float) -> float:
            return (successes + 0.5) / (trials + 1.0)

        window_accepted = sum(a for a, _ in self._window)
        window_trials = sum(t for _, t in self._window)
        confidence = self.alphas[self.regime] + self.signal_noise * self.np_random.standard_normal()
        obs = [
            self._last_num_emitted,
            rate(*self._last),
            rate(window_accepted, window_trials),
            rate(*self._ema),
            self.num_emitted / self.max_new_tokens,
            min(max(confidence, 0.0), 1.0),
        ]
        return np.array(obs, dtype=np.float32)
