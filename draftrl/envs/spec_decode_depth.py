"""``draftrl/SpecDecodeDepth-v2`` and ``draftrl/TraceReplayDepth-v1``: stop or continue drafting after every level.

Learning to Draft's depth policy: the tree is grown one level per step
(``RoundEngine.begin_levels`` / ``TreeBuilder.step``: one batched draft forward per level live,
the recorded tree's next level in the replay) and verified with ``RoundEngine.round_from_tree``
when the agent stops. Observations and rewards come from the same builder and reward model as
``draftrl/SpecDecode-v2``; the engine is injected as there (``engine="replay"``: ``TraceReplayDepth-v1``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat

import numpy as np
from gymnasium import spaces

from draftrl.config.env import EnvConfig
from draftrl.envs.spec_decode import EngineEpisodes
from draftrl.signals.actions import CONTINUE, SizePolicy
from draftrl.signals.costs import CostTable
from draftrl.signals.features import LEVEL_FEATURES, feature_bounds, level_observation

if TYPE_CHECKING:
    from draftrl.decoding.interface import RoundEngine
    from draftrl.replay.traces import Traces


class SpecDecodeDepthEnv(EngineEpisodes):
    """
    ## Description

    Speculative decoding with one decision per draft level: after each level the agent sees the
    round's draft-side state and chooses CONTINUE (draft one more level, one batched draft
    forward) or STOP (the target verifies the tree now). A round is therefore 1 + (levels
    drafted) steps, except that the round is verified in the same step as the last level when
    the tree reaches ``max(EnvConfig.depths)`` levels, the request's remaining budget
    (``remaining - 1`` levels), or the drafter has nothing more to propose (in the replay: the
    recorded tree has no deeper level). STOP before any level is a plain target step. The
    verification size is fixed (``verify_size``, 0 = every drafted node) or chosen by
    ``size_policy(observation, tree) -> int`` at STOP. The engine is the live one
    (``SpecDecodeDepth-v2``) or the replay of recorded traces (``TraceReplayDepth-v1``,
    ``engine="replay"``), as in ``SpecDecode-v2`` / ``TraceReplay-v1``; for the same actions the
    rounds are equal (tested).

    ## Action Space

    ``Discrete(2)``: 0 = STOP (verify now), 1 = CONTINUE (draft one more level).

    ## Observation Space

    ``Box(float32, shape=(34,))`` for ``history=4``: the 31 features of
    ``draftrl/SpecDecode-v2`` (same order, same meaning, computed once at the start of the
    round: the request's sampling and the previous round's target signals included), then the
    current level's signals (``TreeBuilder.level_features``):

    | Num | Observation       | Min | Max  | Meaning |
    |-----|-------------------|-----|------|---------|
    | 31  | `level`           | 0   | 64   | draft levels built so far this round |
    | 32  | `level_best_prob` | 0   | 1    | exp(best cumulative draft score at that level): path probability |
    |     |                   |     |      | (model) or share of matches (n-gram) |
    | 33  | `level_num_nodes` | 0   | 1024 | nodes at that level (<= width) |

    ## Rewards

    Wall clock, NOT reproducible (live). Paid when the round is verified: the round's reward exactly
    as in ``SpecDecode-v2`` (``ratio`` or ``throughput``); intermediate draft steps pay 0. With
    ``EnvConfig.depth_shaping=True`` (``reward="ratio"`` only) each draft step pays
    ``-rho * (its draft seconds)`` and the verifying step pays ``tokens - rho * (the round's
    remaining seconds)``: the same round total, credited where the time is spent. In the replay
    the seconds are the cost table's: a draft level costs ``draft.level_seconds(width)``, the
    per-round draft base is charged with the verification (deterministic given the seed).

    ## Starting State

    As ``SpecDecode-v2`` (the first round feeds the prompt with its drafts): level 0 of the first round.

    ## Episode End

    - Termination: EOS or ``max_new_tokens`` reached by a verified round.
    - Truncation: ``max_episode_steps=16384`` steps in ``register(...)`` (both ids).

    ## Information

    Draft steps: ``phase="draft"``, ``level``, ``step_seconds``. Verifying steps:
    ``phase="verify"`` plus every key of ``SpecDecode-v2``'s info (``depth`` = levels drafted).

    ## Arguments

    ``config`` / overrides / ``engine`` (``"live"``, ``"replay"`` with ``traces`` and ``cost_table``,
    or a ``RoundEngine``) / ``tokenizer`` / ``target`` as ``SpecDecode-v2``; ``verify_size`` (int,
    0 = all drafted nodes); ``size_policy`` (callable or None). ``EnvConfig.verify_sizes`` is not
    used here. ``env.unwrapped.lookahead_action()`` (replay only, and only without a size policy):
    ``TraceReplay-v1``'s per-round best at the fixed ``verify_size`` (only the depth index means
    anything; ``Policy.act_step`` drafts to that depth and stops).

    ## Version History

    ``draftrl/SpecDecodeDepth-v2`` (live):

    - v2: the round features gain ``SpecDecode-v2``'s request and target entries (25..30), so the
      level signals move to 31..33 (issue 45). Reward unchanged; ``SpecDecodeDepth-v1`` is no longer
      registered (``gymnasium.make`` names v2).
    - v1: the first round's verification feeds the prompt (as in ``SpecDecode-v1``), so its
      seconds and reward include the prompt's forward; spaces unchanged.
    - v0: initial version; ``reset`` prefilled the prompt.

    ``draftrl/TraceReplayDepth-v1`` (``engine="replay"``):

    - v1: the observation of ``SpecDecodeDepth-v2``; rewards, flags, ``info`` and the entries it
      shares with v0 equal ``TraceReplayDepth-v0``'s pinned episodes bit for bit
      (``tests/envs/test_replay_ids_fixture.py``).
    - v0: initial version (``TraceReplayDepthEnv``). Since issue 42 this class with the replay
      round engine injected; its episodes were bit-identical for the same seed and actions.
    """

    def __init__(self, config: EnvConfig | dict | None = None, *, engine: str | RoundEngine | None = None,
                 traces: str | Path | Traces | None = None, cost_table: CostTable | str | Path | None = None,
                 tokenizer=None, target=None, verify_size: int = 0, size_policy: SizePolicy | None = None,
                 render_mode: str | None = None, **overrides: Any):
        super().__init__(config, engine=engine, traces=traces, cost_table=cost_table, tokenizer=tokenizer,
                         target=target, render_mode=render_mode, **overrides)
        if verify_size < 0 or verify_size > self.engine.config.max_verify_size:
            raise ValueError(
                f"verify_size={verify_size} must lie in 0..{self.engine.config.max_verify_size} "
                "(0 = all drafted nodes)."
            )
        if self.config.max_depth > 0 and not self.engine.drafts_levels:
            raise ValueError(f"SpecDecodeDepth-v2 grows drafts level by level; drafter {self.config.drafter!r} cannot "
                             "(it is none, or has no LevelDrafter.begin); use ngram, layerskip:N or a draft model.")
        self.verify_size, self.size_policy = verify_size, size_policy
        self.max_depth = self.config.max_depth
        self.feature_names = self.features.names + LEVEL_FEATURES
        self.action_space = spaces.Discrete(2)
        low, high = feature_bounds(self.feature_names)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        if size_policy is not None:  # sizes chosen at STOP: no fixed size to find the best depth for
            self.lookahead_action = None
        self._reset_round()

    def _reset_round(self) -> None:
        """A new round: no level drafted, nothing charged, the round's features not built yet."""
        self._builder = None
        self._level = 0
        self._draft_seconds = 0.0
        self._charged = 0.0
        self._base_obs: np.ndarray | None = None

    def _level_features(self) -> dict[str, float]:
        return self._builder.level_features() if self._builder is not None else {}

    def _level_obs(self) -> np.ndarray:
        """The round's features (built once per round) followed by the current level's."""
        if self._base_obs is None:
            self._base_obs = self._observation()
        return level_observation(self._base_obs, self._level_features())

    def _continues(self, action) -> bool:
        """True for CONTINUE, False for STOP; anything else is refused."""
        value = int(np.asarray(action))
        if not self.action_space.contains(value):
            raise ValueError(f"action={action!r} is outside {self.action_space} (0 = STOP, 1 = CONTINUE).")
        return value == CONTINUE

    def lookahead_action(self) -> np.ndarray:
        """``TraceReplay-v1``'s per-round best at this env's fixed ``verify_size``: only the depth index
        (first entry) means anything here; ``Policy.act_step`` drafts to that depth and stops."""
        return self._lookahead((self.verify_size,))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        info = self._start_request(seed, options)
        self._reset_round()
        return self._level_obs(), info

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        engine = self.engine
        if self.request is None or engine.finished:
            raise RuntimeError("step() called before reset() or after the episode ended; call reset().")
        limit = min(self.max_depth, engine.remaining - 1)
        if self._continues(action) and self._level < limit:
            if self._builder is None:
                self._builder = engine.begin_levels(self.config.width)
            grew = self._builder.step()
            seconds = self._builder.step_seconds
            self._draft_seconds += seconds
            if grew:
                self._level += 1
                reward = 0.0
                if self.config.depth_shaping:
                    reward, charged = self.rewards.draft_step(seconds)
                    self._charged += charged
                if self._level < limit:
                    info = {"phase": "draft", "level": self._level, "step_seconds": seconds}
                    return self._level_obs(), float(reward), False, False, info
                return self._verify(reward)  # the last level's shaping term is paid with the round
        return self._verify(0.0)

    def _verify(self, step_shaping: float) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        from draftrl.drafters.tree import DraftTree

        engine = self.engine
        tree = self._builder.tree if self._builder is not None else DraftTree()
        verify_size = self.verify_size if self.size_policy is None else int(self.size_policy(self._level_obs(), tree))
        rnd = engine.round_from_tree(tree, verify_size or None, draft_seconds=self._draft_seconds,
                                     depth=self._level, width=self.config.width)
        reward, info = self._finish_round(rnd, self._level, rnd.seconds - self._charged)
        info["phase"] = "verify"
        info["level"] = self._level
        self._reset_round()
        obs = self._level_obs()
        return obs, float(reward + step_shaping), bool(rnd.finished), False, info
