"""Exactness checks of the evaluation: greedy token identity, monitor verdicts, monitor power.

- **Greedy identity** (temperature 0): every setting's output must equal plain decoding's
  (depth 0) token for token on every request, and plain decoding must equal Hugging Face
  ``generate(do_sample=False)`` on a sample of requests. A mismatch raises
  :class:`GreedyMismatch` with the first differing position and both continuations.
- **Monitor** (any temperature): ``draftrl.decoding.monitor.ExactnessMonitor`` over each
  setting's stream; a failed test raises ``ExactnessViolation`` (its message is the evidence).
- **Sampled streams in a serving engine** (temperature > 0, vLLM): :class:`SampledStreamCheck`
  runs the same monitor on the tokens vLLM emitted, with p rebuilt from the raw logprobs it
  returned (:mod:`draftrl.decoding.vllm.logprobs`); a failure is recorded, not raised.
- **Power** on the real model: :func:`monitor_power` decodes with the known-wrong
  ``resample-from-p`` correction and with the correct one on the same requests and records
  after how many emitted tokens each statistic fired (or that it never did).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftrl.decoding.monitor import MonitorConfig


class GreedyMismatch(RuntimeError):
    """A greedy output differs from the target's own greedy decoding; the message shows where."""

    def __init__(self, what: str, prompt_id: str, reference: list[int], output: list[int], tokenizer=None):
        n = min(len(reference), len(output))
        at = next((i for i in range(n) if reference[i] != output[i]), n)
        self.evidence = {"what": what, "prompt_id": prompt_id, "position": at,
                         "reference": reference[at: at + 8], "output": output[at: at + 8],
                         "reference_length": len(reference), "output_length": len(output)}
        text = ""
        if tokenizer is not None:
            text = (f"\n  reference continues {tokenizer.decode(reference[at: at + 8])!r}"
                    f"\n  output continues    {tokenizer.decode(output[at: at + 8])!r}")
        super().__init__(
            f"greedy token identity failed: {what} on prompt {prompt_id} differs from the target's greedy decoding "
            f"at output position {at} (reference {reference[at: at + 8]}, output {output[at: at + 8]}; lengths "
            f"{len(reference)} vs {len(output)}){text}"
        )

    def __reduce__(self):
        from draftrl.decoding.monitor import restore_error

        return restore_error, (type(self), self.args, self.__dict__)


def check_identity(what: str, prompt_id: str, reference: list[int], output: list[int], tokenizer=None) -> None:
    if list(reference) != list(output):
        raise GreedyMismatch(what, prompt_id, list(reference), list(output), tokenizer)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: list[int]) -> list[int]:
    """The target's own greedy continuation through Hugging Face ``generate(do_sample=False)``,
    cut after the first EOS as the engine cuts it."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids], device=device), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long,
                                                                                   device=device),
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    tokens = out[0, len(prompt_ids):].tolist()
    eos = set(eos_token_ids)
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def monitor_verdict(monitor) -> dict:
    """The compact part of ``ExactnessMonitor.report()`` a results file keeps."""
    rep = monitor.report()
    return {
        "passed": rep["passed"],
        "verdict": rep["verdict"],
        "verdict_reason": rep["verdict_reason"],
        "num_tokens": rep["num_tokens"],
        "num_informative": rep["num_informative"],
        "num_drafted_positions": rep["num_drafted_positions"],
        "tests": {name: {k: v for k, v in test.items() if k in ("passed", "checkpoints", "p_value", "threshold",
                                                                "failed_at_tokens", "z", "log_e_value")}
                  for name, test in rep["tests"].items()},
        "pit_histogram": rep["pit_histogram"],
        "failures": rep["failures"],
    }


def merge_monitor_verdicts(shards: list[dict]) -> dict:
    """One policy's :func:`monitor_verdict` over Ray shards. Each shard's monitor tested its own
    requests' stream (each at ``MonitorConfig.alpha``, so the family-wise false-alarm rate is at most
    the number of shards times it): the merged verdict passes only when every shard passed, counts and
    the PIT histogram add up, each test keeps its shards' entries, the failures are pooled."""
    failed = [v for v in shards if not v["passed"]]
    first = failed[0] if failed else shards[0]
    return {
        "passed": not failed,
        "verdict": first["verdict"],
        "verdict_reason": f"{first['verdict_reason']} ({len(failed)} of {len(shards)} Ray shards failed; each "
                          "tested its own requests)",
        **{key: sum(v[key] for v in shards) for key in ("num_tokens", "num_informative", "num_drafted_positions")},
        "tests": {name: {"passed": all(v["tests"][name]["passed"] for v in shards),
                         "shards": [v["tests"][name] for v in shards]} for name in first["tests"]},
        "pit_histogram": [sum(column) for column in zip(*(v["pit_histogram"] for v in shards))],
        "failures": [f for v in shards for f in v["failures"]],
    }


