"""``draftrl/ServeReplay-v0``: ``ServeVLLM-v0`` simulated from recordings and a calibrated step cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from draftrl.decoding.vllm.calibrate import StepCostModel
from draftrl.envs.serve import ServeVLLMEnv
from draftrl.envs.serve_config import ServeConfig, resolve_serve_config
from draftrl.envs.serve_sim import Proposals, Recordings, ReplayEngine
from draftrl.envs.workload import Workload


class ServeReplayEnv(ServeVLLMEnv):
    """
    ## Description

    ``draftrl/ServeVLLM-v0`` with the engine replaced by a continuous-batching simulator
    (:class:`draftrl.envs.serve_sim.ReplayEngine`): the recorded greedy continuations of the
    workload's requests (``draftrl collect --engine vllm``), the n-gram drafter's proposal
    recomputed at every true prefix (exact acceptance at temperature 0), vLLM's step semantics
    (prefill step, one-step action lag, ``max_num_seqs``, admission by survival score) and step
    seconds from the linear cost model fitted on ``draftrl calibrate --engine vllm``. No model
    runs: a step takes tens of microseconds.

    ## Action Space, Observation Space, Rewards, Starting State, Episode End, Information

    Exactly ``ServeVLLM-v0``'s (the same class code, ``draftrl.envs.serve``): a policy moves
    between the two unchanged. ``seconds`` (reward, clock, TTFT, ITL) are the cost model's:
    ``(base + per_seq * B) * j1 + per_token * tokens * j2 + residual_std * z``, with ``B`` the
    sequences in the step, ``tokens`` the tokens its forward processes (prompts of prefilling
    requests, drafts + 1 of decoding ones), ``j1, j2`` mean-one lognormal factors of sigma
    ``cost_jitter`` drawn per episode, ``z ~ N(0, 1)`` per step when ``cost_noise`` (floored at a
    tenth of the mean). Deterministic given the seed.

    ## Arguments

    ```python
    env = gym.make("draftrl/ServeReplay-v0", recordings="runs/serve/rec", calibration="runs/serve/cal.json",
                   arrival="poisson", rate=8.0, cost_jitter=0.1)
    ```

    ``recordings`` (a directory from ``draftrl collect --engine vllm`` or :class:`Recordings`: the
    recorded prompts are the workload), ``calibration`` (a ``draftrl calibrate --engine vllm``
    JSON, refitted on load, or a :class:`StepCostModel`), ``cost_jitter`` (default 0),
    ``cost_noise`` (default True), then ``ServeConfig`` and its keyword overrides as
    ``ServeVLLM-v0``. ``temperature`` must be 0 and ``rule`` ``match`` or ``heuristic``.

    ## Version History

    - v0: initial version.
    """

    def __init__(self, recordings: str | Path | Recordings, calibration: str | Path | dict | StepCostModel,
                 config: ServeConfig | dict | None = None, *, cost_jitter: float = 0.0, cost_noise: bool = True,
                 proposals: Proposals | None = None, render_mode: str | None = None, **overrides: Any):
        config = resolve_serve_config(config, overrides)
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; the serving env does not render.")
        if config.temperature != 0:
            raise ValueError(f"ServeConfig.temperature={config.temperature}: ServeReplay-v0 replays greedy "
                             "recordings; use temperature 0 (or ServeVLLM-v0 to sample).")
        if cost_jitter < 0:
            raise ValueError(f"cost_jitter={cost_jitter} must be >= 0 (a lognormal sigma).")
        if not isinstance(recordings, Recordings):
            recordings = Recordings.load(recordings)
        recorded = recordings.meta.get("config", {})
        for name in ("model", "chat_template"):
            if name in recorded and recorded[name] != getattr(config, name):
                raise ValueError(f"ServeConfig.{name}={getattr(config, name)!r} differs from the recordings' "
                                 f"{recorded[name]!r}; record again with --set {name}={getattr(config, name)}.")
        self.recordings = recordings
        self.cost_model = calibration if isinstance(calibration, StepCostModel) \
            else StepCostModel.from_calibration(calibration)
        self.cost_jitter, self.cost_noise = float(cost_jitter), bool(cost_noise)
        engine = ReplayEngine(recordings, self.cost_model, max_depth=max(1, config.max_depth),
                              max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len, rule=config.rule,
                              proposals=proposals)
        self.tokenizer = None
        self._setup(config, engine, Workload(config.workload_config(), None, prompts=recordings.prompts,
                                             prompt_ids=recordings.prompt_ids()))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        self.engine.cost = self.cost_model.jittered(self.cost_jitter, self.np_random)
        self.engine.rng = self.np_random if self.cost_noise else None
        return obs, info
