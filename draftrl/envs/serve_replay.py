"""``draftrl/ServeReplay-v0``: ``ServeVLLM-v0`` simulated from recordings and a calibrated step cost,
and the recordings of a workload it replays (:func:`record_workload`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from draftrl.decoding.admission import StepAction
from draftrl.decoding.vllm.calibrate import StepCostModel
from draftrl.config import resolve
from draftrl.config.serve import SERVING_DRAFTER, ServeConfig
from draftrl.decoding.replay import HeadProposals, Proposals, Recordings, ReplayEngine, record
from draftrl.envs.serve_vllm import ServeVLLMEnv
from draftrl.envs.workload import Workload

#: ServeConfig fields a per-episode load (``loads``) may set.
LOAD_KEYS = ("arrival", "concurrency", "rate", "burst_size", "burst_interval")


class ServeReplayEnv(ServeVLLMEnv):
    """
    ## Description

    ``draftrl/ServeVLLM-v0`` with the engine replaced by a continuous-batching simulator
    (:class:`draftrl.decoding.replay.ReplayEngine`): the recorded greedy continuations of the
    workload's requests (``draftrl collect --engine vllm``), the n-gram drafter's proposal
    recomputed at every true prefix (exact acceptance at temperature 0), vLLM's step semantics
    (prefill step, one-step action lag, ``max_num_seqs``, admission by survival score) and step
    seconds from the linear cost model fitted on ``draftrl calibrate --engine vllm``. No model
    runs: a step takes tens of microseconds.

    ## Action Space, Observation Space, Rewards, Starting State, Episode End, Information

    Exactly ``ServeVLLM-v0``'s (the same class code, ``draftrl.envs.serve_vllm``): a policy moves
    between the two unchanged. ``seconds`` (reward, clock, TTFT, ITL) are the cost model's:
    ``(base + per_seq * B) * j1 + (per_token * tokens + per_prefill_token * prompt_tokens) * j2
    + residual_std * z``, with ``B`` the sequences in the step, ``tokens`` the tokens its forward
    verifies (drafts + 1 of decoding requests), ``prompt_tokens`` the prompts of the requests it
    prefills (calibrated apart: a prompt token costs far less than a decode token), ``j1, j2`` mean-one lognormal factors of sigma
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
    ``cost_noise`` (default True), ``loads`` (a list of dicts of arrival fields, e.g.
    ``[{"concurrency": 1}, {"arrival": "poisson", "rate": 8.0}]``: each episode draws one, so a
    policy trains across loads; default: the config's), then ``ServeConfig`` and its keyword
    overrides as ``ServeVLLM-v0``. ``temperature`` must be 0 and ``rule`` ``match``, ``heuristic``
    or ``hindsight`` (this env only: each request drafts just what it will accept, the ceiling of
    per-request depth control; ``benchmarks/serve_headroom.py``). ``drafter`` (default ``ngram``) and
    ``head_proposals`` replay an EAGLE-3 head too (``eagle3``, ``sam:N``, ``best``:
    :class:`~draftrl.decoding.replay.ReplayEngine`), with the calibration's head cells as its cost;
    the config's ``drafter`` (a drafter spec) names the same (:func:`replay_drafter`).

    ``env.unwrapped.lookahead_action()``: the greedy one-step lookahead (the ``LookAhead`` baseline).

    ## Version History

    - v0: initial version.
    """

    def __init__(self, recordings: str | Path | Recordings, calibration: str | Path | dict | StepCostModel,
                 config: ServeConfig | dict | None = None, *, cost_jitter: float = 0.0, cost_noise: bool = True,
                 loads: list[dict[str, Any]] | None = None, proposals: Proposals | None = None,
                 drafter: str = "ngram", head_proposals: HeadProposals | None = None, render_mode: str | None = None, **overrides: Any):
        config = resolve(ServeConfig, config, overrides)
        unknown = {k for load in loads or () for k in load} - set(LOAD_KEYS)
        if unknown:
            raise ValueError(f"loads may set only {', '.join(LOAD_KEYS)}, not {', '.join(sorted(unknown))}.")
        self.loads = [dataclasses.replace(config, **load) for load in loads or ()]
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r} is not supported; the serving env does not render.")
        if config.temperature != 0:
            raise ValueError(f"{config.section}.temperature={config.temperature}: ServeReplay-v0 replays greedy "
                             "recordings; use temperature 0 (or ServeVLLM-v0 to sample).")
        if cost_jitter < 0:
            raise ValueError(f"cost_jitter={cost_jitter} must be >= 0 (a lognormal sigma).")
        if not isinstance(recordings, Recordings):
            recordings = Recordings.load(recordings)
        recorded = recordings.meta.get("config", {})
        for name in ("target", "chat_template"):
            if name in recorded and recorded[name] != getattr(config, name):
                raise ValueError(f"{config.section}.{name}={getattr(config, name)!r} differs from the recordings' "
                                 f"{recorded[name]!r}; record again with --set env.{name}={getattr(config, name)}.")
        self.recordings = recordings
        self.cost_model = calibration if isinstance(calibration, StepCostModel) \
            else StepCostModel.from_calibration(calibration)
        self.cost_jitter, self.cost_noise = float(cost_jitter), bool(cost_noise)
        engine = ReplayEngine(recordings, self.cost_model, max_depth=max(1, config.max_depth),
                              max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len, rule=config.rule,
                              proposals=proposals, drafter=replay_drafter(config, drafter),
                              head_proposals=head_proposals)
        self.tokenizer = None
        self._setup(config, engine, Workload(config, None, prompts=recordings.prompts,
                                             prompt_ids=recordings.prompt_ids()))

    def _arrivals(self, n: int) -> np.ndarray:
        """With ``loads``, first draw this episode's load (arrival process and its parameters)."""
        if self.loads:
            self.config = self.loads[int(self.np_random.integers(len(self.loads)))]
        return super()._arrivals(n)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        self.engine.cost = self.cost_model.jittered(self.cost_jitter, self.np_random)
        self.engine.rng = self.np_random if self.cost_noise else None
        info["load"] = {k: getattr(self.config, k) for k in LOAD_KEYS}
        return obs, info

    def lookahead_action(self) -> np.ndarray:
        """The greedy one-step lookahead: the action whose drafts (verified in the next step, the
        one-step lag) give the most ``tokens - rho * seconds`` over this step and the next, each
        action tried on a copy of the engine with the noise-free step cost; ties go to the
        shallowest, smallest-budget action. ``rho`` is the reward's running tokens/s."""
        rho = self.rewards.rho or 0.0
        best, best_score = np.array([0, 0]), -np.inf
        for i, depth in enumerate(self.depths):
            for j, budget in enumerate(self.budgets):
                if (depth == 0 or budget == 0) and (i, j) != (0, 0):
                    continue  # every no-speculation action is (0, 0)
                engine, score = self.engine.clone(), 0.0
                for _ in range(2):
                    if not engine.has_unfinished_requests():
                        break
                    result = engine.step(StepAction(depth, budget))
                    score += result.num_emitted - rho * result.seconds
                if score > best_score + 1e-12:
                    best, best_score = np.array([i, j]), score
        return best


def replay_drafter(config: ServeConfig, drafter: str = "ngram") -> str:
    """The drafter :class:`~draftrl.decoding.replay.ReplayEngine` replays: ``drafter`` (its names:
    ``ngram``, ``eagle3``, ``sam:N``, the oracle ``best``), or the one ``config.drafter`` names when
    it is not the default (``eagle3[:DIR]`` -> ``eagle3``, ``sam:N[:DIR]`` -> ``sam:N``; the head's
    proposals come from ``head_proposals``). One line when the two disagree or the spec is another
    n-gram drafter than the one the recordings' proposals are computed with."""
    if config.drafter == SERVING_DRAFTER:
        return drafter
    kind, _, rest = config.drafter.partition(":")
    named = {"eagle3": "eagle3", "sam": f"sam:{rest.partition(':')[0]}"}.get(kind)
    if named is None or drafter not in ("ngram", named):
        raise ValueError(f"{config.section}.drafter={config.drafter!r} cannot be replayed with drafter={drafter!r}: "
                         f"ServeReplay-v0 replays the proposer's n-gram drafter ({SERVING_DRAFTER}) or an EAGLE-3 head "
                         "(eagle3[:DIR], sam:N[:DIR], with head_proposals); set one of those.")
    return named


def record_workload(config: ServeConfig, engine=None, tokenizer=None, progress=None) -> Recordings:
    """Record every request of a :class:`~draftrl.config.serve.ServeConfig`'s workload.

    Default engine: vLLM without speculation in ``config.dtype`` (float32 by default: there vLLM
    with draftrl's proposer is token-identical to it, so the recording is what ``ServeVLLM-v0``
    emits under every policy; a Hugging Face greedy decode may break float ties differently).
    """
    if engine is None:
        from draftrl.decoding.vllm.engine import VLLMEngineConfig, shared_engine

        engine = shared_engine(VLLMEngineConfig.serving(config, method="none"))
    if tokenizer is None:
        from transformers import AutoTokenizer

        from draftrl.decoding.vllm.engine import model_path

        tokenizer = AutoTokenizer.from_pretrained(model_path(config.target))
    workload = Workload(config, tokenizer)
    requests = [(r.prompt, r.prompt_ids, r.max_new_tokens) for r in map(workload.request, range(len(workload)))]
    describe = engine.describe() if hasattr(engine, "describe") else {"engine": type(engine).__name__}
    return record(engine, requests, meta={"config": dataclasses.asdict(config), "engine": describe}, progress=progress)