class SampledStreamCheck:
    """The exactness monitor over a serving engine's sampled streams, pooled over every request and
    step it observes (one check per policy in ``draftrl eval --engine vllm``).

    Under exactness every emitted token, accepted, recovered or bonus, is drawn from the target's
    p at its position whatever the policy drafted, so the monitor's four tests apply to the pooled
    stream; the streams it pools must be independent draws (distinct request seeds).

    :param temperature, top_k, top_p: the requests' sampling settings.
    :param max_logprobs: the engine's ``max_logprobs``.
    :param config: the monitor's settings (false-alarm rate, seed).
    """

    def __init__(self, temperature: float, top_k: int, top_p: float, max_logprobs: int,
                 config: MonitorConfig | None = None):
        from draftrl.decoding.monitor import ExactnessMonitor
        from draftrl.decoding.vllm.logprobs import logprobs_needed

        self.temperature, self.top_k = temperature, top_k
        self.num_logprobs, self.reason = logprobs_needed(temperature, top_k, top_p, max_logprobs)
        self.monitor = ExactnessMonitor(config)
        self.num_unchecked = 0
        """tokens that came without logprobs (an engine that does not return them)"""

    @property
    def checked(self) -> bool:
        """Whether these sampling settings can be checked at all."""
        return self.num_logprobs is not None

    def observe(self, steps: list) -> None:
        """Feed one engine step's :class:`~draftrl.decoding.interface.RequestStep` list."""
        from draftrl.decoding.monitor import ExactnessViolation
        from draftrl.decoding.vllm.logprobs import token_stats_from_logprobs

        if not self.checked:
            return
        for r in steps:
            if not r.token_ids:
                continue
            if r.logprobs is None:
                self.num_unchecked += len(r.token_ids)
                continue
            stats = token_stats_from_logprobs(r.token_ids, r.logprobs, r.draft_ids, temperature=self.temperature,
                                              top_k=self.top_k, num_logprobs=self.num_logprobs)
            try:
                self.monitor.update(stats)
            except ExactnessViolation:
                pass  # kept in the monitor's report; the evaluation decides what a failure means

    def verdict(self) -> dict:
        """:func:`monitor_verdict` plus how p was obtained; ``verdict`` is ``"unchecked"`` (and
        ``passed`` None) when the sampling settings cannot be checked from top-N logprobs."""
        if not self.checked:
            return {"passed": None, "verdict": "unchecked", "verdict_reason": self.reason}
        out = monitor_verdict(self.monitor)
        out.update({"p_from": "raw_logprobs", "num_logprobs": self.num_logprobs, "num_unchecked": self.num_unchecked})
        return out


class ClassStreamChecks:
    """One :class:`SampledStreamCheck` per sampled class of a temperature mix (greedy classes have
    greedy identity instead), each request's steps routed to its class's check: pooling streams of
    different temperatures would test the tokens against the wrong p.

    :param classes: the workload's ``SamplingClass`` es (``WorkloadConfig.sampling_classes``).
    :param max_logprobs: the engine's ``max_logprobs``.
    """

    routes_by_class = True

    def __init__(self, classes, max_logprobs: int, config: MonitorConfig | None = None):
        self.checks = {c.label: SampledStreamCheck(c.temperature, c.top_k, c.top_p, max_logprobs, config)
                       for c in classes if not c.greedy}

    @property
    def checked(self) -> bool:
        return all(c.checked for c in self.checks.values())

    def observe(self, steps: list, sampling: dict) -> None:
        """Feed one engine step's ``RequestStep`` list; ``sampling``: request id -> its ``SamplingClass``
        (a request it does not name, or a greedy one, is skipped)."""
        groups: dict[str, list] = {}
        for r in steps:
            cls = sampling.get(r.request_id)
            if cls is not None and cls.label in self.checks:
                groups.setdefault(cls.label, []).append(r)
        for label, group in groups.items():
            self.checks[label].observe(group)

    def verdicts(self) -> dict[str, dict]:
        """Class label -> :meth:`SampledStreamCheck.verdict`."""
        return {label: check.verdict() for label, check in self.checks.items()}


class TimedMonitor:
    """An ``ExactnessMonitor`` whose ``update`` calls are timed (``seconds``), for its overhead."""

    def __init__(self, monitor):
        self.monitor = monitor
        self.seconds = 0.0

    def update(self, stats) -> None:
        t0 = time.perf_counter()
        try:
            self.monitor.update(stats)
        finally:
            self.seconds += time.perf_counter() - t0

    def report(self) -> dict:
        return self.monitor.report()

    @property
    def passed(self) -> bool:
        return self.monitor.passed


