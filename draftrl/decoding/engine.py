"""The speculative decoding engine: one round at a time, exact at every temperature.

Terms (vLLM's): *accepted* tokens are draft tokens the target kept; the *recovered* token is the
one sampled from the residual after a rejection; the *bonus* token is sampled from the target at
the deepest accepted node when no child of it was verified. A round emits
``num_accepted + 1`` tokens (fewer only when EOS or the length limit cuts it).

Invariant between rounds: ``ids`` is prompt + output; the target cache holds ``ids[:-1]``; the
last token (the *root*) is fed at the start of the next round together with the draft tree. The
two exceptions are right after ``start``: its prefill fed the whole prompt and kept the root's
logits, so the first round feeds only its drafts; or, with ``start(..., prefill=False)``, the
cache is empty and the first round feeds the whole prompt with its drafts (``verify_forward``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

from draftrl.config import COMPILE_MODES, SAMPLERS
from draftrl.decoding.acceptance import accept_tree
from draftrl.decoding.argmax_check import check_argmax
from draftrl.decoding.clock import device_clock, engine_devices
from draftrl.decoding.stats import TokenStats
from draftrl.drafters.base import Drafter, LevelDrafter, TreeBuilder
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, generator_for
from draftrl.models.kv import cache_argument, crop, keep_tail, last_logits_only

#: ``stop(level_features) -> bool``: asked after each drafted level with ``TreeBuilder.level_features()``;
#: True ends drafting there (the level is kept and verified). It sees draft-side signals only.
LevelStop = Callable[[dict[str, float]], bool]


@dataclass
class EngineConfig:
    """Per-request decoding settings."""

    max_new_tokens: int = 128
    """generated tokens after which the request ends"""
    temperature: float = 0.0
    """0 = greedy; the target and the draft use the same sampling transform"""
    top_k: int = 0
    """keep the k most likely tokens (0 = off)"""
    top_p: float = 1.0
    """nucleus mass (1 = off)"""
    seed: int = 0
    """seed of the sampling generator"""
    keyed: bool = False
    """draw the token of output position t by the inverse CDF at a uniform keyed by (the request's seed, t)
    (``models.distribution.sample_keyed``) instead of the generator: the law is the same, and a round then
    emits, in float32, token for token what plain decoding with the same keyed stream emits, so a sampled
    run is checked like a greedy one. Needs deterministic drafts"""
    max_depth: int = 16
    """largest draft depth a round may ask for"""
    max_width: int = 16
    """largest tree width a round may ask for"""
    max_verify_size: int = 256
    """largest number of draft nodes the target verifies in one forward"""
    sampler: str = "correct"
    """'correct'; 'resample-from-p' and 'off-by-one' are known-wrong rules, for negative controls only"""
    compile: str = "off"
    """``torch.compile`` the target's verify forward (read when the engine is built): 'off', or a
    torch.compile mode ('default', 'reduce-overhead', 'max-autotune'), with dynamic shapes; the
    prefill stays eager. Off by default until measured on a GPU"""
    token_stats: bool = True
    """compute each emitted token's exactness statistics (``RoundResult.token_stats``, what the
    exactness monitor reads); False skips their float64 passes over the vocabulary and their host
    transfer, and leaves ``token_stats`` None (``--no-monitor`` turns them off)"""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler={self.sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile={self.compile!r} is not a torch.compile mode; choose one of "
                             f"{', '.join(COMPILE_MODES)}")
        self.sampling  # validates temperature / top-k / top-p

    def check_action(self, depth: int, verify_size: int | None, width: int) -> None:
        """Refuse a (depth, verify_size, width) outside this config's limits, naming the fix."""
        if not 0 <= depth <= self.max_depth:
            raise ValueError(f"depth={depth} is outside 0..EngineConfig.max_depth={self.max_depth}")
        if not 1 <= width <= self.max_width:
            raise ValueError(f"width={width} is outside 1..EngineConfig.max_width={self.max_width}")
        if verify_size is not None and not 1 <= verify_size <= self.max_verify_size:
            raise ValueError(
                f"verify_size={verify_size} is outside 1..EngineConfig.max_verify_size={self.max_verify_size}"
            )

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


