"""The serving envs' observation (``draftrl/ServeVLLM-v1``, ``draftrl/ServeReplay-v1``), built in one place.

Why a class of its own: a policy trained on the serving envs must see the same 23 numbers when it
runs inside vLLM (``draftrl.export.vllm_control.BatchPolicyControl``), where no env exists. The env
and the exported controller both feed :class:`ServingFeatures` what an engine step did (:class:`StepCounts`)
and read :meth:`ServingFeatures.observation`; neither computes a feature itself.

Units: seconds of wall clock (or of the replay's cost model), token counts; ``running``,
``waiting`` and ``tokens_in_flight`` are shares of the engine's ``max_num_seqs`` and
``max_num_seqs x max_model_len``. The table with every entry is in ``ServeVLLMEnv``'s docstring.
Numpy only, no engine code.

The batch's sampling (v1, issue 46): ``greedy_share``, ``temperature_mean`` and ``temperature_max``
over the requests the proposer drafted for after the last step (the rows of ``acceptance``), from
each request's own ``SamplingParams`` (the replay: its sampling class; vLLM: the model runner's
persistent batch, read by the proposer every step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: (name, low, high) of every observation entry, in order (the table in ServeVLLMEnv's docstring).
OBSERVATION: tuple[tuple[str, float, float], ...] = (
    ("running", 0.0, 1.0),
    ("waiting", 0.0, 64.0),
    ("tokens_in_flight", 0.0, 1.0),
    ("step_seconds", 0.0, 10.0),
    ("step_seconds_ema", 0.0, 10.0),
    ("seconds_per_seq_ema", 0.0, 10.0),
    ("tokens_per_seq", 0.0, 65.0),
    ("drafted_per_seq", 0.0, 64.0),
    ("accept_rate_step", 0.0, 1.0),
    ("accept_mean", 0.0, 1.0),
    ("accept_min", 0.0, 1.0),
    ("accept_max", 0.0, 1.0),
    ("match_0", 0.0, 1.0),
    ("match_1", 0.0, 1.0),
    ("match_2", 0.0, 1.0),
    ("match_3", 0.0, 1.0),
    ("proposed_per_seq", 0.0, 64.0),
    ("last_depth", 0.0, 1.0),
    ("last_budget", 0.0, 1.0),
    ("tokens_per_second_ema", 0.0, 1e5),
    ("greedy_share", 0.0, 1.0),
    ("temperature_mean", 0.0, 2.0),
    ("temperature_max", 0.0, 2.0),
)
FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _, _ in OBSERVATION)
#: The first observation's names (``ServeVLLM-v1`` / ``ServeReplay-v1``: blind to the batch's sampling);
#: an exported policy that reads them is refused naming the fix (``draftrl.export.features``).
FEATURE_NAMES_V0: tuple[str, ...] = FEATURE_NAMES[:20]
#: What the export manifest names as the builder of these features.
BUILDER = "draftrl.signals.serving.ServingFeatures"


@dataclass(frozen=True)
class StepCounts:
    """What one engine step did, as the serving features read it."""

    seconds: float
    """wall (or modelled) seconds of the step"""
    num_decoding: int
    """requests that gained tokens in the step"""
    num_emitted: int
    """tokens all requests gained (accepted + 1 each)"""
    num_verified: int
    """draft tokens the step verified"""
    num_accepted: int
    """of which accepted"""
    num_proposed: int
    """draft tokens proposed at the end of the step (verified in the next)"""
    num_running: int
    """requests in the batch after the step"""
    num_waiting: int
    """requests queued after the step"""

    @classmethod
    def of(cls, step: Any) -> StepCounts:
        """From a ``draftrl.decoding.interface.EngineStep`` (any object with its fields)."""
        return cls(float(step.seconds), len(step.requests), int(step.num_emitted), int(step.num_verified),
                   int(step.num_accepted), int(step.num_proposed), int(step.num_running), int(step.num_waiting))


class ServingFeatures:
    """The serving observation's state between steps (EMAs, the last step, the last action).

    :param max_num_seqs: the engine's batch limit (``running`` and ``waiting`` are shares of it).
    :param max_model_len: the engine's context limit (``tokens_in_flight`` is a share of
        ``max_num_seqs x max_model_len``).
    :param max_depth: the largest depth of the action space (``last_depth`` is a share of it).
    :param max_budget: the largest budget of the action space (``last_budget`` is a share of it).
    :param ema_decay: decay of the step-seconds, seconds-per-sequence and tokens/s EMAs.
    """

    names = FEATURE_NAMES
    low = np.array([lo for _, lo, _ in OBSERVATION], dtype=np.float32)
    high = np.array([hi for _, _, hi in OBSERVATION], dtype=np.float32)

    def __init__(self, max_num_seqs: int, max_model_len: int, max_depth: int, max_budget: int, ema_decay: float):
        if max_num_seqs < 1 or max_model_len < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} and max_model_len={max_model_len} must be >= 1.")
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay={ema_decay} must be in [0, 1).")
        self.max_num_seqs, self.max_model_len = int(max_num_seqs), int(max_model_len)
        self.max_depth, self.max_budget, self.ema_decay = int(max_depth), int(max_budget), float(ema_decay)
        self.restart()

    @classmethod
    def from_config(cls, config: Any) -> ServingFeatures:
        """From a ``draftrl.config.serve.ServeConfig`` (the env's settings)."""
        return cls(config.max_num_seqs, config.max_model_len, config.max_depth, max(config.budgets), config.ema_decay)

    def settings(self) -> dict[str, Any]:
        """The constructor's arguments (what the export manifest records)."""
        return {"max_num_seqs": self.max_num_seqs, "max_model_len": self.max_model_len, "max_depth": self.max_depth,
                "max_budget": self.max_budget, "ema_decay": self.ema_decay}

    def restart(self) -> None:
        """Forget every step: the state of an episode's first observation."""
        self._ema: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self.last_action = (0, 0)
        self.num_running = 0
        self.num_waiting = 0

    def record(self, step: StepCounts, action: tuple[int, int]) -> None:
        """Step ``step`` ran; ``action`` = (depth, budget) was given to it (its drafts are verified next step)."""
        decoding = max(1, step.num_decoding)
        last = {
            "step_seconds": step.seconds,
            "seconds_per_seq": step.seconds / decoding,
            "tokens_per_seq": step.num_emitted / decoding,
            "drafted_per_seq": step.num_verified / decoding,
            "accept_rate_step": step.num_accepted / step.num_verified if step.num_verified else 0.5,
            "proposed": float(step.num_proposed),
            "tokens_per_second": step.num_emitted / max(step.seconds, 1e-9),
        }
        d = self.ema_decay
        for key in ("step_seconds", "seconds_per_seq", "tokens_per_second"):
            self._ema[key] = last[key] if key not in self._ema else d * self._ema[key] + (1 - d) * last[key]
        self._last = last
        self.last_action = (int(action[0]), int(action[1]))
        self.num_running, self.num_waiting = int(step.num_running), int(step.num_waiting)

    def observation(self, tokens_in_flight: int, acceptance: np.ndarray, match_len: np.ndarray,
                    temperatures: np.ndarray | None = None) -> np.ndarray:
        """``[23]`` float32, clipped to the table's bounds.

        :param tokens_in_flight: prompt + generated tokens of the admitted, unfinished requests
        :param acceptance: ``[A]`` per-position acceptance estimates of the requests drafted for last step
        :param match_len: ``[A]`` their n-gram match lengths (0 = none)
        :param temperatures: ``[A]`` their temperatures (0 = greedy); None: every one greedy (an engine
            that samples nothing)
        """
        last, ema = self._last, self._ema
        running = self.num_running
        accept = np.asarray(acceptance).tolist()  # a few floats: python's sum/min/max beat numpy's call overhead
        match = np.asarray(match_len, dtype=np.int64)
        match_share = ((np.bincount(np.minimum(match, 3), minlength=4) / match.size).tolist()
                       if match.size else [0.0] * 4)
        obs = [
            running / self.max_num_seqs,
            self.num_waiting / self.max_num_seqs,
            tokens_in_flight / (self.max_num_seqs * self.max_model_len),
            last.get("step_seconds", 0.0),
            ema.get("step_seconds", 0.0),
            ema.get("seconds_per_seq", 0.0),
            last.get("tokens_per_seq", 0.0),
            last.get("drafted_per_seq", 0.0),
            last.get("accept_rate_step", 0.5),
            *((sum(accept) / len(accept), min(accept), max(accept)) if accept else (0.0, 0.0, 0.0)),
            *match_share,
            last.get("proposed", 0.0) / max(1, running),
            self.last_action[0] / max(1, self.max_depth),
            self.last_action[1] / max(1, self.max_budget),
            ema.get("tokens_per_second", 0.0),
            *self.sampling_entries(len(accept), temperatures),
        ]
        return np.clip(np.asarray(obs, dtype=np.float32), self.low, self.high)

    @staticmethod
    def sampling_entries(num_rows: int, temperatures: np.ndarray | None) -> tuple[float, float, float]:
        """``(greedy_share, temperature_mean, temperature_max)`` of ``num_rows`` requests (zeros for none)."""
        temps = [0.0] * num_rows if temperatures is None else np.asarray(temperatures, dtype=np.float64).tolist()
        if len(temps) != num_rows:
            raise ValueError(f"{len(temps)} temperatures for {num_rows} requests: one per request drafted for.")
        if not temps:
            return 0.0, 0.0, 0.0
        return sum(t == 0 for t in temps) / len(temps), sum(temps) / len(temps), max(temps)
