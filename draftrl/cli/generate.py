"""``draftrl generate``: decode one prompt speculatively and report speed and exactness.

Reads a :class:`~draftrl.config.commands.GenerateConfig` (``--config``/``--set`` or the flags
below, each shorthand for one key), then decodes with a fixed (depth, verify_size, width) or an
exported policy (``--policy``).

    draftrl generate --prompt "Write a haiku" --chat --depth 4 --json
"""

from __future__ import annotations

import argparse
import json
import sys

from draftrl.cli import _options


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="decode a prompt with speculative decoding")
    p.add_argument("--prompt", required=True)
    _options.add_config(p, "env.temperature=0.7")
    _options.add_models(p)
    _options.add_threads(p)
    _options.add_seed(p, "the sampling generator")
    keyed = _options.keyed
    keyed(p, "--chat", key="env.chat_template", action="store_const", const=True,
          help="wrap the prompt in the model's chat template")
    keyed(p, "--temperature", key="env.temperature", type=float, help="0 = greedy")
    keyed(p, "--top-k", key="env.top_k", type=int, help="0 = off")
    keyed(p, "--top-p", key="env.top_p", type=float, help="1 = off")
    keyed(p, "--max-new-tokens", key="env.max_new_tokens", type=int, help="default 128")
    keyed(p, "--width", key="env.width", type=int, help="tree width: nodes kept per draft level (1 = chain)")
    keyed(p, "--draft-sampling", key="env.draft_sampling", action="store_const", const=True,
          help="model drafters sample proposals from q")
    keyed(p, "--no-monitor", key="env.monitor", action="store_const", const=False,
          help="turn the exactness monitor off")
    keyed(p, "--depth", key="depth", type=int, help="draft depth per round (0 = plain decoding; default 4)")
    keyed(p, "--verify-size", key="verify_size", type=int, help="draft nodes the target verifies (default 0 = all)")
    keyed(p, "--sampler", key="sampler", choices=_options.samplers(),
          help="resample-from-p (the known-wrong correction) and off-by-one (keeps the first rejected draft token): "
               "negative controls of the exactness monitor and of the per-token argmax check")
    p.add_argument(
        "--policy", default=None, metavar="FILE",
        help="exported policy (draftrl export --format onnx) choosing depth and verify size every round; "
        "replaces --depth, --verify-size and --width",
    )
    _options.add_ignore_eos(p)
    p.add_argument("--truncate-prompt", action="store_true",
                   help="keep the prompt's last tokens when prompt + --max-new-tokens exceed the model's context "
                        "(default: refuse such a prompt)")
    _options.add_json(p)
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    """The command's :class:`~draftrl.config.commands.GenerateConfig`, its drafter's head checked before
    any model loads."""
    from draftrl.config.commands import GenerateConfig

    cfg = _options.load(GenerateConfig, args, partial=True)
    cfg.env = _options.settle_drafter(cfg.env, args)
    return cfg


def fit_prompt(prompt_ids: list[int], max_new_tokens: int, max_context: int | None, truncate: bool) -> list[int]:
    """``prompt_ids``, or with ``truncate`` its last ``max_context - max_new_tokens`` tokens (with a
    warning); a prompt that does not fit otherwise is refused (``check_fits``)."""
    from draftrl.decoding.engine import check_fits

    if truncate and max_context is not None and len(prompt_ids) + max_new_tokens > max_context:
        keep = max_context - max_new_tokens
        if keep < 1:
            raise ValueError(f"--max-new-tokens={max_new_tokens} leaves no room for a prompt in the target's context "
                             f"of {max_context} tokens; lower it.")
        print(f"draftrl generate: warning: prompt truncated from {len(prompt_ids)} to its last {keep} tokens "
              f"(--truncate-prompt; context {max_context}, max_new_tokens {max_new_tokens}).", file=sys.stderr)
        return prompt_ids[-keep:]
    check_fits(len(prompt_ids), max_new_tokens, max_context)
    return prompt_ids


def run(args: argparse.Namespace) -> int:
    from draftrl.decoding.build import build_engine, load_target
    from draftrl.decoding.generate import fixed_schedule, generate
    from draftrl.decoding.monitor import ExactnessMonitor, ExactnessViolation
    from draftrl.decoding.workload import encode
    from draftrl.drafters.registry import check_drafter_spec
    from draftrl.models import check_model_spec

    cfg = config(args)
    env = cfg.env
    policy = policy_schedule(args.policy, env.drafter) if args.policy else None  # a bad file fails fast
    if policy is None:  # refuse a bad action before spending seconds on loading models
        from draftrl.decoding.engine import EngineConfig

        EngineConfig(max_new_tokens=env.max_new_tokens).check_action(cfg.depth, cfg.verify_size or None, env.width)
    check_model_spec(env.target, "target")  # a typo fails now, not after loading the other model
    check_drafter_spec(env.drafter)
    _options.set_threads(cfg.threads)
    target = load_target(env, shared=False)
    engine, tokenizer = build_engine(env, target, max_new_tokens=env.max_new_tokens, seed=cfg.seed,
                                     sampler=cfg.sampler)
    prompt_ids = fit_prompt(encode(tokenizer, args.prompt, env.chat_template), env.max_new_tokens,
                            engine.max_context, args.truncate_prompt)
    monitor = ExactnessMonitor() if env.monitor else None
    try:
        if policy is not None:
            result = policy.generate(engine, prompt_ids, monitor=monitor)
        else:
            result = generate(engine, prompt_ids, fixed_schedule(cfg.depth, cfg.verify_size or None, env.width),
                              monitor=monitor)
    except ExactnessViolation as err:
        print(f"draftrl generate: EXACTNESS VIOLATION: {err}", file=sys.stderr)
        return 3
    text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    summary = result.summary()
    if args.json:
        out = {"text": text, "token_ids": result.token_ids, **summary}
        out["settings"] = {"prompt": args.prompt, "policy": args.policy, **_plain_config(cfg)}
        out["exactness"] = monitor.report() if monitor is not None else None
        if policy is not None:
            out["policy_depth_histogram"] = dict(sorted(policy.depth_histogram.items()))
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(text)
        if monitor is not None:
            rep = monitor.report()
            print(f"\nexactness: {rep['verdict']} ({rep['verdict_reason']})", file=sys.stderr)
        print(
            f"\n[{summary['num_tokens']} tokens, {summary['tokens_per_second']:.1f} tok/s, "
            f"{summary['rounds']} rounds, {summary['mean_tokens_per_round']:.2f} tokens/round, "
            + (f"drafter={env.drafter} policy={args.policy} depths={dict(sorted(policy.depth_histogram.items()))}]"
               if policy is not None else
               f"drafter={env.drafter} depth={cfg.depth} width={env.width} verify_size={cfg.verify_size}]"),
            file=sys.stderr,
        )
    return 0


def _plain_config(cfg) -> dict:
    from draftrl.config import to_dict
    from draftrl.io import plain

    return plain(to_dict(cfg))


def policy_schedule(path: str, drafter: str):
    """The ``--policy`` schedule, with a warning when the policy was trained with another drafter."""
    from draftrl.export.controller import PolicyController
    from draftrl.export.schedule import PolicySchedule

    schedule = PolicySchedule(PolicyController(path))
    trained_with = (schedule.controller.manifest.get("features") or {}).get("drafter")
    if trained_with and trained_with != drafter:
        print(f"draftrl generate: warning: the policy was trained with drafter {trained_with!r}, decoding uses "
              f"{drafter!r}; its draft features mean something else (pass --drafter {trained_with}).",
              file=sys.stderr)
    return schedule