@dataclass
class RoundResult:
    """What one round did. Seconds are wall clock (CUDA synchronised before each reading)."""

    tokens: list[int]
    depth: int
    width: int
    verify_size: int | None
    num_proposed: int
    """nodes the drafter proposed"""
    num_verified: int
    """nodes the target verified (the selected subtree, root excluded)"""
    num_accepted: int
    """accepted draft tokens that were emitted"""
    verified_depth: int
    """deepest level among verified nodes (0 = plain target step)"""
    draft_seconds: float
    verify_seconds: float
    sample_seconds: float
    """sampling, verification walk, exactness statistics and KV bookkeeping"""
    finished: bool
    stop_reason: str | None
    token_stats: TokenStats | None
    """one entry per emitted token; None when ``EngineConfig.token_stats`` is off"""
    draft_features: dict[str, float] = field(default_factory=dict)
    target_features: dict[str, float] = field(default_factory=dict)
    """what verification computed about the target (``draftrl.signals.features.TARGET_FEATURES``): raw-softmax
    top-1 probability and entropy at the row that emitted the round's last token, mean p of the accepted draft
    tokens; {} where an engine does not fill them"""
    prompt_fed: bool = False
    """the round's forward also fed the prompt (``start(prefill=False)``): ``verify_seconds``
    include the prefill, so they are no sample of what verifying costs"""

    @property
    def num_emitted(self) -> int:
        return len(self.tokens)

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds + self.sample_seconds


def check_fits(num_prompt_tokens: int, max_new_tokens: int, max_context: int | None) -> None:
    """Refuse a request whose prompt plus ``max_new_tokens`` exceeds the target's context: past it
    the positions are ones the model never saw, and the output is silently degraded."""
    total = num_prompt_tokens + max_new_tokens
    if max_context is not None and total > max_context:
        raise ValueError(
            f"the prompt has {num_prompt_tokens} tokens and max_new_tokens={max_new_tokens}, {total} in all, "
            f"beyond the target's context of {max_context} tokens; shorten the prompt to "
            f"{max(0, max_context - max_new_tokens)} tokens, lower max_new_tokens, or truncate it explicitly "
            "(draftrl generate --truncate-prompt keeps its last tokens)."
        )


