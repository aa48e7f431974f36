"""Drive draftrl's own engine with an exported policy: a ``schedule`` for ``decoding.generate``.

``decoding.generate(engine, prompt_ids, schedule, on_round=schedule.observe)`` asks the schedule
for ``(depth, verify_size, width)`` before every round. ``PolicySchedule`` answers from the
controller, with the observation built by the training env's own ``FeatureBuilder``
(``draftrl.export.features.make_feature_builder``) fed exactly as ``SpecDecodeEnv`` feeds it:
``engine.features()`` (draft-side signals), context and generated lengths before a round, and a
``RoundSummary`` of the finished round after it (measured seconds included, so the cost features
follow this machine, starting from the training cost table). Every input is known before the
target verifies the round (docs/design.md, exactness contract).

Depends on ``draftrl.decoding`` (the engine's interface) and the env's feature builder only.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from draftrl.export.features import make_feature_builder
from draftrl.signals.features import RoundSummary


class PolicySchedule:
    """``schedule(engine) -> (depth, verify_size or None, width)`` from an exported policy.

    :param controller: a ``PolicyController`` (or ``TorchScriptController``) of a size policy.
    :param fresh_costs: forget measured costs at every request (back to the cost table);
        False keeps them across requests, as the env does within a seeded run.
    """

    def __init__(self, controller: Any, fresh_costs: bool = False):
        if controller.kind != "size":
            raise ValueError(
                f"{controller.path} is a {controller.kind!r} policy; draftrl generate drives round-level (size) "
                "policies, which choose depth and verify_size once per round."
            )
        self.controller = controller
        self.features = make_feature_builder(controller.manifest.get("features"), controller.feature_names)
        self.width = controller.width
        self.fresh_costs = fresh_costs
        self.depth_histogram: Counter[int] = Counter()
        self._levels: int | None = None

    def check_engine(self, engine: Any) -> None:
        """Refuse an engine that cannot play every setting the policy may choose."""
        cfg = engine.config
        depth = max(self.controller.depths)
        if depth > cfg.max_depth:
            raise ValueError(
                f"the policy may choose depth={depth} but EngineConfig.max_depth={cfg.max_depth}; raise max_depth."
            )
        if depth > 0 and engine.drafter is None:
            raise ValueError(f"the policy may choose depth={depth} but the engine has no drafter; pass --drafter.")
        if self.width > cfg.max_width:
            raise ValueError(f"the policy drafts width={self.width} but EngineConfig.max_width={cfg.max_width}.")
        if max(self.controller.verify_sizes) > cfg.max_verify_size:
            raise ValueError(
                f"the policy may verify {max(self.controller.verify_sizes)} nodes but EngineConfig.max_verify_size="
                f"{cfg.max_verify_size}."
            )

    def observation(self, engine: Any) -> np.ndarray:
        """The coming round's observation, as ``SpecDecodeEnv._observation`` builds it."""
        if not engine.output_ids:  # a request's first round (every round emits at least one token)
            if self.fresh_costs:
                self.features.reset_costs()
            self.features.start_episode(engine.config.max_new_tokens, getattr(engine, "sampling", None))
        draft = engine.features() if not engine.finished else {}
        return self.features.observation(draft, len(engine.ids), len(engine.output_ids))

    def __call__(self, engine: Any) -> tuple[int, int | None, int]:
        depth, verify_size = self.controller.act(self.observation(engine))
        self._levels = min(depth, engine.remaining - 1)  # what the engine will draft (SpecDecodeEnv.step)
        self.depth_histogram[int(depth)] += 1
        return int(depth), (int(verify_size) or None), self.width

    def observe(self, rnd: Any) -> None:
        """Feed a finished round (``RoundResult``) to the history and cost features."""
        levels = self._levels if self._levels is not None else rnd.depth
        self._levels = None
        self.features.observe_round(RoundSummary.from_round(rnd, levels))

    def generate(self, engine: Any, prompt_ids: list[int], monitor: Any = None, seed: int | None = None) -> Any:
        """``decoding.generate`` one request on ``engine`` with this policy choosing every round."""
        from draftrl.decoding.generate import generate

        self.check_engine(engine)
        return generate(engine, prompt_ids, self, monitor=monitor, seed=seed, on_round=self.observe)
