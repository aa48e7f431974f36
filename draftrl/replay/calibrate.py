"""Measure what a round costs on this machine: the cost table of ``draftrl calibrate``.

Target: one forward over ``V`` tokens (1 = a plain step; a round verifying n draft nodes feeds
n + 1) after a few context lengths, through ``SpeculativeDecoder.verify_forward`` (the engine's
own code path, chain mask). Drafter: its per-round work (``features()``) and one tree level at
each width. Sampler: the acceptance walk and statistics per emitted token. Every cell is
measured ``repeats`` times in a freshly shuffled order per repeat (interleaved, so a load spike
spreads over all cells), the device is synchronised before each clock reading, and the table
keeps medians (:class:`~draftrl.signals.costs.CostTable`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from draftrl.config.commands import CalibrationConfig
from draftrl.config.env import EnvConfig
from draftrl.decoding.acceptance import accept_tree
from draftrl.decoding.build import check_draft_device, draft_device, load_target
from draftrl.decoding.clock import clock_for, engine_devices
from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.registry import build_drafter
from draftrl.drafters.tree import DraftTree
from draftrl.models import shared_model
from draftrl.models.chat import user_message_ids
from draftrl.models.distribution import SamplingParams, generator_for
from draftrl.prompts import load_prompts
from draftrl.signals.costs import CostTable, hardware_info


def _token_stream(tokenizer, length: int) -> list[int]:
    """Real text tokens (the shipped prompts, chat-wrapped, back to back), at least ``length`` of them."""
    stream: list[int] = []
    for prompt in load_prompts():
        stream += user_message_ids(tokenizer, prompt.prompt)
        if len(stream) >= length:
            break
    while len(stream) < length:
        stream += stream
    return stream[:length]


def _chain(tokens: list[int]) -> DraftTree:
    tree = DraftTree()
    for i, token in enumerate(tokens):
        tree.add(token, i - 1, -float(i))
    return tree


def measure_verify(model, stream: list[int], num_tokens, contexts, repeats: int, rng) -> tuple:
    """(seconds [C, N] medians, relative noise) of one target forward per (context, tokens)."""
    engines = {}
    for ctx in contexts:  # the cache holds ctx tokens; the root is token ctx
        engine = SpeculativeDecoder(model, None, EngineConfig(max_new_tokens=1))
        engine.start(stream[: ctx + 1])
        engine.rewind(len(engine.ids))  # drop the prefill's root logits: every timed forward feeds root + drafts
        engines[ctx] = engine
    trees = {n: _chain(stream[-(n - 1):] if n > 1 else []) for n in num_tokens}
    samples = {(c, n): [] for c in contexts for n in num_tokens}
    cells = list(samples)
    for warm in cells[:: max(1, len(cells) // 4)]:
        engines[warm[0]].verify_forward(trees[warm[1]])
        engines[warm[0]].rewind(len(engines[warm[0]].ids))
    for _ in range(repeats):
        for k in rng.permutation(len(cells)):
            ctx, n = cells[k]
            engine = engines[ctx]
            t0 = engine.clock()
            engine.verify_forward(trees[n])
            samples[ctx, n].append(engine.clock() - t0)
            engine.rewind(len(engine.ids))  # drop the verified entries again
    seconds = np.array([[np.median(samples[c, n]) for n in num_tokens] for c in contexts])
    spread = [np.median(np.abs(np.array(s) - np.median(s))) / np.median(s) for s in samples.values()]
    return seconds, float(np.median(spread))


def measure_draft(drafter, ids: list[int], widths, levels: int, repeats: int, rng, clock, target=None) -> tuple:
    """(per-round base seconds, per-level seconds [W]) of ``drafter`` after ``ids``; ``target``
    (the target model) runs once over ``ids`` first for a drafter that reads its hidden states."""
    if drafter is None:
        return 0.0, np.zeros(len(widths))
    drafter.reset(ids)
    if drafter.reads_target_rows:  # as the engine's prefill: the drafter keeps every row's hidden states
        if target is None:
            raise ValueError(f"{type(drafter).__name__} reads the target's hidden states; pass target= to time it")
        target(torch.tensor([ids], device=next(target.parameters()).device))
        drafter.keep_target_rows(list(range(len(ids))))
    drafter.features(ids)  # fill a model drafter's cache once (not a per-round cost)
    base, per_level = [], {w: [[] for _ in range(levels)] for w in widths}
    for _ in range(repeats):
        for k in rng.permutation(len(widths)):
            width = widths[k]
            drafter.rewind(len(ids))  # forget the root: features() catches up one token, as after a round
            t0 = clock()
            drafter.features(ids)
            base.append(clock() - t0)
            builder = drafter.begin(ids, width, SamplingParams(), None)
            for level in range(levels):
                t0 = clock()
                builder.step()
                per_level[width][level].append(clock() - t0)
            drafter.commit(ids, [])
    level_seconds = [float(np.mean([np.median(s) for s in per_level[w]])) for w in widths]
    return float(np.median(base)), np.array(level_seconds)


def measure_sample(vocab: int, params, repeats: int, device: str, clock) -> tuple[float, float]:
    """(base, per-token) seconds of ``accept_tree`` on chains whose every node is accepted
    (logits on ``device``, as the engine's are)."""
    generator = torch.Generator().manual_seed(0)  # makes the logits, on the CPU
    draws = generator_for(device, 0)  # accept_tree draws on the logits' device, as the engine does
    xs, ys = [], []
    for n in (0, 1, 3, 7):
        tokens = list(range(1, n + 1))
        tree = _chain(tokens)
        logits = torch.randn(1 + n, vocab, generator=generator)
        for row, token in enumerate(tokens + [0]):
            logits[row, token] += 50.0  # the next chain token (or the bonus token 0) wins
        logits = logits.to(device)
        accept_tree(tree, logits, params, draws)
        for _ in range(repeats):
            t0 = clock()
            accept_tree(tree, logits, params, draws)
            xs.append(n + 1)
            ys.append(clock() - t0)
    slope, intercept = np.polyfit(np.array(xs, dtype=float), np.array(ys), 1)
    return float(max(intercept, 0.0)), float(max(slope, 0.0))


def calibrate(settings: CalibrationConfig, env: EnvConfig, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> CostTable:
    """Measure and return the cost table of ``env``'s target and drafter on ``env.device``.

    :param seed: seed of the measurement order.
    Uses torch's current thread count (set it to the count your envs run with) and records it.
    """
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    check_draft_device(env)
    target = load_target(env)  # as decoding loads it: its kernels, its split over devices (env.device_map)
    drafter = build_drafter(env.drafter, target, dtype=env.dtype, device=draft_device(env),
                            load=lambda spec, dtype, device: shared_model(spec, dtype, device, env.kernels))
    num_tokens = tuple(sorted(set(settings.num_tokens) | {1}))
    contexts = tuple(settings.contexts)
    stream = _token_stream(target.tokenizer, max(contexts) + max(num_tokens) + 1)
    with torch.inference_mode():
        seconds, noise = measure_verify(target.model, stream, num_tokens, contexts, settings.repeats, rng)
        if progress:
            progress(f"verify done in {time.perf_counter() - started:.0f}s")
        mid = contexts[len(contexts) // 2]
        clock = clock_for(engine_devices(target.model, drafter))  # every device a round runs on
        base, levels = measure_draft(drafter, stream[:mid], settings.widths, settings.levels, settings.repeats, rng,
                                     clock,
                                     target.model)
        sample_base, sample_token = measure_sample(
            target.model.config.vocab_size, SamplingParams(temperature=env.temperature), max(3, settings.repeats),
            env.device, clock,
        )
    meta = {
        "hardware": hardware_info(env.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "target": env.target,
        "drafter": env.drafter,
        "device": env.device,
        **({"device_map": env.device_map, "draft_device": env.draft_device} if env.device_map or env.draft_device
           else {}),
        "dtype": env.dtype,
        "repeats": settings.repeats,
        "calibrate_seconds": round(time.perf_counter() - started, 1),
    }
    return CostTable(
        num_tokens=num_tokens,
        context_lens=contexts,
        verify_seconds=seconds,
        draft_widths=settings.widths,
        draft_level_seconds=levels,
        draft_base_seconds=base,
        sample_base_seconds=sample_base,
        sample_token_seconds=sample_token,
        noise=noise,
        meta=meta,
    )