class SpeculativeDecoder:
    """Draft/target speculative decoding with tree verification in one target forward.

    ``round(depth, verify_size, width)``: the drafter proposes a tree of ``depth`` levels and
    ``width`` nodes per level; the target verifies the ``verify_size`` best nodes in one forward
    under a tree attention mask and the longest valid path is accepted exactly; both KV caches
    keep only the accepted path. ``depth=0`` is a plain target step. It is the live
    :class:`~draftrl.decoding.interface.RoundEngine` of the round envs.
    """

    samples = True
    """a request takes a sampling seed (``start(seed=...)``), and the exactness monitor tests its output"""

    def __init__(
        self,
        target: nn.Module,
        drafter: Drafter | None,
        config: EngineConfig | None = None,
        eos_token_ids: list[int] | tuple[int, ...] = (),
    ):
        self.target = target
        self.drafter = drafter
        self.config = config or EngineConfig()
        #: what verify_forward calls: the target, or its torch.compile'd wrapper (the same weights)
        self._verifier = target if self.config.compile == "off" else torch.compile(
            target, mode=self.config.compile, dynamic=True)
        self.eos_token_ids = set(int(t) for t in eos_token_ids)
        self.device = next(target.parameters()).device
        #: every device a round runs on (the target's first; a split target's others; the drafter's)
        self.devices = engine_devices(target, drafter)
        self.dtype = next(target.parameters()).dtype
        self._cache_arg = cache_argument(target)
        self._prefill_kwargs = last_logits_only(target)  # the prefill reads only the last position
        #: positions the target can attend over (None: unknown); a request must fit in it
        self.max_context: int | None = getattr(getattr(target, "config", None), "max_position_embeddings", None)
        self.params = self.config.sampling  # the current request's sampling (``start(sampling=...)``)
        self._key_seed = self.config.seed
        # one generator, on the device that holds every tensor of a round: the drafter's children
        # and the verification walk both draw from it
        self.generator = generator_for(self.device, self.config.seed)
        self.ids: list[int] = []
        self.num_prompt_tokens = 0
        self.finished = True
        self._pending_draft_seconds = 0.0
        #: the target's logits at ids[-1] while the cache already holds it (set by the prefill,
        #: used by the next verification)
        self._root_logits: torch.Tensor | None = None
        #: the cache is empty: the next verification feeds the whole prompt (``start(prefill=False)``)
        self._prompt_pending = False
        #: rows of the last verification forward before the tree's nodes (None: it ran no forward)
        self._history_rows: int | None = None

    # ------------------------------------------------------------------ clock
    def clock(self) -> float:
        """perf_counter after synchronising every device of a round (``draftrl.decoding.clock.device_clock``)."""
        return device_clock(self.devices if len(self.devices) > 1 else self.device)

    # ------------------------------------------------------------------ request
    @torch.inference_mode()
    def start(self, prompt_ids: list[int], seed: int | None = None, prefill: bool = True, rng=None,
              sampling: SamplingParams | None = None) -> float:
        """Begin a request: prefill the target with the whole prompt. Returns seconds.

        ``seed`` seeds the sampling generator (and keys the keyed stream, ``EngineConfig.keyed``); ``rng``
        (the caller's numpy generator, which a replayed engine draws its cost noise from) is not used: the
        live engine's randomness is its generator. ``sampling``: this request's temperature, top-k and
        top-p (a request of a mixed workload), None = ``EngineConfig``'s; drafter and target share it.

        The prefill keeps the logits at the last prompt token, so the first round's verification
        feeds only its drafts (a plain first step needs no forward at all), as Hugging Face
        ``generate`` takes its first token from the prefill. Feeding that token again in the
        first round cost one extra target forward per request (~12% of an 8-token request).

        ``prefill=False`` runs no forward here: the first round verifies its drafts inside the
        prefill, feeding prompt + drafts in one forward, as Hugging Face prompt lookup does. That
        saves one more target forward per speculative request (measured: HF prompt lookup took
        one forward fewer per request than draftrl at the same acceptance, ~2.5% of a 64-token
        request); the prompt's cost then lands in the first round's ``verify_seconds``.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty; give at least one token")
        check_fits(len(prompt_ids), self.config.max_new_tokens, self.max_context)
        if seed is not None:
            self.generator.manual_seed(seed)
        self._key_seed = self.config.seed if seed is None else int(seed)
        self.params = self.config.sampling if sampling is None else sampling
        if self.config.keyed and not self.params.greedy and getattr(self.drafter, "sampled", False):
            raise ValueError("EngineConfig.keyed needs deterministic drafts, but the drafter samples its proposals "
                             "(EnvConfig.draft_sampling=true); turn one of them off.")
        t0 = self.clock()
        self.ids = [int(t) for t in prompt_ids]
        self.num_prompt_tokens = len(self.ids)
        self.cache = DynamicCache()
        self._root_logits = None
        self._prompt_pending = not prefill
        if prefill:
            out = self.target(
                input_ids=torch.tensor([self.ids], device=self.device),
                **{self._cache_arg: self.cache},
                use_cache=True,
                **self._prefill_kwargs,
            )
            self._root_logits = out.logits[0, -1]
        if self.drafter is not None:
            self.drafter.reset(self.ids)
            if prefill:
                self.drafter.keep_target_rows(list(range(len(self.ids))))
        self.finished = False
        self._pending_draft_seconds = 0.0
        return self.clock() - t0

    @property
    def output_ids(self) -> list[int]:
        return self.ids[self.num_prompt_tokens :]

    @property
    def sampling(self) -> SamplingParams:
        """The current request's sampling (the engine config's until ``start(sampling=...)``)."""
        return self.params

    @property
    def drafts_levels(self) -> bool:
        """Whether :meth:`begin_levels` can grow this engine's drafts a level at a time."""
        return isinstance(self.drafter, LevelDrafter)

    def check(self, config) -> None:
        """Refuse an ``EnvConfig`` whose sampling or limits contradict this engine (an env's config). A
        config with a temperature mix passes each request's sampling to ``start``: no sampling to compare."""
        ec = self.config
        # a mixed workload hands every request its own sampling at start(sampling=...)
        for name in () if getattr(config, "temperature_mix", None) is not None else ("temperature", "top_k", "top_p"):
            if getattr(ec, name) != getattr(config, name):
                raise ValueError(
                    f"engine {name}={getattr(ec, name)!r} differs from EnvConfig.{name}={getattr(config, name)!r}; "
                    "build the engine from the same config with draftrl.decoding.build.build_engine(config, target)."
                )
        if config.max_depth > ec.max_depth:
            raise ValueError(
                f"EnvConfig.depths reach {config.max_depth} but the engine allows max_depth={ec.max_depth}; "
                "raise EngineConfig.max_depth or shrink the action space."
            )
        if config.width > ec.max_width:
            raise ValueError(f"EnvConfig.width={config.width} exceeds EngineConfig.max_width={ec.max_width}.")
        if max(config.verify_sizes) > ec.max_verify_size:
            raise ValueError(
                f"EnvConfig.verify_sizes reach {max(config.verify_sizes)} but EngineConfig.max_verify_size="
                f"{ec.max_verify_size}; raise it or shrink the action space."
            )
        if config.monitor and not ec.token_stats:
            raise ValueError("EnvConfig.monitor=True needs the engine's per-token statistics but it was built with "
                             "EngineConfig.token_stats=False; build it with token_stats=True or set monitor=False.")
        if config.max_depth > 0 and self.drafter is None:
            raise ValueError(f"EnvConfig.depths={list(config.depths)} need a drafter but the engine has none; "
                             "use depths: [0] or a drafter.")

    def begin_levels(self, width: int) -> TimedLevels:
        """This round's draft tree after ``ids``, one level per ``step()``, each step timed on the engine's
        clock (verify it with :meth:`round_from_tree`)."""
        if not self.drafts_levels:
            raise ValueError(f"{type(self.drafter).__name__} drafts whole trees only; a level-by-level round needs "
                             "a LevelDrafter (ngram, layerskip:N, eagle3, sam or a draft model).")
        return TimedLevels(lambda: self.drafter.begin(self.ids, width, self.params, self.generator), self.clock)

    @property
    def remaining(self) -> int:
        return self.config.max_new_tokens - len(self.output_ids)

    def rewind(self, length: int) -> None:
        """Go back to the history ``ids[:length]`` (at least the prompt), dropping later KV entries."""
        if not self.num_prompt_tokens <= length <= len(self.ids):
            raise ValueError(f"rewind length {length} must lie in {self.num_prompt_tokens}..{len(self.ids)}")
        self.ids = self.ids[:length]
        crop(self.cache, length - 1)
        self._root_logits = None
        if self.drafter is not None:
            self.drafter.rewind(length)
        self.finished = False

    def features(self) -> dict[str, float]:
        """Draft-side signals for the next round (before any target verification). Their cost is
        charged to the next round's draft time."""
        if self.drafter is None:
            return {}
        t0 = self.clock()
        feats = self.drafter.features(self.ids)
        self._pending_draft_seconds += self.clock() - t0
        return feats

    def _validate(self, depth: int, verify_size: int | None, width: int) -> None:
        if self.finished:
            raise RuntimeError("the request is finished; call start() with a new prompt")
        self.config.check_action(depth, verify_size, width)
        if depth > 0 and self.drafter is None:
            raise ValueError(f"depth={depth} needs a drafter; pass one or use depth=0")

    # ------------------------------------------------------------------ one round
    @torch.inference_mode()
    def round(
        self, depth: int, verify_size: int | None = None, width: int = 1, stop: LevelStop | None = None
    ) -> RoundResult:
        """Draft, verify in one target forward, accept exactly, roll both caches back.

        With ``stop``, ``depth`` is the most levels drafted: the tree grows a level at a time
        (``LevelDrafter.begin``) and ``stop`` may end it after any level, its time counted as drafting."""
        self._validate(depth, verify_size, width)
        if stop is not None and depth > 0 and not isinstance(self.drafter, LevelDrafter):
            raise ValueError(f"a per-level stop needs a LevelDrafter; {type(self.drafter).__name__} drafts whole "
                             "trees only: use ngram, eagle3, sam or a draft model, or pass stop=None.")
        draft_depth = min(depth, self.remaining - 1)  # a round emits at most depth + 1 tokens

        t0 = self.clock()
        tree = DraftTree()
        if draft_depth > 0 and stop is None:
            tree = self.drafter.propose(self.ids, draft_depth, width, self.params, self.generator)
        elif draft_depth > 0:
            builder = self.drafter.begin(self.ids, width, self.params, self.generator)
            for _ in range(draft_depth):
                if not builder.step() or stop(builder.level_features()):
                    break
            tree = builder.tree
        draft_seconds = self.clock() - t0
        return self._verify_and_commit(tree, depth, width, verify_size, draft_seconds, commit=draft_depth > 0)

    @torch.inference_mode()
    def round_from_tree(
        self,
        tree: DraftTree,
        verify_size: int | None = None,
        *,
        draft_seconds: float = 0.0,
        depth: int | None = None,
        width: int = 1,
    ) -> RoundResult:
        """Verify and commit a tree the caller drafted after ``ids`` with ``drafter.begin(...)``
        (e.g. one level at a time, so that a depth policy can stop it); otherwise as :meth:`round`.

        ``draft_seconds`` is the caller's drafting time, reported in ``RoundResult.draft_seconds``
        (plus selection and any pending ``features()`` time). ``depth`` (default: the tree's depth)
        and ``width`` are recorded in the result. Levels deeper than ``remaining - 1`` are dropped,
        as :meth:`round` never drafts them.
        """
        tree_depth = max(tree.depths, default=0)
        depth = tree_depth if depth is None else depth
        self._validate(depth, verify_size, width)
        if tree_depth > 0 and self.drafter is None:
            raise ValueError("round_from_tree got a draft tree but the engine has no drafter to commit it")
        if tree_depth > self.remaining - 1:
            tree = tree.subset([i for i, d in enumerate(tree.depths) if d <= self.remaining - 1])
        return self._verify_and_commit(tree, depth, width, verify_size, draft_seconds, commit=self.drafter is not None)

    def _verify_and_commit(
        self, tree: DraftTree, depth: int, width: int, verify_size: int | None, draft_seconds: float, commit: bool
    ) -> RoundResult:
        """The shared second half of a round: select, verify, accept, commit to both caches."""
        t0 = self.clock()
        selected = tree.select(verify_size)
        t1 = self.clock()
        draft_seconds += t1 - t0 + self._pending_draft_seconds
        self._pending_draft_seconds = 0.0

        prompt_fed = self._prompt_pending
        logits = self.verify_forward(selected)  # [1 + n, V]
        t2 = self.clock()

        keyed = (self._key_seed, len(self.output_ids)) if self.config.keyed else None
        verdict = accept_tree(selected, logits, self.params, self.generator, self.config.sampler,
                              stats=self.config.token_stats, keyed=keyed)
        verdict = verdict.truncate(self._emit_count(verdict.tokens))
        if verdict.row_argmax is not None:  # temperature 0: each token is its verifying row's argmax, any dtype
            check_argmax(selected, verdict.tokens, verdict.accepted, verdict.row_argmax, len(self.output_ids))
        emitted, stop = verdict.tokens, self._stop_reason(verdict.tokens)
        past = len(self.ids) - 1
        keep = verdict.accepted[: len(emitted) - 1]  # the last emitted token becomes the next root
        keep_tail(self.cache, past + 1, [past + 1 + node for node in keep])
        if self.drafter is not None and self._history_rows is not None:  # the rows the target cache kept
            self.drafter.keep_target_rows(list(range(self._history_rows)) + [self._history_rows + n for n in keep])
        self.ids.extend(emitted)
        if commit:
            self.drafter.commit(self.ids, [selected.source_index(node) for node in keep])
        self.finished = stop is not None
        t3 = self.clock()

        return RoundResult(
            tokens=emitted,
            depth=depth,
            width=width,
            verify_size=verify_size,
            num_proposed=len(tree),
            num_verified=len(selected),
            num_accepted=len(verdict.accepted),
            verified_depth=max(selected.depths, default=0),
            draft_seconds=draft_seconds,
            verify_seconds=t2 - t1,
            sample_seconds=t3 - t2,
            finished=self.finished,
            stop_reason=stop,
            token_stats=verdict.stats,
            draft_features=tree.features,
            target_features=verdict.target_features(),
            prompt_fed=prompt_fed,
        )

    def verify_forward(self, tree: DraftTree) -> torch.Tensor:
        """Target logits [1 + len(tree), V] at the root and at every node, in ONE forward that
        feeds whatever of ``ids`` the cache lacks, then the tree under its mask. The tree's
        entries stay in the cache until ``round`` compacts it or ``rewind``.

        The cache lacks the root alone after a round; nothing right after :meth:`start`, whose
        root logits are kept (an empty tree then costs no forward); the whole prompt after
        ``start(prefill=False)``. Rows fed before the root are causal and only the root's and the
        nodes' logits are computed (``logits_to_keep``); the tree's rows see every earlier position
        and their own ancestors."""
        past, n = len(self.ids) - 1, len(tree)
        root, self._root_logits = self._root_logits, None
        cached = 0 if self._prompt_pending else past + (root is not None)
        self._prompt_pending = False
        #: rows of this forward before the tree's nodes (history positions cached..past); None: no forward
        self._history_rows = None if root is not None and not n else past + 1 - cached
        if root is not None and not n:
            return root[None]
        before = max(0, past - cached)  # rows fed before the root: the prompt, after a deferred prefill
        skip = int(root is not None)  # tree rows the cache holds: the kept root
        fed = self.ids[cached:] + tree.tokens
        if tree.is_chain:
            input_ids = torch.tensor([fed], device=self.device)
            mask = None
            positions = None if cached == 0 else torch.arange(cached, past + 1 + n, device=self.device)[None]
        else:  # one upload: the fed tokens and the tree's ancestor table
            data = torch.as_tensor(np.concatenate([np.asarray(fed, dtype=np.int64), tree.ancestors().ravel()]),
                                   device=self.device)
            input_ids, ancestors = data[None, : len(fed)], data[len(fed) :].view(1 + n, 1 + n).bool()
            # [1, 1, rows, past + 1 + n]
            mask = tree.attention_mask(past, self.dtype, self.device, ancestors)[..., skip:, :]
            positions = tree.position_ids(past, self.device, ancestors)[..., skip:]
            if before:
                blocked = torch.finfo(self.dtype).min  # above the diagonal: causal rows before the root
                causal = torch.full((before, past + 1 + n), blocked, dtype=self.dtype, device=self.device)
                mask = torch.cat([causal.triu(cached + 1)[None, None], mask], dim=2)
                positions = torch.cat([torch.arange(cached, past, device=self.device)[None], positions], 1)
        keep = {name: 1 + n for name in self._prefill_kwargs} if before else {}
        out = self._verifier(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            **{self._cache_arg: self.cache},
            use_cache=True,
            **keep,
        )
        logits = out.logits[0, -(1 + n - skip):]
        return logits if root is None else torch.cat([root[None].to(logits.dtype), logits])

    def _emit_count(self, tokens: list[int]) -> int:
        """How many of a round's tokens to emit: up to the first EOS and within the length limit."""
        for i, token in enumerate(tokens):
            if token in self.eos_token_ids:
                return min(i + 1, self.remaining)
        return min(len(tokens), self.remaining)

    def _stop_reason(self, emitted: list[int]) -> str | None:
        if emitted and emitted[-1] in self.eos_token_ids:
            return "eos"
        if len(emitted) >= self.remaining:
            return "length"
        return None


class TimedLevels(TreeBuilder):
    """A drafter's :class:`~draftrl.drafters.base.TreeBuilder`, begun at the first ``step()`` and each step
    timed on ``clock`` (``step_seconds``: the drafter's ``begin`` included in the first), so that an env
    charges every level what it cost."""

    def __init__(self, begin: Callable[[], TreeBuilder], clock: Callable[[], float]):
        self._begin, self._clock = begin, clock
        self._builder: TreeBuilder | None = None
        self.step_seconds = 0.0

    def step(self) -> bool:
        t0 = self._clock()
        if self._builder is None:
            self._builder = self._begin()
        grew = self._builder.step()
        self.step_seconds = self._clock() - t0
        return grew

    def level_features(self) -> dict[str, float]:
        return self._builder.level_features() if self._builder is not None else {}

    @property
    def tree(self) -> DraftTree:
        return self._builder.tree if self._builder is not None else DraftTree()
