"""Fixtures for the env tests: a scripted engine (env logic without models) and the shared model.

The scripted engine follows ``SpeculativeDecoder``'s public interface with a fake clock, so the
env's bookkeeping (termination, rewards, features, shaping) can be checked exactly; every env
also has tests on the real engine.
"""

from __future__ import annotations

import numpy as np
import pytest
from scripted_costs import PER_LEVEL, PER_NODE, PLAIN_STEP, scripted_target_features  # what it charges, reports

from draftrl.decoding.engine import EngineConfig, RoundResult, SpeculativeDecoder, TimedLevels
from draftrl.decoding.stats import TokenStats
from draftrl.drafters.base import LevelDrafter, TreeBuilder
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams


class ScriptedTokenizer:
    chat_template = "scripted"
    eos_token_id = 0

    def apply_chat_template(self, messages, **kwargs):
        return [1] + [2 + len(w) % 50 for w in messages[0]["content"].split()][:40]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + len(w) % 50 for w in text.split()][:40]}


class ScriptedBuilder(TreeBuilder):
    def __init__(self, engine, max_levels: int):
        self.engine, self.max_levels = engine, max_levels
        self.tree = DraftTree(features={"ngram_match_len": 2.0, "ngram_num_matches": 1.0})

    def step(self) -> bool:
        level = max(self.tree.depths, default=0)
        if level >= self.max_levels:
            return False
        self.engine.now += PER_LEVEL
        self.tree.add(1000 + level, len(self.tree) - 1, -0.1 * (level + 1))
        return True


class ScriptedDrafter(LevelDrafter):
    def __init__(self, engine, max_levels: int):
        self.engine, self.max_levels = engine, max_levels

    def features(self, ids):
        return {"ngram_match_len": 2.0, "ngram_num_matches": 1.0}

    def begin(self, ids, width, params, generator):
        return ScriptedBuilder(self.engine, self.max_levels)

    def commit(self, ids, accepted):
        pass


class ScriptedEngine:
    """Round ``i`` accepts ``min(verified chain length, accepts[i % len(accepts)])`` drafts.

    Seconds: a forward over ``n`` verified nodes costs ``PLAIN_STEP + PER_NODE * n``, a draft
    level ``PER_LEVEL``; the clock only moves when the engine charges time. Each round reports
    :func:`scripted_target_features` (``target=False``: none, as an engine that does not know them).
    ``accepts_at`` maps a request's temperature to its own ``accepts`` (acceptance falls as it rises).
    ``start(sampling=...)`` records the request's sampling in ``samplings`` (None when not passed).
    """

    samples = True
    drafts_levels = True

    def __init__(self, accepts=(2, 0, 4, 1), max_levels: int = 16, temperature: float = 0.0, target: bool = True,
                 accepts_at: dict[float, tuple[int, ...]] | None = None):
        self.config = EngineConfig(temperature=temperature)
        self.target = target
        self.samplings: list[SamplingParams | None] = []
        self.accepts = accepts
        self.accepts_at = accepts_at or {}
        self.drafter = ScriptedDrafter(self, max_levels)
        self.params = SamplingParams(temperature=temperature)
        self.generator = None
        self.now = 0.0
        self.finished = True
        self.ids: list[int] = []
        self.num_prompt_tokens = 0
        self.num_rounds = 0
        self.seeds: list[int | None] = []

    def clock(self) -> float:
        return self.now

    def check(self, config) -> None:  # the live engine's checks: they read only config and drafter
        SpeculativeDecoder.check(self, config)

    def begin_levels(self, width):
        return TimedLevels(lambda: self.drafter.begin(self.ids, width, self.params, None), self.clock)

    def start(self, prompt_ids, seed=None, prefill=True, rng=None, sampling=None) -> float:  # costs: rounds only
        self.now = 0.0  # each request restarts the fake clock, so float sums repeat exactly
        self.samplings.append(sampling)
        self.params = self.config.sampling if sampling is None else sampling
        self.ids = list(prompt_ids)
        self.num_prompt_tokens = len(self.ids)
        self.finished = False
        self.num_rounds = 0
        self.seeds.append(seed)
        return 0.0

    @property
    def output_ids(self):
        return self.ids[self.num_prompt_tokens :]

    @property
    def sampling(self) -> SamplingParams:
        return self.params

    @property
    def remaining(self) -> int:
        return self.config.max_new_tokens - len(self.output_ids)

    def features(self):
        return self.drafter.features(self.ids)

    def round(self, depth, verify_size=None, width=1) -> RoundResult:
        levels = min(depth, self.remaining - 1)
        builder = self.drafter.begin(self.ids, width, self.params, None)
        t0 = self.now
        for _ in range(levels):
            builder.step()
        return self.round_from_tree(builder.tree, verify_size, draft_seconds=self.now - t0, depth=depth, width=width)

    def round_from_tree(self, tree, verify_size=None, *, draft_seconds=0.0, depth=None, width=1) -> RoundResult:
        selected = tree.select(verify_size)
        n = len(selected)
        verify = PLAIN_STEP + PER_NODE * n
        self.now += verify
        accepts = self.accepts_at.get(self.params.temperature, self.accepts)  # the request's temperature's, if given
        accepted = min(n, accepts[self.num_rounds % len(accepts)])
        emitted = min(accepted + 1, self.remaining)
        tokens = [7] * emitted
        self.ids += tokens
        self.finished = self.remaining <= 0
        target = scripted_target_features(self.num_rounds, min(accepted, emitted)) if self.target else {}
        self.num_rounds += 1
        stats = TokenStats(token=tokens, p_token=np.ones(emitted), mass_before=np.zeros(emitted),
                           entropy=np.zeros(emitted), drafted=np.arange(emitted) < min(accepted + 1, n + 1) * (n > 0),
                           agree=(np.arange(emitted) < accepted).astype(float),
                           agree_expected=(np.arange(emitted) < accepted).astype(float))
        return RoundResult(
            tokens=tokens, depth=depth if depth is not None else max(tree.depths, default=0), width=width,
            verify_size=verify_size, num_proposed=len(tree), num_verified=n, num_accepted=min(accepted, emitted),
            verified_depth=max(selected.depths, default=0), draft_seconds=draft_seconds, verify_seconds=verify,
            sample_seconds=0.0, finished=self.finished, stop_reason="length" if self.finished else None,
            token_stats=stats, draft_features=tree.features, target_features=target,
        )


@pytest.fixture
def scripted():
    """Factory: ``scripted(**engine_kwargs) -> (engine, tokenizer)``."""
    return lambda **kwargs: (ScriptedEngine(**kwargs), ScriptedTokenizer())


@pytest.fixture(scope="session")
def shared_smollm2(smollm2):
    """The session's SmolLM2, also registered as the envs' per-process shared copy."""
    from draftrl.models import loading

    # key of shared_model(spec, dtype, device, kernels)
    loading._SHARED[("smollm2-135m", "float32", "cpu", None)] = smollm2
    return smollm2