@dataclass
class PowerSetting:
    """A setting where drafts are often rejected, so a wrong correction shows quickly."""

    drafter: str = "self"
    """a drafter spec (``draftrl.drafters.registry``); "self": the target drafts for itself with its
    top-1 token (q one-hot, acceptance p(top))"""
    temperature: float = 1.0
    top_k: int = 0
    depth: int = 1
    """one draft token per round: every rejection exercises the residual"""
    tasks: tuple[str, ...] = ("chat",)
    """open-ended chat: flat distributions, frequent rejections"""
    max_new_tokens: int = 96


def power_engine(target, setting: PowerSetting):
    """The engine of :func:`monitor_power` around ``target`` (a ``LoadedModel``)."""
    from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
    from draftrl.drafters.registry import build_drafter

    drafter = build_drafter(setting.drafter, target, device=str(next(target.model.parameters()).device))
    config = EngineConfig(max_new_tokens=setting.max_new_tokens, temperature=setting.temperature, top_k=setting.top_k)
    return SpeculativeDecoder(target.model, drafter, config, eos_token_ids=target.eos_token_ids)


def monitor_power(target, tokens: int, setting: PowerSetting | None = None, *, samplers=("resample-from-p", "correct"),
                  seed: int = 0, until: str = "all", progress=None) -> dict:
    """Tokens each monitor statistic needs to catch each sampler on the real model.

    Decodes tune-split prompts of ``setting.tasks`` (languages alternating) until ``tokens``
    tokens were emitted or every statistic fired (``until="all"``) or one did (``until="first"``),
    once per sampler, with the same request seeds.
    The correct sampler's run also gives the monitor's overhead at a temperature where it
    tests every token (at temperature 0 it skips them all).

    :param target: the loaded target (``LoadedModel``).
    :return: ``{"setting": ..., sampler: {"tokens", "informative", "drafted", "seconds",
        "monitor_seconds", "monitor_overhead", "detected_at": {statistic: tokens or None},
        "first_detection", "passed"}}``.
    """
    from dataclasses import asdict

    from draftrl.config.env import EnvConfig
    from draftrl.decoding.generate import fixed_schedule, generate
    from draftrl.decoding.monitor import TESTS, ExactnessMonitor, ExactnessViolation
    from draftrl.decoding.workload import Workload

    if until not in ("all", "first"):
        raise ValueError(f"until={until!r} must be 'all' or 'first'")
    setting = setting or PowerSetting()
    engine = power_engine(target, setting)
    env = EnvConfig(split="tune", tasks=setting.tasks, shuffle=False, max_new_tokens=setting.max_new_tokens)
    workload = Workload(env, target.tokenizer)
    order = _round_robin_by_language(workload.prompts)
    out: dict = {"setting": asdict(setting)}
    for sampler in samplers:
        engine.config.sampler = sampler
        monitor = TimedMonitor(ExactnessMonitor())
        decode_seconds = 0.0
        k = 0
        while monitor.report()["num_tokens"] < tokens:
            request = workload.request(order[k % len(order)])
            engine.config.max_new_tokens = request.max_new_tokens
            t0 = time.perf_counter()
            try:
                generate(engine, request.prompt_ids, fixed_schedule(setting.depth), monitor=monitor, seed=seed + k)
            except ExactnessViolation:
                pass  # keep going: the other statistics' detection points are measured too
            decode_seconds += time.perf_counter() - t0
            k += 1
            rep = monitor.report()
            if progress:
                progress(sampler, rep["num_tokens"])
            failed = [not rep["tests"][name]["passed"] for name in TESTS]
            if all(failed) or (until == "first" and any(failed)):
                break
        rep = monitor.report()
        detected = {name: rep["tests"][name].get("failed_at_tokens") for name in TESTS}
        firsts = [v for v in detected.values() if v is not None]
        out[sampler] = {
            "tokens": rep["num_tokens"],
            "informative": rep["num_informative"],
            "drafted": rep["num_drafted_positions"],
            "seconds": decode_seconds,
            "monitor_seconds": monitor.seconds,
            "monitor_overhead": monitor.seconds / decode_seconds if decode_seconds > 0 else None,
            "detected_at": detected,
            "first_detection": min(firsts) if firsts else None,
            "passed": rep["passed"],
            "pit_histogram": rep["pit_histogram"],
        }
    engine.config.sampler = "correct"
    return out


def _round_robin_by_language(prompts) -> list[int]:
    """Prompt indices alternating languages, so a short run covers all of them."""
    by_lang: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_lang.setdefault(p.language, []).append(i)
    lists = list(by_lang.values())
    order = []
    for j in range(max(len(v) for v in lists)):
        order += [v[j] for v in lists if j < len(v)]
    return order
